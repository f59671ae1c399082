"""MLflow's SQLite tracking store (lossguard.ingest.formats.mlflow_db), written by MLflow itself
(mlflow-skinny with sqlalchemy and alembic: `MlflowClient(tracking_uri="sqlite:///...")`), read
back by scan, read and the daemon's pass; the daemon as a process following a database a real
MLflow process logs into is at the end."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.detection.rules import default_rules
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.ingest.sources import sqlite_db
from lossguard.report.audit import scan
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ, run_lossguard, run_lossguard_in_process
from .test_watch import alerted_once_across_a_kill

mlflow = pytest.importorskip("mlflow")
from mlflow.entities import Metric  # noqa: E402

T0 = 1_790_000_000_000
"""Milliseconds: the timestamps logged (wall_time is read back from them)."""
OPTIONS = ReadOptions()


def _client(db: Path):
    return mlflow.MlflowClient(tracking_uri="sqlite:///" + str(db))


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """An empty MLflow database as MLflow makes one: its migrations take seconds, so once a module."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    _client(db).search_experiments()
    return db


@pytest.fixture
def store(template, tmp_path) -> Path:
    """runs/exp1/mlflow.db, MLflow's own empty database (the default name since MLflow 3.7)."""
    db = tmp_path / "runs" / "exp1" / "mlflow.db"
    db.parent.mkdir(parents=True)
    shutil.copy(template, db)
    return db


def _log(client, run_id: str, key: str, points) -> None:  # noqa: ANN001
    client.log_batch(run_id, metrics=[Metric(key, value, T0 + step, step) for step, value in points])


def _calm_loss(steps) -> list[tuple[int, float]]:
    return [(s, 2.0 + (s % 5) * 0.01) for s in steps]


def _written(db: Path) -> dict[str, list[tuple[int, str, float]]]:
    """Two experiments; in the first, two runs named `r1` (one NaN, one +Inf and one -Inf logged
    in the first) and a deleted run; in the second, another `r1`. Returns what each run is read as
    (its run id's head for the second `r1`)."""
    client = _client(db)
    pre, sft = client.create_experiment("pretrain"), client.create_experiment("sft")
    first = client.create_run(pre, run_name="r1", start_time=T0).info.run_id
    loss = [(s, math.nan if s == 12 else 2.0 - s * 0.01) for s in range(20)]
    grad = [(s, math.inf if s == 2 else -math.inf if s == 4 else 1.0 + s * 0.1) for s in range(0, 20, 2)]
    _log(client, first, "loss", loss)
    _log(client, first, "grad_norm", grad)
    second = client.create_run(pre, run_name="r1", start_time=T0 + 1000).info.run_id
    _log(client, second, "loss", _calm_loss(range(5)))
    gone = client.create_run(pre, run_name="gone", start_time=T0 + 2000).info.run_id
    _log(client, gone, "loss", _calm_loss(range(5)))
    client.delete_run(gone)
    other = client.create_run(sft, run_name="r1", start_time=T0 + 3000).info.run_id
    _log(client, other, "train/loss", [(s * 10, 1.5) for s in range(3)])
    return {
        "exp1/pretrain/r1": [(s, "loss", v) for s, v in loss] + [(s, "grad_norm", v) for s, v in grad],
        f"exp1/pretrain/r1 ({second[:8]})": [(s, "loss", v) for s, v in _calm_loss(range(5))],
        "exp1/sft/r1": [(s * 10, "train/loss", 1.5) for s in range(3)],
    }


def _rows(frame: pl.DataFrame) -> dict[str, list[tuple[int, str, float]]]:
    got: dict[str, list[tuple[int, str, float]]] = {}
    for run, step, tag, value in frame.select("run", "step", "tag", "value").iter_rows():
        got.setdefault(run, []).append((step, tag, value))
    return got


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_a_database_mlflow_wrote_is_read_back_exactly_run_by_run(store):
    expected = _written(store)
    frame, results, problems = read_paths([store.parent.parent])
    assert problems == [] and [r.format for r in results] == ["mlflow_db"]
    got = _rows(frame)
    assert sorted(got) == sorted(expected)  # the deleted run is no run; the two `r1`s are two
    for run, rows in expected.items():
        assert [(s, t) for s, t, _ in got[run]] == [(s, t) for s, t, _ in rows], run
        assert all(_same(a, b) for (_, _, a), (_, _, b) in zip(got[run], rows)), run
    # NaN and +-Inf mapped back from MLflow's 0 + is_nan and +-float max, and the timestamps kept.
    grad = frame.filter((pl.col("run") == "exp1/pretrain/r1") & (pl.col("tag") == "grad_norm"))
    assert grad.get_column("value").to_list()[1:3] == [math.inf, -math.inf]
    assert frame.get_column("wall_time").min() == T0 / 1000


def test_scan_judges_each_mlflow_run_and_the_non_finite_rules_see_the_nan(store):
    _written(store)
    result = scan([store.parent.parent], rules=default_rules())
    assert sorted(r.run for r in result.runs) == sorted(["exp1/pretrain/r1", next(r.run for r in result.runs if "(" in r.run), "exp1/sft/r1"])
    assert ("exp1/pretrain/r1", "loss-nonfinite", 12) in [(i.run, i.rule, i.step) for i in result.incidents]
    assert [r.run for r in scan([store.parent.parent], rules=default_rules(), run_glob="*/sft/*").runs] == ["exp1/sft/r1"]


def test_rows_mlflow_committed_out_of_order_are_read_in_the_order_logged_and_a_resume_stays_one(store):
    # `log_metrics(..., synchronous=False)` (transformers' MLflowCallback) commits batches from a pool
    # of threads: here the batch logged second lands first, as it does there. In row order each
    # step going back was a resume whose rows replaced the spike before them: it went unseen.
    client = _client(store)
    exp = client.create_experiment("hf")
    run = client.create_run(exp, run_name="async").info.run_id
    loss = {s: 9.0 if s == 150 else 2.0 + (s % 5) * 0.01 for s in range(0, 300, 10)}
    batches = [[(s, v) for s, v in loss.items() if lo <= s < lo + 100] for lo in (0, 100, 200)]
    for batch in (batches[0], batches[2], batches[1]):  # (committed in this order, logged 0..290)
        client.log_batch(run, metrics=[Metric("loss", v, T0 + s, s) for s, v in batch])
    resumed = client.create_run(exp, run_name="resumed").info.run_id
    _log(client, resumed, "loss", _calm_loss(range(10)))
    client.log_batch(resumed, metrics=[Metric("loss", 2.0, T0 + 100 + s, s) for s in range(5, 15)])  # (from a checkpoint at 5: logged later)
    frame, _, _ = read_paths([store])
    steps = {run: frame.filter(pl.col("run") == run).get_column("step").to_list() for run in ("hf/async", "hf/resumed")}
    assert steps == {"hf/async": sorted(loss), "hf/resumed": [*range(10), *range(5, 15)]}
    assert [(i.run, i.step) for i in scan([store], rules=default_rules()).incidents] == [("hf/async", 150)]


def test_a_metric_logged_without_a_step_and_committed_out_of_order_is_numbered_in_the_order_logged(store):
    # Numbered in the order committed, then put in the order logged, its made-up steps ran backwards.
    client = _client(store)
    run = client.create_run(client.create_experiment("hf"), run_name="async").info.run_id
    lr = [1e-4 * (i + 1) for i in range(9)]
    for lo in (0, 6, 3):  # (committed in this order, logged 0..8)
        client.log_batch(run, metrics=[Metric("lr", lr[i], T0 + i, 0) for i in range(lo, lo + 3)])
    frame, _, _ = read_paths([store])
    assert frame.filter(pl.col("tag") == "lr").select("step", "value").rows() == list(enumerate(lr))


def _grown(whole: Path, path: Path, upto: int) -> None:
    """`path` holding the first `upto` metric rows of `whole` (MLflow's rows, in the order it wrote
    them): a database growing as its trainer logs."""
    with sqlite3.connect(path) as db:
        db.execute("ATTACH DATABASE ? AS whole", (str(whole),))
        db.execute("INSERT INTO metrics SELECT * FROM whole.metrics WHERE rowid > (SELECT coalesce(max(rowid), 0) FROM main.metrics) AND rowid <= ? ORDER BY rowid", (upto,))
        # MLflow keeps each run's metric's latest row (highest step) in the same transaction.
        db.execute("DELETE FROM latest_metrics")
        db.execute(
            "INSERT INTO latest_metrics SELECT key, value, timestamp, step, is_nan, run_uuid FROM "
            "(SELECT *, row_number() OVER (PARTITION BY run_uuid, key ORDER BY step DESC, timestamp DESC) AS n FROM metrics) WHERE n = 1"
        )
    db.close()


def _with_stepless(db: Path) -> None:
    """Runs logging metrics without a step: the LR beside a loss logged with `step=`, after it
    (_mixed) or before it, and beside an eval logged at its epoch; a loss on its own (_stepless),
    and a loss beside an eval logged now and then."""
    client = _client(db)
    exp = client.create_experiment("stepless")
    _mixed(client, client.create_run(exp, run_name="mixed").info.run_id, range(5))
    _stepless(client, client.create_run(exp, run_name="alone").info.run_id, range(5))
    before = client.create_run(exp, run_name="before").info.run_id
    for i in range(5):
        client.log_metric(before, "lr", 1e-4, timestamp=T0 + 2 * i)
        client.log_metric(before, "loss", 2.0, timestamp=T0 + 2 * i + 1, step=10 * i)
    epochs = client.create_run(exp, run_name="epochs").info.run_id  # (an eval logged at its epoch)
    for i in range(6):
        client.log_metric(epochs, "loss", 2.0, timestamp=T0 + 3 * i, step=10 * i)
        if i % 3 == 2:
            client.log_metric(epochs, "val_loss", 2.5, timestamp=T0 + 3 * i + 1, step=i // 3 + 1)
        client.log_metric(epochs, "lr", 1e-4, timestamp=T0 + 3 * i + 2)
    constant = client.create_run(exp, run_name="constant").info.run_id  # (a metric at one step of its own)
    for i in range(5):
        client.log_metric(constant, "k", 1.0, timestamp=T0 + 2 * i, step=5)
        client.log_metric(constant, "lr", 1e-4, timestamp=T0 + 2 * i + 1)
    sparse = client.create_run(exp, run_name="sparse").info.run_id
    for i in range(6):
        client.log_metric(sparse, "loss", 2.0 + (i % 3) * 0.01, timestamp=T0 + i)
        if i % 3 == 1:
            client.log_metric(sparse, "eval_loss", 2.5, timestamp=T0 + i, step=i)


@pytest.fixture(scope="module", params=[_written, _with_stepless])
def filled(template, tmp_path_factory, request) -> tuple[Path, Path]:
    """A database MLflow filled (`_written`, or `_with_stepless`), and a copy of it without its
    metric rows."""
    folder = tmp_path_factory.mktemp("filled")
    whole, empty = folder / "whole.db", folder / "empty.db"
    shutil.copy(template, whole)
    request.param(whole)
    shutil.copy(whole, empty)
    with sqlite3.connect(empty) as db:
        db.execute("DELETE FROM metrics")
        db.execute("DELETE FROM latest_metrics")
    db.close()
    return whole, empty


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 60), max_size=6), limit=st.sampled_from([None, 1, 200, 2000]))
def test_rows_appended_between_reads_read_in_pieces_equal_one_read(filled, tmp_path_factory, cuts, limit):
    whole, empty = filled
    path = tmp_path_factory.mktemp("grown") / "mlflow.db"
    shutil.copy(empty, path)
    one = read(whole, run=".", fmt="mlflow_db", final=True, options=OPTIONS)
    total = one.frame.height + 5  # (the deleted run's rows are read past, not given)
    cursor, frames = Cursor(), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sqlite_db, "MIN_ROWS", 1)  # (so that a limit cuts a read short)
        for upto in [*sorted(cuts), total, total]:
            _grown(whole, path, upto)
            res = read(path, cursor, run=".", fmt="mlflow_db", final=False, options=OPTIONS, limit=limit)
            assert all("without a step" in p.message for p in res.problems) and res.named
            frames.append(res.frame)
            cursor = Cursor.from_json(res.cursor.to_json())  # (as the daemon keeps it)
        while cursor.offset < sqlite_db.stamp(path)[0]:  # what a cut-short read left: the next passes
            res = read(path, cursor, run=".", fmt="mlflow_db", final=False, options=OPTIONS, limit=limit)
            frames.append(res.frame)
            cursor = res.cursor
    assert pl.concat(frames).drop("source").equals(one.frame.drop("source"))


def test_a_database_locked_by_a_writer_is_read_as_committed_from_a_private_copy_never_the_transaction_under_way(store):
    expected = _written(store)
    writer = sqlite3.connect(store, isolation_level=None)
    writer.execute("PRAGMA cache_size=1")  # (its pages spill into the file: what a long transaction does)
    writer.execute("BEGIN EXCLUSIVE")
    run = writer.execute("SELECT run_uuid FROM runs WHERE name = 'r1' ORDER BY start_time LIMIT 1").fetchone()[0]
    writer.executemany("INSERT INTO metrics VALUES ('loss', 9.0, ?, ?, ?, 0)", [(T0 + s, run, s) for s in range(100, 2000)])
    try:
        started = time.monotonic()
        locked = read(store, run=".", fmt="mlflow_db", final=False, options=OPTIONS)
        assert time.monotonic() - started < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    told = f"database locked by a writer (waited {sqlite_db.BUSY_WAIT:g} s); what it had committed is read (from a private copy)"
    assert [(p.message, p.unfinished) for p in locked.problems] == [(told, True)]
    assert_frame_equal(locked.frame, read(store, run=".", fmt="mlflow_db", final=False, options=OPTIONS).frame)
    assert locked.frame.height == sum(len(v) for v in expected.values())


def test_a_database_locked_past_what_can_be_copied_is_one_clear_problem_and_the_next_read_gets_it_all(store, monkeypatch):
    expected = _written(store)
    monkeypatch.setattr(sqlite_db, "COPY_LIMIT", 0)
    writer = sqlite3.connect(store, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        locked = read(store, run=".", fmt="mlflow_db", final=False, options=OPTIONS)
        scanned = scan([store.parent], rules=default_rules())
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    said = (f"database locked by a writer (waited {sqlite_db.BUSY_WAIT:g} s), and it is larger than the 0 MiB read from a private copy at most;"
            " read again at the next pass, nothing is lost")
    assert [p.message for p in locked.problems] == [said]
    assert (locked.frame.height, locked.dead, locked.cursor.index) == (0, False, 0)
    # Sniffing could not read its tables either: said, never taken for no log at all.
    assert scanned.runs == () and [(p.source, p.message) for p in scanned.all_problems] == [(str(store), said)]
    again = read(store, locked.cursor, run=".", fmt="mlflow_db", final=False, options=OPTIONS)
    assert again.problems == () and again.frame.height == sum(len(v) for v in expected.values())


HOT = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size=1")
run = db.execute("SELECT run_uuid FROM runs WHERE name = 'r1' ORDER BY start_time LIMIT 1").fetchone()[0]
db.execute("BEGIN")
for step in range(100, 3000):
    db.execute("INSERT INTO metrics VALUES ('loss', ?, ?, ?, ?, 0)", (9.0 if step == 120 else 2.0, 1790000000000 + step, run, step))
print("ready", flush=True)
time.sleep(60)
"""


def _killed_mid_commit(db: Path) -> None:
    """A writer process (sqlite3, in MLflow's rollback-journal mode) killed with SIGKILL inside a
    transaction whose pages already spilled into the file: a hot journal, as a trainer killed
    while MLflow commits leaves it."""
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOT), str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
    finally:
        writer.kill()
        writer.wait(timeout=10)
    with pytest.raises(sqlite3.OperationalError) as refused:
        sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute("SELECT count(*) FROM metrics").fetchone()
    assert refused.value.sqlite_errorname == "SQLITE_READONLY_ROLLBACK"


def test_a_store_whose_writer_died_mid_commit_is_read_as_committed_and_says_so(store):
    expected = _written(store)
    _killed_mid_commit(store)
    journal = (store.parent / "mlflow.db-journal").stat().st_size
    res = run_lossguard_in_process("scan", str(store.parent), "--format", "json")
    runs = {r["run"]: r for r in json.loads(res.stdout)["runs"]}
    # Every run as committed (pretrain/r1's NaN is found); the spike at 120 was never committed.
    assert sorted(runs) == sorted(r.removeprefix("exp1/") for r in expected) and runs["pretrain/r1"]["last_step"] == 19
    assert res.returncode == 1 and all(s["step"] != 120 for r in runs.values() for s in r["spikes"])
    said = (f"a writer died mid-commit: its journal holds {journal:,} bytes of a transaction never committed; what was committed is read"
            " (from a private copy, the journal rolled back; the next writer to open the database rolls it back too)")
    assert [line for line in res.stderr.splitlines() if line.startswith("warning:")] == [f"warning: {store}: {said}"]
    read_out = run_lossguard("read", str(store), "--format", "csv")
    assert read_out.returncode == 0 and len(read_out.stdout.strip().splitlines()) - 1 == sum(len(v) for v in expected.values())
    assert (store.parent / "mlflow.db-journal").stat().st_size == journal  # (the store itself untouched)


def test_a_store_nothing_of_which_can_be_read_exits_2_strict_or_not(store, monkeypatch, capsys):
    from lossguard.cli import main

    _written(store)
    _killed_mid_commit(store)
    monkeypatch.setattr(sqlite_db, "COPY_LIMIT", 0)
    for extra in ([], ["--strict"]):
        assert main(["scan", str(store.parent), *extra]) == 2
        said = capsys.readouterr()
        assert "a writer died mid-commit: its journal holds" in said.out and "read again at the next pass" in said.out
        assert said.err == "lossguard: error: no file under the given paths could be read\n"
    assert main(["read", str(store)]) == 2
    assert "a writer died mid-commit" in capsys.readouterr().err


def test_a_db_no_tracker_wrote_is_passed_over_in_silence_and_lossguards_own_state_is_no_run(store, tmp_path):
    _written(store)
    folder = store.parent
    (folder / "junk.db").write_bytes(bytes(range(256)) * 64)
    with sqlite3.connect(folder / "app.sqlite") as app:
        app.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        app.execute("INSERT INTO users (name) VALUES ('ada')")
    app.close()
    State(folder / "state").close()
    (folder / "empty.sqlite3").write_bytes(b"")
    result = scan([folder.parent], rules=default_rules())
    assert sorted({r.run.split("/")[1] for r in result.runs}) == ["pretrain", "sft"]
    assert result.all_problems == []
    # Nor counted in the scan's total of files read: MLflow's is the one.
    assert result.files == 1
    # Forced to read one as MLflow's: the file says what it is, once, and is not read again.
    res = read(folder / "junk.db", run=".", fmt="mlflow_db", final=False, options=OPTIONS)
    assert res.dead and [p.message for p in res.problems] == ["not a SQLite database after all; no longer read"]


def test_a_tracker_database_cut_short_is_one_warning_naming_it_and_the_runs_beside_it_are_read(store, tmp_path):
    _written(store)
    other = store.parent.parent / "copied" / "mlflow.db"
    other.parent.mkdir()
    # An rsync cut off: the head of a real MLflow database, the rest missing.
    other.write_bytes(store.read_bytes()[: store.stat().st_size // 2])
    result = scan([store.parent.parent], rules=default_rules())
    assert sorted({r.run.split("/")[1] for r in result.runs}) == ["pretrain", "sft"]
    assert [(p.source, p.message) for p in result.all_problems] == [(str(other), "database disk image is malformed; no longer read")]


def _follower(root: Path, state: State) -> Follower:
    return Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)


def test_the_daemon_reads_only_new_rows_skips_an_unchanged_database_and_rows_renumbered_alert_nothing_twice(store, tmp_path):
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    _log(client, run, "loss", _calm_loss(range(1, 40)))
    state = State(tmp_path / "state")
    follower = _follower(store.parent.parent, state)
    assert follower.run_pass(1.0).rows == 39  # history: read, not alerted
    assert follower.run_pass(2.0).files == 0  # unchanged: one stat
    _log(client, run, "loss", [(40, 9.0), *_calm_loss(range(41, 50))])
    report = follower.run_pass(3.0)
    assert report.rows == 10 and [(n.kind, n.run, n.incident.step) for n in report.notices if n.kind == "opened"] == [("opened", "exp1/pretrain/r1", 40)]
    # Rows deleted (a gc) and the rest reloaded in place (as a dump restored is): rowids renumbered,
    # so the database is read again from its start. (VACUUM itself keeps them here.)
    with sqlite3.connect(store) as db:
        db.execute("DELETE FROM metrics WHERE step < 3")
        db.execute("CREATE TEMP TABLE kept AS SELECT * FROM metrics ORDER BY rowid")
        db.execute("DELETE FROM metrics")
        db.execute("INSERT INTO metrics SELECT * FROM kept")
    db.execute("VACUUM")
    db.close()
    _log(client, run, "loss", _calm_loss(range(50, 55)))
    report = follower.run_pass(4.0)
    assert report.rows == 37 + 15 and report.problems == 1
    assert [n.kind for n in report.notices if n.kind in ("opened", "escalated")] == []
    state.close()


WRITER = """
import sys, time
import mlflow
from mlflow.entities import Metric
client = mlflow.MlflowClient(tracking_uri="sqlite:///" + sys.argv[1])
run = client.search_runs([client.get_experiment_by_name("pretrain").experiment_id])[0].info.run_id
for step in range(40, 70):
    client.log_metric(run, "loss", 9.0 if step == 55 else 2.0 + (step % 5) * 0.01, timestamp=int(time.time() * 1000), step=step)
    time.sleep(0.03)
print("done", flush=True)
"""


def test_the_daemon_follows_a_database_a_real_mlflow_process_logs_into_and_a_kill_repeats_nothing(store, tmp_path):
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    _log(client, run, "loss", _calm_loss(range(1, 40)))
    def write() -> None:
        writer = subprocess.run([sys.executable, "-c", textwrap.dedent(WRITER), str(store)], capture_output=True, text=True, timeout=300)
        assert writer.returncode == 0, writer.stderr

    assert alerted_once_across_a_kill(tmp_path, write, 55) == [("exp1/pretrain/r1", "loss-spike", 55)]


def _stepless(client, run: str, steps) -> None:  # noqa: ANN001
    """`log_metric(run, "loss", value)` with no step, as a script that never counts steps logs:
    MLflow stores step 0 in every row. The loss spikes at the 31st."""
    for i in steps:
        client.log_metric(run, "loss", 9.0 if i == 30 else 2.0 + (i % 5) * 0.01, timestamp=T0 + i)


def test_a_metric_logged_without_a_step_is_numbered_in_the_order_logged_said_once_and_judged(store, tmp_path):
    # Every row at step 0 was one point, "too short", nothing judged.
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    client.log_metric(run, "lr", 1e-4, timestamp=T0)  # one row: its step 0 is kept
    _log(client, run, "grad_norm", [(s, 1.0) for s in range(5)])  # steps of its own: kept
    state = State(tmp_path / "state")
    said: list[str] = []
    follower = Follower([store.parent.parent], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    _stepless(client, run, range(1))
    follower.run_pass(1.0)  # one row: nothing to number yet
    _stepless(client, run, range(1, 20))
    follower.run_pass(2.0)
    _stepless(client, run, range(20, 40))
    report = follower.run_pass(3.0)
    state.close()
    assert [(n.kind, n.incident.step) for n in report.notices if n.kind == "opened"] == [("opened", 30)]
    warned = [s for s in said if "without a step" in s]
    assert warned == [f"warning: {store}: run pretrain/r1: loss was logged without a step (all its rows at one step, MLflow's 0): its rows are numbered in the order logged"]
    frame, _, problems = read_paths([store.parent.parent])
    steps = {tag: frame.filter(pl.col("tag") == tag).get_column("step").to_list() for tag in ("loss", "lr", "grad_norm")}
    assert steps == {"loss": list(range(40)), "lr": [0], "grad_norm": list(range(5))}
    assert [p.message for p in problems] == [warned[0].split(": ", 2)[2]]
    assert [i.step for i in scan([store.parent.parent], rules=default_rules()).incidents] == [30]


def test_a_metric_logged_twice_without_a_step_is_said_numbered_by_a_read_of_the_finished_store(store, tmp_path):
    # Its two rows were numbered 0, 1 in silence: the warning waited for a third row, which a run
    # that logged a metric twice never writes (the file store says it at the second).
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    _log(client, run, "loss", _calm_loss(range(12)))
    for i in range(2):
        client.log_metric(run, "eval_loss", 2.5 - i, timestamp=T0 + 100 + i)
    frame, _, problems = read_paths([store])
    assert frame.filter(pl.col("tag") == "eval_loss").select("step", "value").rows() == [(0, 2.5), (1, 1.5)]
    message = "run pretrain/r1: eval_loss was logged without a step (all its rows at one step, MLflow's 0): its rows are numbered in the order logged"
    assert [p.message for p in problems] == [message]
    # The daemon's reads wait for a third row, which decides how the rows are placed: said then, once.
    said: list[str] = []
    state = State(tmp_path / "state")
    follower = Follower([store.parent.parent], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)
    client.log_metric(run, "eval_loss", 0.5, timestamp=T0 + 102)
    follower.run_pass(2.0)
    state.close()
    assert [s for s in said if "without a step" in s] == [f"warning: {store}: {message}"]


def _mixed(client, run: str, iterations) -> None:  # noqa: ANN001
    """A loop that logs its loss with `step=` (every 10 steps) and its LR without one (step 0 in
    every row, as MLflow stores it), LR after loss; the LR jumps 100x at step 400, the loss spikes there."""
    for i in iterations:
        client.log_metric(run, "loss", 9.0 if i == 40 else 2.0 + (i % 5) * 0.01, timestamp=T0 + 2 * i, step=10 * i)
        client.log_metric(run, "lr", 1e-2 if i >= 40 else 1e-4, timestamp=T0 + 2 * i + 1)


def test_a_metric_logged_without_a_step_beside_stepped_ones_is_put_at_their_steps_not_numbered_apart(store, tmp_path):
    # Acceptance run 3, finding 3: the LR was numbered 0..59 while the loss ran 0..590, so the LR's
    # jump sat at step 40, far from the spike at 400, and the cause was missed.
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    said: list[str] = []
    state = State(tmp_path / "state")
    follower = Follower([store.parent.parent], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    for t, part in enumerate((range(1), range(1, 2), range(2, 25), range(25, 60))):
        _mixed(client, run, part)
        report = follower.run_pass(1.0 + t) if t < 3 else follower.run_pass(9.0)
    state.close()
    frame, _, problems = read_paths([store.parent.parent])
    steps = {tag: frame.filter(pl.col("tag") == tag).get_column("step").to_list() for tag in ("loss", "lr")}
    # Its first two rows are numbered (0, 1) either way: the third tells whether it keeps pace.
    assert steps == {"loss": [10 * i for i in range(60)], "lr": [0, 1, *(10 * i for i in range(2, 60))]}
    assert [p.message for p in problems] == [
        "run pretrain/r1: lr was logged without a step (all its rows at one step, MLflow's 0) beside metrics logged with steps: "
        "each of its rows is put at the step of the last row with a step logged before it"
    ]
    warned = [s for s in said if "without a step" in s]
    assert warned == [f"warning: {store}: {problems[0].message}"]
    (incident,) = scan([store.parent.parent], rules=default_rules()).incidents
    assert incident.step == 400 and incident.causes[0].cause == "lr_schedule", incident.causes
    opened = [n.incident for n in report.notices if n.kind == "opened"]
    assert [(i.step, i.causes[0].cause) for i in opened] == [(400, "lr_schedule")]


def test_a_metric_logged_without_a_step_is_numbered_apart_unless_stepped_metrics_keep_pace_with_it(store):
    # A loss logged without a step beside an eval logged with steps every 10 rows would be folded
    # onto two steps were it put at the eval's: it is numbered on its own, as in a run alone.
    _with_stepless(store)
    frame, _, problems = read_paths([store])
    steps = {(run, tag): frame.filter((pl.col("run") == run) & (pl.col("tag") == tag)).get_column("step").to_list() for run, tag in (
        ("stepless/mixed", "lr"), ("stepless/mixed", "loss"), ("stepless/alone", "loss"), ("stepless/sparse", "loss"), ("stepless/sparse", "eval_loss"),
        ("stepless/before", "lr"), ("stepless/epochs", "lr"), ("stepless/epochs", "val_loss"), ("stepless/constant", "k"), ("stepless/constant", "lr"),
    )}
    assert steps == {
        ("stepless/mixed", "lr"): [0, 1, *(10 * i for i in range(2, 5))], ("stepless/mixed", "loss"): [10 * i for i in range(5)],
        ("stepless/before", "lr"): [0, 1, *(10 * i for i in range(1, 4))], ("stepless/epochs", "lr"): [0, 1, *(10 * i for i in range(2, 6))],
        ("stepless/epochs", "val_loss"): [1, 2], ("stepless/constant", "k"): [5, 6, 7, 8, 9], ("stepless/constant", "lr"): [0, 1, 2, 3, 4],
        ("stepless/alone", "loss"): list(range(5)), ("stepless/sparse", "loss"): list(range(6)), ("stepless/sparse", "eval_loss"): [1, 4],
    }
    said = sorted((p.message.split(":")[0], "beside metrics logged with steps" in p.message) for p in problems)
    assert said == [
        ("run stepless/alone", False), ("run stepless/before", True), ("run stepless/constant", False), ("run stepless/constant", False),
        ("run stepless/epochs", True), ("run stepless/mixed", True), ("run stepless/sparse", False),
    ]


def test_an_lr_logged_without_a_step_before_the_loss_is_put_at_the_step_of_the_loss_before_it(store):
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    for i in range(6):
        client.log_metric(run, "lr", 1e-4 * (i + 1), timestamp=T0 + 2 * i)
        client.log_metric(run, "loss", 2.0, timestamp=T0 + 2 * i + 1, step=10 * i)
    frame, _, _ = read_paths([store])
    lr = frame.filter(pl.col("tag") == "lr").select("step", "value").rows()
    assert lr == [(step, 1e-4 * (i + 1)) for i, step in enumerate([0, 1, 10, 20, 30, 40])]


def test_status_shows_a_database_at_the_watched_root_as_the_runs_it_holds_not_dot(store, tmp_path, capsys):
    # Acceptance run 3, finding 5b: `status` listed the database as run `.`.
    import json

    from lossguard.cli import main

    _written(store)
    (store.parent / "train.log").write_text("step 1 | loss 2.0\n")
    for root in (store.parent, store.parent.parent):
        state_dir = tmp_path / f"state-{root.name}"
        state = State(state_dir)
        Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ).run_pass(1.0)
        state.close()
        assert main(["status", "--state-dir", str(state_dir)]) == 0
        out = capsys.readouterr().out.splitlines()
        prefix = "" if root == store.parent else "exp1/"
        assert f"  {prefix}*  {store}  mlflow_db  byte {store.stat().st_size}" in out, out
        assert any(line.startswith(f"  exp1  {store.parent / 'train.log'}  ") for line in out), out
        assert main(["status", "--state-dir", str(state_dir), "--format", "json"]) == 0
        files = {f["path"]: f for f in json.loads(capsys.readouterr().out)["files"]}
        assert (files[str(store)]["run"], files[str(store)]["runs"]) == (prefix.rstrip("/") or ".", f"{prefix}*")


def test_scan_run_counts_a_database_in_its_header_only_when_a_run_kept_is_its(store):
    # Acceptance run 3, finding 7: `--run exp2` said "2 file(s)", the database read to filter its
    # runs counted though none of them was kept.
    _written(store)
    other = store.parent.parent / "exp2"
    other.mkdir()
    (other / "train.log").write_text("".join(f"step {s} | loss 2.0\n" for s in range(1, 30)))
    alone = scan([store.parent.parent], rules=default_rules(), run_glob="exp2")
    assert [r.run for r in alone.runs] == ["exp2"] and (alone.files, alone.bytes) == (1, (other / "train.log").stat().st_size)
    both = scan([store.parent.parent], rules=default_rules(), run_glob="exp*/sft/*")
    assert [r.run for r in both.runs] == ["exp1/sft/r1"] and (both.files, both.bytes) == (1, store.stat().st_size)
    assert scan([store.parent.parent], rules=default_rules()).files == 2


def test_scan_run_matching_nothing_lists_the_run_names_a_tracker_gives_not_its_files_folder(store):
    # The message listed `exp1` (the database's folder, discovery's name), which
    # `--run` never matches: the names to give are the tracker's runs'.
    _written(store)
    (store.parent / "train.log").write_text("step 1 | loss 2.0\n")  # a log of a run of its own, beside
    res = run_lossguard("scan", "--run", "nomatch*", str(store.parent.parent))
    assert res.returncode == 2, res.stderr
    (line,) = [x for x in res.stderr.splitlines() if "no run matches" in x]
    second = next(r for r in _rows(read_paths([store])[0]) if "(" in r)
    assert line.endswith(f"(runs found: exp1, exp1/pretrain/r1, exp1/{second}, exp1/sft/r1)"), line


def test_the_daemon_says_a_database_locked_at_every_pass_once_until_that_changes(store, tmp_path, monkeypatch):
    # Each pass's read of a locked database repeated the warning. (A lock no private
    # copy gets past: one that does is read once, and its next passes have nothing new to read.)
    monkeypatch.setattr(sqlite_db, "COPY_LIMIT", 0)
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    _log(client, run, "loss", _calm_loss(range(1, 20)))
    said: list[str] = []
    state = State(tmp_path / "state")
    follower = Follower([store.parent.parent], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    writer = sqlite3.connect(store, isolation_level=None)
    locked = lambda: sum("database locked" in s for s in said)  # noqa: E731
    try:
        assert follower.run_pass(1.0).rows == 19
        _log(client, run, "loss", _calm_loss(range(20, 22)))
        writer.execute("BEGIN EXCLUSIVE")
        for now in (2.0, 3.0, 4.0):
            assert follower.run_pass(now).problems == 1
        assert locked() == 1
        writer.execute("ROLLBACK")
        assert follower.run_pass(4.5).rows == 2  # read once free: the next lock is news
        _log(client, run, "loss", _calm_loss(range(20, 25)))
        writer.execute("BEGIN EXCLUSIVE")
        follower.run_pass(5.0)
        assert locked() == 2
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        state.close()


def test_scan_of_a_store_whose_run_logged_no_metric_yet_says_so_not_that_there_are_no_logs(store):
    """A run just started (its params logged, no metric yet): the store is found, and scan's one-line
    error says it holds no metric, where it said there were no training logs at all."""
    client = _client(store)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id, run_name="fresh")
    client.log_param(run.info.run_id, "lr", 0.1)
    res = run_lossguard_in_process("scan", str(store.parent))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == f"lossguard: error: no metric logged yet under {store.parent}: 1 log file(s) found, none holding a training metric"


def _poisoned(db: Path) -> dict[str, str]:
    """Rows no reader can take, put into MLflow's own store by hand (no MLflow client writes them:
    SQLite keeps what a column is given): a text value and a step of 1e300 in pretrain's first r1,
    a BLOB value in sft's r1. Returns each run's first such row's rowid."""
    with sqlite3.connect(db) as conn:
        first, other = (r[0] for r in conn.execute("SELECT run_uuid FROM runs WHERE name = 'r1' AND lifecycle_stage = 'active' ORDER BY start_time").fetchall()[::2])
        rows = [("loss", "abc", first, 50), ("loss", 2.0, first, 1e300), ("train/loss", b"\x00\x01" * 500, other, 60)]
        ids = [conn.execute("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, 0)", (key, value, T0, run, step)).lastrowid for key, value, run, step in rows]
    conn.close()
    return {"exp1/pretrain/r1": ids[0], "exp1/sft/r1": ids[2]}


def test_rows_no_reader_can_take_are_passed_over_by_run_and_row_and_every_other_row_and_run_is_read(store):
    expected = _written(store)
    clean = read(store, run=".", fmt="mlflow_db", final=True, options=OPTIONS).frame
    at = _poisoned(store)
    res = read(store, run=".", fmt="mlflow_db", final=True, options=OPTIONS)
    assert not res.dead
    assert_frame_equal(res.frame, clean)
    assert [p.message for p in res.problems] == [
        f"run pretrain/r1, row {at['exp1/pretrain/r1']}: loss: value 'abc' is not a number; this row's values are skipped"
        " (and 1 more row(s) of this run no reader can take)",
        f"run sft/r1, row {at['exp1/sft/r1']}: train/loss: value (a BLOB of 1,000 bytes) is not a number; this row's values are skipped",
    ]
    result = scan([store.parent.parent], rules=default_rules())
    assert sorted(r.run for r in result.runs) == sorted(expected)
    assert ("exp1/pretrain/r1", "loss-nonfinite") in {(i.run, i.rule) for i in result.incidents}


def test_what_the_first_pass_could_not_read_is_judged_as_new_once_readable_and_alerted_once(store, tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_db, "COPY_LIMIT", 0)  # (a lock no private copy gets past)
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    _log(client, run, "loss", [*_calm_loss(range(1, 30)), (30, 9.0), *_calm_loss(range(31, 100))])
    said: list[str] = []
    state = State(tmp_path / "state")
    follower = Follower([store.parent.parent], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    writer = sqlite3.connect(store, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        first = follower.run_pass(1.0)  # (its tables could not even be read: whose it is is not known yet)
        assert first.rows == 0 and first.notices == []
        assert sum("database locked by a writer" in s for s in said) == 1
        writer.execute("ROLLBACK")
        _log(client, run, "loss", [*_calm_loss(range(100, 120)), (120, 9.0), *_calm_loss(range(121, 130))])
        # Into the outbox, both: the spike of 30 as well, which the first start could not read.
        opened = [(n.run, n.incident.step) for n in follower.run_pass(2.0).notices if n.kind == "opened"]
        assert opened == [("exp1/pretrain/r1", 30), ("exp1/pretrain/r1", 120)]
        _log(client, run, "loss", _calm_loss(range(130, 140)))
        assert [n for n in follower.run_pass(3.0).notices if n.kind == "opened"] == []
    finally:
        writer.close()
        state.close()


def test_the_daemon_started_while_a_writer_holds_the_store_locked_alerts_what_is_logged_after_it_once(store, tmp_path):
    client = _client(store)
    run = client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id
    _log(client, run, "loss", [*_calm_loss(range(1, 20)), (20, 9.0), *_calm_loss(range(21, 40))])  # (an old spike: history)
    writer = sqlite3.connect(store, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # (held through the daemon's first pass)

    def write() -> None:
        writer.execute("ROLLBACK")
        writer.close()
        logged = subprocess.run([sys.executable, "-c", textwrap.dedent(WRITER), str(store)], capture_output=True, text=True, timeout=300)
        assert logged.returncode == 0, logged.stderr

    try:
        assert alerted_once_across_a_kill(tmp_path, write, 55) == [("exp1/pretrain/r1", "loss-spike", 55)]
    finally:
        writer.close()
