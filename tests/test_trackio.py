"""trackio's project databases (lossguard.ingest.formats.trackio_db), written by trackio itself
(`trackio.init`, `trackio.log`, `trackio.finish`, in a child process: TRACKIO_DIR is read when
trackio is imported; no network, no dashboard), read back by read, scan and the daemon's pass,
including a write only the WAL holds."""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.detection.rules import default_rules
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.ingest.sources import sqlite_db
from lossguard.report.audit import scan
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ
from .test_watch import alerted_once_across_a_kill

pytest.importorskip("trackio")
OPTIONS = ReadOptions()

LOG = """
import math, sys, time, trackio
def loss(step):
    return {SPIKE: 9.0}.get(step, 2.0 + (step % 5) * 0.01)
for i, (name, first, last, resume) in enumerate(RUNS):
    if i == HOLD:
        print("held", flush=True)
        sys.stdin.readline()
    trackio.init(project="proj", name=name, resume=resume)
    for step in range(first, last):
        values = {"train/loss": loss(step), "lr": 1e-4}
        if step % 2 == 0:
            values["grad_norm"] = {NON_FINITE}.get(step, 1.0 + step * 0.1)
        trackio.log(values, step=step)
        if i >= HOLD:
            time.sleep(PAUSE)
    trackio.finish()
"""
NON_FINITE = {3: "math.nan", 4: "math.inf", 6: "-math.inf"}


def _start(folder: Path, runs: list[tuple[str, int, int, str]], *, spike: int = -1, pause: float = 0.0, hold: int = 0) -> subprocess.Popen:
    """trackio logging `runs` ((name, first step, end, resume)) into project `proj` under `folder`:
    the runs before `hold`, then (once told on its stdin, after it printed "held") the others,
    `pause` seconds after each of their steps."""
    non_finite = "{" + ", ".join(f"{k}: {v}" for k, v in NON_FINITE.items()) + "}"
    script = textwrap.dedent(LOG).replace("RUNS", repr(runs)).replace("SPIKE", str(spike)).replace("{NON_FINITE}", non_finite)
    return _run(folder, script.replace("PAUSE", repr(pause)).replace("HOLD", str(hold)))


def _run(folder: Path, script: str) -> subprocess.Popen:
    """A trackio script run in a child process, its database under `folder`."""
    env = {**os.environ, "TRACKIO_DIR": str(folder), "HF_HUB_OFFLINE": "1", "TRACKIO_TELEMETRY_DISABLED": "1"}
    return subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _held(folder: Path, runs: list[tuple[str, int, int, str]], *, hold: int, spike: int = -1, pause: float = 0.0):  # noqa: ANN202
    """`_start`ed, once it has logged the runs before `hold`: returns what lets it log the rest and
    waits for its end. One trackio process for the history and the live part (its import and start
    are most of a child's 2-3 s); the live part is still a run trackio resumes."""
    return _once_held(_start(folder, runs, spike=spike, pause=pause, hold=hold))


def _once_held(proc: subprocess.Popen):  # noqa: ANN202
    """Once `proc` printed "held": what tells it to go on (a line on its stdin) and waits for its end."""
    for line in proc.stdout:  # (trackio says what it does on stdout too)
        if line == "held\n":
            break

    def rest() -> None:
        _, err = proc.communicate("go\n", timeout=300)
        assert proc.returncode == 0, err

    return rest


def _trackio(folder: Path, runs: list[tuple[str, int, int, str]]) -> None:
    """trackio logging `runs` into project `proj` under `folder`, to its end."""
    _held(folder, runs, hold=len(runs))()


def _expected_rows(name: str, first: int, last: int) -> list[tuple[str, int, str, float]]:
    rows = []
    for step in range(first, last):
        rows += [(name, step, "train/loss", 2.0 + (step % 5) * 0.01), (name, step, "lr", 1e-4)]
        if step % 2 == 0:
            rows.append((name, step, "grad_norm", {3: math.nan, 4: math.inf, 6: -math.inf}.get(step, 1.0 + step * 0.1)))
    return rows


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """trackio's folder after two runs named `r1` (the second a new run: resume="never") and `r2`."""
    folder = tmp_path_factory.mktemp("trackio") / "trackio"
    _trackio(folder, [("r1", 0, 12, "never"), ("r1", 0, 3, "never"), ("r2", 5, 9, "never")])
    return folder


def _same(a: tuple, b: tuple) -> bool:
    return a[:3] == b[:3] and (a[3] == b[3] or (math.isnan(a[3]) and math.isnan(b[3])))


def test_a_database_trackio_wrote_is_read_back_exactly_run_by_run(written):
    with sqlite3.connect(written / "proj.db") as db:
        second = db.execute("SELECT run_id FROM metrics WHERE run_name = 'r1' ORDER BY id DESC LIMIT 1").fetchone()[0]
    db.close()
    frame, results, problems = read_paths([written])
    assert problems == [] and [r.format for r in results] == ["trackio_db"]
    expected = _expected_rows("proj/r1", 0, 12) + _expected_rows(f"proj/r1 ({second[:8]})", 0, 3) + _expected_rows("proj/r2", 5, 9)
    got = list(frame.select("run", "step", "tag", "value").iter_rows())
    assert len(got) == len(expected) and all(_same(a, b) for a, b in zip(got, expected)), got
    assert frame.get_column("wall_time").null_count() == 0


def test_scan_judges_each_trackio_run_and_the_non_finite_rules_see_them(written):
    result = scan([written], rules=default_rules())
    assert sorted(r.run for r in result.runs)[::2] == ["proj/r1", "proj/r2"]
    assert ("proj/r1", "grad-norm-nonfinite") in {(i.run, i.rule) for i in result.incidents}


@pytest.fixture(scope="module")
def emptied(written, tmp_path_factory) -> Path:
    """A copy of the project's database without its metric rows."""
    path = tmp_path_factory.mktemp("emptied") / "proj.db"
    with sqlite3.connect(written / "proj.db") as src, sqlite3.connect(path) as dst:
        src.backup(dst)
        dst.execute("DELETE FROM metrics")
    src.close()
    dst.close()
    return path


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 25), max_size=6), limit=st.sampled_from([None, 1, 500, 5000]))
def test_rows_appended_between_reads_read_in_pieces_equal_one_read(written, emptied, tmp_path_factory, cuts, limit):
    whole = written / "proj.db"
    path = tmp_path_factory.mktemp("grown") / "proj.db"
    shutil.copy(emptied, path)
    one = read(whole, run=".", fmt="trackio_db", final=True, options=OPTIONS)
    cursor, frames = Cursor(), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sqlite_db, "MIN_ROWS", 1)
        for upto in [*sorted(cuts), 1000]:
            with sqlite3.connect(path) as db:
                db.execute("ATTACH DATABASE ? AS whole", (str(whole),))
                db.execute("INSERT INTO metrics SELECT * FROM whole.metrics WHERE id > (SELECT coalesce(max(id), 0) FROM main.metrics) AND id <= ?", (upto,))
            db.close()
            res = read(path, cursor, run=".", fmt="trackio_db", final=False, options=OPTIONS, limit=limit)
            assert res.problems == () and res.named
            frames.append(res.frame)
            cursor = Cursor.from_json(res.cursor.to_json())
        while cursor.offset < sqlite_db.stamp(path)[0]:
            res = read(path, cursor, run=".", fmt="trackio_db", final=False, options=OPTIONS, limit=limit)
            frames.append(res.frame)
            cursor = res.cursor
    assert pl.concat(frames).drop("source").equals(one.frame.drop("source"))


def test_a_write_only_the_wal_holds_is_seen_by_the_daemon(tmp_path):
    folder = tmp_path / "runs" / "trackio"
    rest = _held(folder, [("r1", 0, 40, "never"), ("r1", 40, 50, "allow")], hold=1, spike=45)
    db = folder / "proj.db"
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    assert follower.run_pass(1.0).rows > 0
    # A connection left open (trackio's dashboard, a notebook): the writer's close then checkpoints
    # nothing, and its rows are in the WAL alone.
    keep = sqlite3.connect(db)
    keep.execute("SELECT count(*) FROM metrics").fetchone()
    before = os.stat(db)
    try:
        rest()
        after = os.stat(db)
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        assert os.stat(f"{db}-wal").st_size > 0
        report = follower.run_pass(2.0, {f"{db}-wal"})  # (what inotify names)
    finally:
        keep.close()
    assert not report.walked and report.files == 1
    assert [(n.run, n.incident.step) for n in report.notices if n.kind == "opened"] == [("trackio/proj/r1", 45)]
    state.close()


def test_the_daemon_follows_a_database_a_real_trackio_process_logs_into_and_a_kill_repeats_nothing(tmp_path):
    folder = tmp_path / "runs" / "trackio"
    # (trackio writes what was logged every 0.5 s: a step every 20 ms spreads these over passes.)
    write = _held(folder, [("r1", 0, 30, "never"), ("r1", 30, 70, "allow")], hold=1, spike=55, pause=0.02)
    assert alerted_once_across_a_kill(tmp_path, write, 55) == [("trackio/proj/r1", "loss-spike", 55)]


NESTED = """
import trackio
trackio.init(project="proj", name="nested")
for step in range(20):
    trackio.log({"train": {"loss": 9.0 if step == 15 else 2.0 + (step % 3) * 0.01, "lr": 1e-4}, "eval": {"acc": 0.5}})
trackio.finish()
"""


def test_a_run_logged_as_nested_dicts_is_read_under_the_joined_keys(tmp_path):
    # Acceptance run 3: trackio.log({"train": {"loss": ...}}), which trackio stores as given, made
    # `scan` say "no training logs found" although the database and its run were there.
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "db"), "HF_HUB_OFFLINE": "1", "TRACKIO_TELEMETRY_DISABLED": "1"}
    done = subprocess.run([sys.executable, "-c", NESTED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    frame, _, problems = read_paths([tmp_path / "db"])
    assert problems == []
    assert sorted(frame.get_column("tag").unique().to_list()) == ["eval.acc", "train.loss", "train.lr"]
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == list(range(20)) and loss.get_column("value")[15] == 9.0
    result = scan([tmp_path / "db"], rules=default_rules())
    assert [(i.run, i.step) for i in result.incidents] == [("proj/nested", 15)]


def test_a_row_nested_past_what_json_follows_costs_that_row_only_said_with_its_id(written, tmp_path):
    """trackio's json.dumps cannot write a dict nested 5,000 deep (RecursionError): the row is made
    by hand in a copy of a database trackio wrote; a row nested 900 deep, which it can, is read."""
    path = tmp_path / "proj.db"
    shutil.copy(written / "proj.db", path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE metrics SET metrics = ? WHERE id = 3", ('{"a":' * 5000 + "1" + "}" * 5000,))
        db.execute("UPDATE metrics SET metrics = ? WHERE id = 4", ('{"a":' * 900 + "1" + "}" * 900,))
    db.close()
    whole = read(written / "proj.db", run=".", fmt="trackio_db", final=True, options=OPTIONS)
    res = read(path, run=".", fmt="trackio_db", final=True, options=OPTIONS)
    (said,) = [p.message for p in res.problems]
    assert ", row 3: its metrics are JSON nested too deep to read; this row's values are skipped" in said
    deep = "a." * 899 + "a"
    assert res.frame.filter(pl.col("tag").str.len_chars() > 1000).get_column("tag").to_list() == [deep]
    first = whole.frame.get_column("run")[0]  # (ids 3 and 4: its steps 2 and 3)
    others = whole.frame.filter(~((pl.col("run") == first) & pl.col("step").is_in([2, 3])))
    assert res.frame.filter(pl.col("tag").str.len_chars() < 1000).drop("source").equals(others.drop("source"))


POISONED = """
import sys, time, trackio
trackio.init(project="proj", name="a")
for step in range(30):
    trackio.log({"train/loss": 2.0 + (step % 5) * 0.01}, step=step + 0.5 if step == 20 else step)
trackio.finish()
print("held", flush=True)
sys.stdin.readline()
trackio.init(project="proj", name="b")
for step in range(70):
    trackio.log({"train/loss": 9.0 if step == 55 else 2.0 + (step % 5) * 0.01}, step=step)
    time.sleep(0.02)
trackio.finish()
"""


def _poisoned(folder: Path):  # noqa: ANN202
    """trackio logging run `a` with one step of 20.5 (trackio 0.43 takes it and stores a REAL), then,
    once told on its stdin, run `b`, whose loss spikes at 55: returns what lets it go on and waits
    for its end."""
    return _once_held(_run(folder, POISONED))


def _crafted(db: Path) -> dict[str, int]:
    """Rows no trackio writes, put in by hand into trackio's own database: a text step, metrics
    nested 1,000 deep, and a row of no run id beside the named run (the table rebuilt without its
    NOT NULL, as another program's copy of it may be). Returns each kind's row id."""
    with sqlite3.connect(db) as conn:
        run_id, stamp = conn.execute("SELECT run_id, timestamp FROM metrics WHERE run_name = 'b' LIMIT 1").fetchone()
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'metrics'").fetchone()[0]
        conn.execute("ALTER TABLE metrics RENAME TO kept")
        conn.execute(sql.replace("run_id TEXT NOT NULL", "run_id TEXT"))
        conn.execute("INSERT INTO metrics SELECT * FROM kept")
        conn.execute("DROP TABLE kept")
        add = "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, ?, 'b', ?, ?)"
        deep = '{"a": ' * 1000 + "1" + "}" * 1000
        ids = {
            "text step": conn.execute(add, (run_id, stamp, "twelve", '{"train/loss": 2.0}')).lastrowid,
            "deep": conn.execute(add, (run_id, stamp, 200, deep)).lastrowid,
            "no run id": conn.execute(add, (None, stamp, 201, '{"train/loss": 9.0}')).lastrowid,
        }
    conn.close()
    return ids


def test_a_float_step_and_rows_no_reader_can_take_are_passed_over_by_run_and_row_and_the_rest_is_read(tmp_path):
    folder = tmp_path / "trackio"
    _poisoned(folder)()
    db = folder / "proj.db"
    with sqlite3.connect(db) as conn:
        (stored,) = conn.execute("SELECT typeof(step) || ' ' || step FROM metrics WHERE run_name = 'a' AND step > 20 AND step < 21").fetchone()
        (float_row,) = conn.execute("SELECT id FROM metrics WHERE typeof(step) = 'real'").fetchone()
    conn.close()
    assert stored == "real 20.5"  # (as trackio stored it)
    ids = _crafted(db)
    frame, _, problems = read_paths([folder])
    steps = {run: rows.get_column("step").to_list() for (run,), rows in frame.partition_by("run", as_dict=True).items()}
    assert steps == {"proj/a": [s for s in range(30) if s != 20], "proj/b": list(range(70))}
    assert [p.message for p in problems] == [
        f"run proj/a, row {float_row}: step 20.5 is not a whole number; this row's values are skipped",
        f"run proj/b, row {ids['text step']}: step 'twelve' is not a whole number; this row's values are skipped"
        " (and 2 more row(s) of this run no reader can take)",
    ]
    result = scan([folder], rules=default_rules())
    assert [(i.run, i.step) for i in result.incidents] == [("proj/b", 55)]


def test_the_daemon_alerts_a_spike_beside_a_run_with_a_float_step_once_across_a_kill(tmp_path):
    write = _poisoned(tmp_path / "runs" / "trackio")
    assert alerted_once_across_a_kill(tmp_path, write, 55) == [("trackio/proj/b", "loss-spike", 55)]


def test_a_database_held_in_exclusive_locking_mode_is_read_to_its_wals_committed_frames(written, tmp_path):
    db = tmp_path / "proj.db"
    shutil.copy(written / "proj.db", db)
    whole = read(db, run=".", fmt="trackio_db", final=True, options=OPTIONS)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("PRAGMA locking_mode = EXCLUSIVE")  # (readers wait for it: its WAL index is its own)
    run_id = writer.execute("SELECT run_id FROM metrics WHERE run_name = 'r2' LIMIT 1").fetchone()[0]
    add = "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, '2026-01-01T00:00:00', 'r2', ?, ?)"
    writer.execute(add, (run_id, 9, '{"train/loss": 2.0}'))  # committed: in the WAL alone
    writer.execute("PRAGMA cache_size = 1")
    writer.execute("BEGIN")
    writer.executemany(add, [(run_id, step, '{"train/loss": 9.0}') for step in range(10, 2000)])  # (frames spilled, never committed)
    try:
        assert os.stat(f"{db}-wal").st_size > 100_000
        res = read(db, run=".", fmt="trackio_db", final=True, options=OPTIONS)
    finally:
        writer.close()
    told = f"database locked by a writer (waited {sqlite_db.BUSY_WAIT:g} s); what it had committed is read (from a private copy)"
    assert [(p.message, p.unfinished) for p in res.problems] == [(told, True)]
    added = res.frame.filter(pl.col("run") == "proj/r2").tail(1).select("step", "tag", "value").rows()
    assert res.frame.height == whole.frame.height + 1 and added == [(9, "train/loss", 2.0)]
