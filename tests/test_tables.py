"""Trackers that keep a metric a file or a table a file: DVCLive (`dvclive/plots/metrics/*.tsv`),
MLflow's file store (`mlruns/<exp>/<run>/metrics/<key>`), DeepSpeed's csv_monitor (a CSV a metric
in one folder) and Keras' CSVLogger (`training.log`, CSV). DVCLive and MLflow are written by the
real packages; keras and deepspeed do not install here, so their files are written by the lines of
their writers' code cited at each helper."""

from __future__ import annotations

import collections
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.detection.rules import default_rules
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.discover import discover
from lossguard.ingest.formats.sniff import format_of
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.ingest.sources.mlruns import scalars
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ, run_lossguard, run_lossguard_in_process
from .test_watch import Watch

SPIKE, JUMP, STEPS = 45, 43, 60
"""A calm run whose LR jumps tenfold at JUMP and whose loss spikes at SPIKE."""


def _loss(step: int) -> float:
    return 9.0 if step == SPIKE else 2.0 + (step % 5) * 0.01


def _lr(step: int) -> float:
    return 1e-4 if step < JUMP else 1e-3


def _scan_json(*paths: Path) -> tuple[int, dict]:
    res = run_lossguard("scan", "--format", "json", *map(str, paths))
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def _spike_caused_by_the_lr_jump(report: dict, run: str, at: int, jump: int) -> None:
    """The run's one spike, labelled from its learning rate (another file of the run's)."""
    (found,) = [r for r in report["runs"] if r["run"] == run]
    assert [s["step"] for s in found["spikes"]] == [at]
    causes = {c["cause"]: c["evidence"] for c in found["spikes"][0]["causes"]}
    assert f"at step {jump}" in causes["lr_schedule"], causes


# --- DVCLive -------------------------------------------------------------------------------------


def _live_run(folder: Path, *, steps=range(STEPS), nan_at: int | None = None) -> None:
    from dvclive import Live

    with Live(dir=str(folder), save_dvc_exp=False) as live:
        for step in steps:
            live.log_metric("train/loss", float("nan") if step == nan_at else _loss(step))
            live.log_metric("lr", _lr(step), timestamp=True)
            live.next_step()


def test_dvclive_a_real_run_reads_back_every_step_metric_and_nan_as_one_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (dvclive writes its dvc.yaml in the working folder)
    _live_run(tmp_path / "runs" / "exp1" / "dvclive", steps=range(12), nan_at=7)
    frame, results, problems = read_paths([tmp_path / "runs"])
    assert problems == [] and {r.format for r in results} == {"dvclive"}
    assert frame.get_column("run").unique().to_list() == ["exp1"]
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("tag").unique().to_list() == ["train/loss"]
    assert loss.get_column("step").to_list() == list(range(12))
    values = loss.get_column("value").to_list()
    assert math.isnan(values[7]) and values[:7] == [_loss(s) for s in range(7)]
    lr = frame.filter(pl.col("metric") == "lr")
    assert lr.get_column("step").to_list() == list(range(12)) and lr.get_column("wall_time").null_count() == 0
    assert loss.get_column("wall_time").null_count() == 12  # (logged without timestamp=True)
    # Its summary, report and the working folder's dvc.yaml are no logs.
    assert {p.name for p in (tmp_path / "runs" / "exp1" / "dvclive").iterdir()} >= {"metrics.json", "plots"}


def test_dvclive_and_mlflow_file_store_timestamps_are_read_as_exact_seconds(tmp_path, monkeypatch):
    # Acceptance run 3, finding 7: milliseconds times 0.001 gave 1700000000.1230001.
    import mlflow

    monkeypatch.chdir(tmp_path)
    _live_run(tmp_path / "runs" / "exp1" / "dvclive", steps=range(5))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "runs" / "exp2" / "mlruns").as_uri())
    run = client.create_run(client.create_experiment("e"), run_name="r").info.run_id
    stamps = [1700000000123 + 1001 * i for i in range(5)]
    for step, ms in enumerate(stamps):
        client.log_metric(run, "loss", 2.0, timestamp=ms, step=step)
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert problems == []
    assert frame.filter(pl.col("run") == "exp2/e/r").get_column("wall_time").to_list() == [float(f"{ms // 1000}.{ms % 1000:03d}") for ms in stamps]
    written = (tmp_path / "runs" / "exp1" / "dvclive" / "plots" / "metrics" / "lr.tsv").read_text().splitlines()[1:]
    lr = frame.filter((pl.col("run") == "exp1") & (pl.col("tag") == "lr")).get_column("wall_time").to_list()
    assert lr == [float(f"{int(line.split()[0]) // 1000}.{int(line.split()[0]) % 1000:03d}") for line in written]


def test_dvclive_a_folder_of_another_name_scanned_from_inside_by_a_relative_path_is_read_as_dvclive(tmp_path, monkeypatch):
    # `Live(dir="results/exp3")`, then `cd results/exp3 && lossguard scan .`: the relative paths
    # held no part that says "dvclive", and the .tsv files were no one's.
    monkeypatch.chdir(tmp_path)
    exp3 = tmp_path / "results" / "exp3"
    _live_run(exp3, steps=range(12))
    # Whatever else the folder holds, listed in any order: checkpoints beside it, images beside plots/metrics.
    for i in range(300):
        (exp3 / f"ckpt-{i:03d}.pt").write_bytes(b"")
    (exp3 / "plots" / "images").mkdir()
    for i in range(40):
        (exp3 / "plots" / "images" / f"sample-{i}.png").write_bytes(b"")
    expected = read_paths([exp3])[0].select("run", "tag", "step", "value")
    for here, root in ((exp3, "."), (exp3 / "plots" / "metrics", "."), (exp3 / "plots", "."), (exp3 / "plots" / "images", "../metrics")):
        monkeypatch.chdir(here)
        frame, results, problems = read_paths([Path(root)])
        assert problems == [] and {r.format for r in results} == {"dvclive"}, (here, root, problems)
        assert frame.select("run", "tag", "step", "value").equals(expected), (here, root)


def test_dvclive_a_folder_of_another_name_is_known_by_its_summary_and_names_its_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _live_run(tmp_path / "runs" / "exp3", steps=range(3))
    stray = tmp_path / "runs" / "plotted" / "plots" / "metrics" / "loss.tsv"  # no dvclive beside it
    stray.parent.mkdir(parents=True)
    stray.write_text("step\tloss\n0\t2.0\n")
    found = discover(tmp_path / "runs", problems=[])
    assert sorted((f.run, f.path.name) for f in found) == [("exp3", "loss.tsv"), ("exp3", "lr.tsv")]
    assert format_of(found[0].path) == "dvclive"


def test_dvclive_spike_found_by_scan_with_the_lr_of_its_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _live_run(tmp_path / "runs" / "exp1" / "dvclive")
    code, report = _scan_json(tmp_path / "runs")
    assert code == 1
    _spike_caused_by_the_lr_jump(report, "exp1", SPIKE, JUMP)


def _repeats_said(problems) -> list[str]:  # noqa: ANN001
    return [Path(p.source).name for p in problems if "rows at the step of the row before them" in p.message]


def test_dvclive_micro_batches_logged_at_one_step_are_said_once_a_file_not_dropped_silently(tmp_path, monkeypatch):
    # Acceptance run 3: four log_metric calls a step (one a micro-batch) kept one row a step with
    # nothing said, and a 5x value in another row was missed in silence.
    from dvclive import Live

    monkeypatch.chdir(tmp_path)
    with Live(dir=str(tmp_path / "runs" / "exp1" / "dvclive"), save_dvc_exp=False) as live:
        for step in range(30):
            for micro in range(4):
                live.log_metric("train/loss", 10.0 if (step, micro) == (25, 1) else 2.0 + micro * 0.01)
            live.log_metric("lr", 1e-4)
            live.next_step()
    path = tmp_path / "runs" / "exp1" / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv"
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert _repeats_said(problems) == ["loss.tsv"]  # (lr, once a step, is not named)
    assert frame.filter(pl.col("metric") == "loss").get_column("step").to_list() == [s for s in range(30) for _ in range(4)]
    # Read as the daemon reads a growing file, in pieces: said once, by the read that first sees it.
    text = path.read_bytes()
    cut = text.index(b"\n", len(text) // 3) + 1
    path.write_bytes(text[:cut])
    first = read(path, run="exp1", fmt="dvclive", final=False, options=ReadOptions())
    path.write_bytes(text)
    second = read(path, first.cursor, run="exp1", fmt="dvclive", final=False, options=ReadOptions())
    assert _repeats_said(first.problems) == ["loss.tsv"] and second.problems == ()
    res = run_lossguard_in_process("scan", str(tmp_path / "runs"))
    assert "loss.tsv: rows at the step of the row before them" in res.stdout, res.stdout


def test_dvclive_metric_logged_without_next_step_is_said_not_only_too_short(tmp_path, monkeypatch):
    # Acceptance run 3: log_metric in a loop that never calls next_step writes every row at step 0;
    # the scan said only "too short to judge", and nothing of why.
    from dvclive import Live

    monkeypatch.chdir(tmp_path)
    with Live(dir=str(tmp_path / "exp2" / "dvclive"), save_dvc_exp=False) as live:
        for i in range(40):
            live.log_metric("train/loss", 10.0 if i == 30 else 2.0)
    res = run_lossguard_in_process("scan", str(tmp_path / "exp2" / "dvclive"))
    assert res.returncode == 0 and "loss.tsv: rows at the step of the row before them" in res.stdout, res.stdout
    assert "Live.next_step()" in res.stdout


LIVE = """
import sys
from dvclive import Live
folder, first, last, base, spike, resume = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "resume"
with Live(dir=folder, save_dvc_exp=False, resume=resume) as live:
    for step in range(first, last):
        live.log_metric("train/loss", 9.0 if step == spike else base + (step % 5) * 0.01)
        live.next_step()
"""


def _live(tmp: Path, first: int, last: int, *, base: float, spike: int = -1, resume: bool = False) -> None:
    """A real dvclive process logging steps first..last-1 into runs/exp1/dvclive (`resume`: on from
    the run there; else a new `Live()`, which deletes the folder's files and writes them again)."""
    args = [str(tmp / "runs" / "exp1" / "dvclive"), str(first), str(last), str(base), str(spike), "resume" if resume else "new"]
    done = subprocess.run([sys.executable, "-c", LIVE, *args], cwd=tmp, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_dvclive_run_again_in_its_folder_is_a_new_timeline_whose_spike_at_a_step_seen_before_is_alerted_once(tmp_path):
    # A new Live() rewrites the .tsv files from step 0; the re-run's spike at the step the
    # first run spiked at was taken for the first run's incident (keyed run/rule/step): never opened,
    # and its recovery sent as a stray second `resolved`.
    (tmp_path / "runs" / "exp1").mkdir(parents=True)
    _live(tmp_path, 0, 12, base=2.0)
    w = Watch(tmp_path).start()
    try:
        w.wait_ready()
        _live(tmp_path, 12, STEPS, base=2.0, spike=SPIKE, resume=True)
        w.wait_for(lambda ev: [e["event"] for e in ev if e["event"] != "plot"] == ["opened", "resolved"])
        _live(tmp_path, 0, STEPS, base=3.0, spike=SPIKE)  # another seed, the same step spiking
        w.wait_for(lambda ev: [e["event"] for e in ev if e["run"] == "exp1"].count("opened") == 2)
        ev = w.settle()
    finally:
        err = w.stop_and_read()
    said = [(e["event"], e["step"], e["value"], round(e["baseline"])) for e in ev if e["event"] in ("opened", "resolved")]
    assert said == [("opened", SPIKE, 9.0, 2), ("resolved", SPIKE, 9.0, 2), ("opened", SPIKE, 9.0, 3), ("resolved", SPIKE, 9.0, 3)], err


# --- long tables: TensorBoard's CSV download, lossguard's own read --format csv ----------------


def _tensorboard_csv(logdir: Path, run: str, tag: str) -> str:
    """A tag's CSV as TensorBoard's scalars dashboard downloads it, made by its own plugin."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.scalar import scalars_plugin

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    tb = base_plugin.TBContext(logdir=str(logdir), multiplexer=mux, data_provider=data_provider.MultiplexerDataProvider(mux, str(logdir)))
    body, _ = scalars_plugin.ScalarsPlugin(tb).scalars_impl(context.RequestContext(), tag, run, "", output_format="csv")
    return body


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (html5lib, vendored by tensorboard, on import)
def test_tensorboards_csv_downloads_of_one_run_are_its_metrics_judged_together(tmp_path):
    # `Wall time,Step,Value` was read as two metrics, `Wall time` and `Value`, neither judged; and
    # each download of a run's tags was a run of its own, the loss never seen beside its LR.
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "logs" / "exp1"))
    for step in range(STEPS):
        w.add_scalar("train/loss", _loss(step), step)
        w.add_scalar("train/lr", _lr(step), step)
    w.close()
    downloads = tmp_path / "runs" / "paper"
    downloads.mkdir(parents=True)
    for tag in ("train/loss", "train/lr"):  # (the dashboard names a download run-<run>-tag-<tag>.csv, its /s as _s)
        (downloads / f"run-exp1-tag-{tag.replace('/', '_')}.csv").write_text(_tensorboard_csv(tmp_path / "logs", "exp1", tag))
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert problems == [] and frame.get_column("run").unique().to_list() == ["paper/exp1"]
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == list(range(STEPS)) and loss.get_column("value").to_list() == pytest.approx([_loss(s) for s in range(STEPS)], rel=1e-6)  # (float32)
    assert loss.get_column("wall_time").null_count() == 0
    code, report = _scan_json(tmp_path / "runs")
    assert code == 1
    _spike_caused_by_the_lr_jump(report, "paper/exp1", SPIKE, JUMP)


def test_a_wide_csv_with_a_metric_called_value_stays_a_wide_one(tmp_path):
    (tmp_path / "progress.csv").write_text("step,policy_loss,value\n" + "".join(f"{s},{_loss(s)},{s / 10}\n" for s in range(STEPS)))
    frame = read_paths([tmp_path / "progress.csv"])[0]
    assert frame.group_by("tag").len().sort("tag").rows() == [("policy_loss", STEPS), ("value", STEPS)]


def test_lossguards_own_csv_read_back_is_the_table_it_was_written_from(tmp_path):
    # Saved beside the runs (`lossguard read runs --format csv > runs/all.csv`), it was a run of two
    # metrics, `value` and `wall_time`, with no point.
    runs = tmp_path / "runs"
    _files(runs)
    written = run_lossguard("read", str(runs), "--format", "csv")
    assert written.returncode == 0, written.stderr
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "all.csv").write_text(written.stdout)
    before = read_paths([runs])[0]
    after = read_paths([tmp_path / "export" / "all.csv"])[0]
    columns = ["step", "metric", "tag", "value"]
    assert after.get_column("run").to_list() == ["all/" + r for r in before.get_column("run").to_list()]
    assert after.select(columns).equals(before.select(columns)) and after.height > 100


# --- MLflow file store ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """runs/exp1/mlruns, written by mlflow: experiment `exp one` with two runs named `same` (the
    first spikes after its LR jumps, the second is calm) and a deleted run, experiment `exp2` with
    one run logging NaN and infinities and a key holding a `/`, and a deleted experiment. (Through MlflowClient, which keeps
    no active run or experiment in the process for other tests to meet.)"""
    import mlflow
    from mlflow.entities import Metric

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # (MLflow 3.17 asks for it: SQLite is its default)
    root = tmp_path / "runs" / "exp1" / "mlruns"
    client = mlflow.MlflowClient(tracking_uri=root.as_uri())
    first = client.create_experiment("exp one")
    for k, (name, spike) in enumerate((("same", True), ("same", False), ("gone", True))):
        # Started 1 ms apart at least (the first started of a name keeps it bare).
        run = client.create_run(first, run_name=name, start_time=1796191965000 + k).info.run_id
        for step in range(STEPS):
            client.log_batch(run, metrics=[Metric("train/loss", _loss(step) if spike else 2.0, 0, step), Metric("lr", _lr(step), 0, step)])
        client.set_terminated(run)
        if name == "gone":
            client.delete_run(run)
    odd = client.create_run(client.create_experiment("exp2"), run_name="odd").info.run_id
    for step, value in enumerate([1.0, float("nan"), float("inf"), float("-inf"), 2.0]):
        client.log_metric(odd, "eval/acc/top1", value, step=step * 10)
    binned = client.create_experiment("binned")
    client.log_metric(client.create_run(binned, run_name="old").info.run_id, "loss", 2.0, step=0)
    client.delete_experiment(binned)  # (moved under .trash/)
    return root


def test_status_lists_a_file_store_metric_under_its_run_not_dot(store, tmp_path, capsys):
    from lossguard.cli import main
    from lossguard.detection.rules import default_rules
    from lossguard.state import State
    from lossguard.watch.follow import Follower

    from .conftest import WAIT_FOR_EVERY_READ

    state = State(tmp_path / "state")
    Follower([store], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ).run_pass(1.0)
    state.close()
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out.splitlines()
    odd = [line for line in out if "/metrics/eval/acc/top1" in line]
    assert len(odd) == 1 and odd[0].startswith("  exp2/odd  "), out


def test_mlruns_a_store_of_another_name_scanned_from_its_own_folder_by_a_relative_path_is_read(tmp_path, monkeypatch):
    # `mlflow.set_tracking_uri("file:/data/tracking")`, then `cd /data/tracking && lossguard scan .`:
    # the relative paths began at the experiment, below the folder the store is known by.
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "tracking").as_uri())
    run = client.create_run(client.create_experiment("e"), run_name="r").info.run_id
    for step in range(STEPS):
        client.log_metric(run, "train/loss", _loss(step), step=step)
    expected = read_paths([tmp_path / "tracking"])[0].select("run", "tag", "step", "value")
    assert expected.get_column("run").unique().to_list() == ["e/r"]
    monkeypatch.chdir(tmp_path / "tracking")
    frame, results, problems = read_paths([Path(".")])
    assert problems == [] and {r.format for r in results} == {"mlruns"}
    assert frame.select("run", "tag", "step", "value").equals(expected)


def test_mlruns_every_run_is_a_run_of_its_own_named_by_experiment_and_run_the_deleted_not_read(store):
    frame, results, problems = read_paths([store.parent.parent])
    assert problems == [] and {r.format for r in results} == {"mlruns"}
    assert (store / ".trash").is_dir() and not [r for r in results if ".trash" in r.found.path.parts]
    runs = frame.group_by("run").len().sort("run")
    second = next(r for r in runs.get_column("run") if r.startswith("exp1/exp one/same ("))
    assert runs.rows() == [("exp1/exp one/same", 2 * STEPS), (second, 2 * STEPS), ("exp1/exp2/odd", 5)]
    assert len(second) == len("exp1/exp one/same (12345678)")
    loss = frame.filter((pl.col("run") == "exp1/exp one/same") & (pl.col("metric") == "loss"))
    assert loss.get_column("step").to_list() == list(range(STEPS)) and loss.get_column("value").to_list() == [_loss(s) for s in range(STEPS)]


def test_mlruns_nan_and_infinities_and_a_key_with_a_slash_read_back_as_logged(store):
    frame, _, _ = read_paths([store])
    odd = frame.filter(pl.col("run") == "exp2/odd")
    assert odd.get_column("tag").unique().to_list() == ["eval/acc/top1"]
    assert odd.get_column("step").to_list() == [0, 10, 20, 30, 40]
    values = odd.get_column("value").to_list()
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2:] == [math.inf, -math.inf, 2.0]
    assert odd.get_column("wall_time").null_count() == 0


def test_mlruns_a_store_of_another_name_is_known_by_its_meta_files_and_names_its_run(store):
    import shutil

    shutil.move(store, store.with_name("tracking"))  # (`file:/.../tracking`)
    frame, results, problems = read_paths([store.parent.parent])
    assert problems == [] and {r.format for r in results} == {"mlruns"}
    assert sorted(frame.get_column("run").unique())[0] == "exp1/tracking/exp one/same"
    assert frame.height == read_paths([store.with_name("tracking")])[0].height == 4 * STEPS + 5


def test_mlruns_spike_found_by_scan_with_the_lr_of_its_run_and_runs_of_one_name_kept_apart(store):
    code, report = _scan_json(store.parent.parent)
    assert code == 1
    _spike_caused_by_the_lr_jump(report, "exp1/exp one/same", SPIKE, JUMP)
    assert sum(1 for r in report["runs"] if r["run"].startswith("exp1/exp one/same")) == 2
    assert not [r for r in report["runs"] if "gone" in r["run"]]


def test_mlruns_a_metric_logged_without_a_step_is_numbered_in_the_order_logged_said_once_and_judged(tmp_path, monkeypatch):
    # `log_metric(run, key, value)` writes step 0 on every line; all were one point.
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "runs" / "exp1" / "mlruns"
    client = mlflow.MlflowClient(tracking_uri=root.as_uri())
    run = client.create_run(client.create_experiment("exp one"), run_name="nostep").info.run_id
    client.log_metric(run, "lr", 1e-4)  # one line: its step 0 is kept
    state = State(tmp_path / "state")
    said: list[str] = []
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    report = None
    for first, last in ((0, 1), (1, 20), (20, STEPS)):  # (the first read holds one line: nothing to number yet)
        for step in range(first, last):
            client.log_metric(run, "train/loss", _loss(step))
        report = follower.run_pass(float(last))
    state.close()
    assert [(n.kind, n.incident.step) for n in report.notices if n.kind == "opened"] == [("opened", SPIKE)]
    assert [s.split(": ", 2)[2] for s in said if "without a step" in s] == [
        "run exp one/nostep: train/loss was logged without a step (all its rows at one step, MLflow's 0): its rows are numbered in the order logged"
    ]
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert frame.filter(pl.col("tag") == "train/loss").get_column("step").to_list() == list(range(STEPS))
    assert frame.filter(pl.col("tag") == "lr").get_column("step").to_list() == [0] and len(problems) == 1


def _file_store(tmp_path, monkeypatch):  # noqa: ANN001
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "runs" / "exp1" / "mlruns").as_uri())
    return client, client.create_run(client.create_experiment("pretrain"), run_name="r1").info.run_id


T0 = 1_790_000_000_000
BESIDE = (
    "run pretrain/r1: lr was logged without a step (all its rows at one step, MLflow's 0) beside metrics logged with steps: "
    "each of its rows is put at the step of the last row with a step logged before it"
)


def _loss_then_lr(client, run: str, iterations) -> None:  # noqa: ANN001
    """A loop logging its loss with `step=` (every 10 steps) and its LR without one, 2 ms a step;
    the LR jumps 100x at step 400, where the loss spikes."""
    for i in iterations:
        client.log_metric(run, "loss", 9.0 if i == 40 else 2.0 + (i % 5) * 0.01, timestamp=T0 + 2 * i, step=10 * i)
        client.log_metric(run, "lr", 1e-2 if i >= 40 else 1e-4, timestamp=T0 + 2 * i + 1)


def test_mlruns_a_metric_logged_without_a_step_beside_stepped_ones_is_put_at_their_steps_and_the_cause_found(tmp_path, monkeypatch):
    # Numbered apart, the LR's jump sat at step 40 while the loss spiked at 400: the cause was
    # missed (the SQLite store's reader has placed such rows since acceptance run 3).
    client, run = _file_store(tmp_path, monkeypatch)
    said: list[str] = []
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=said.append, pass_budget=WAIT_FOR_EVERY_READ)
    opened = []
    for t, part in enumerate((range(1), range(1, 2), range(2, 25), range(25, 60))):
        _loss_then_lr(client, run, part)
        opened += [n.incident for n in follower.run_pass(1.0 + t).notices if n.kind == "opened"]
    state.close()
    assert [(i.step, i.causes[0].cause) for i in opened] == [(400, "lr_schedule")]
    assert [s.split(": ", 2)[2] for s in said if "without a step" in s] == [BESIDE]
    frame, _, problems = read_paths([tmp_path / "runs"])
    # Its first two rows are numbered (0, 1) either way, as in the SQLite store: the third decides.
    assert frame.filter(pl.col("tag") == "lr").get_column("step").to_list() == [0, 1, *(10 * i for i in range(2, 60))]
    assert [p.message for p in problems] == [BESIDE]
    code, report = _scan_json(tmp_path / "runs")
    (found,) = report["runs"]
    assert code == 1 and [(s["step"], s["causes"][0]["cause"]) for s in found["spikes"]] == [(400, "lr_schedule")]


def test_mlruns_an_lr_logged_without_a_step_before_the_loss_goes_at_the_step_of_the_loss_before_it(tmp_path, monkeypatch):
    client, run = _file_store(tmp_path, monkeypatch)
    for i in range(6):
        client.log_metric(run, "lr", 1e-4 * (i + 1), timestamp=T0 + 2 * i)
        client.log_metric(run, "loss", 2.0, timestamp=T0 + 2 * i + 1, step=10 * i)
    lr = read_paths([tmp_path / "runs"])[0].filter(pl.col("tag") == "lr").select("step", "value").rows()
    assert lr == [(step, 1e-4 * (i + 1)) for i, step in enumerate([0, 1, 10, 20, 30, 40])]


def test_mlruns_a_loss_logged_without_a_step_beside_an_eval_now_and_then_stays_numbered(tmp_path, monkeypatch):
    # Folded onto the eval's few steps it would be two points: it keeps pace with nothing.
    client, run = _file_store(tmp_path, monkeypatch)
    for i in range(6):
        client.log_metric(run, "loss", 2.0 + (i % 3) * 0.01, timestamp=T0 + 2 * i)
        if i % 3 == 1:
            client.log_metric(run, "eval_loss", 2.5, timestamp=T0 + 2 * i + 1, step=i)
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert frame.filter(pl.col("tag") == "loss").get_column("step").to_list() == list(range(6))
    assert [p.message.endswith("numbered in the order logged") for p in problems] == [True]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fractions=st.lists(st.floats(0, 1), max_size=6))
def test_mlruns_a_paced_metric_read_in_pieces_equals_one_read(tmp_path_factory, fractions):
    # The pace metric's rows logged before each LR row are in its file when that row is read.
    run = tmp_path_factory.mktemp("paced") / "mlruns" / "0" / "abc"
    (run / "metrics").mkdir(parents=True)
    (run.parent / "meta.yaml").write_text("name: e\n")
    (run / "meta.yaml").write_text("run_name: r\nstart_time: 1\n")
    (run / "metrics" / "loss").write_text("".join(f"{T0 + 2 * i} {_loss(i)} {10 * i}\n" for i in range(40)))
    lr = run / "metrics" / "lr"
    data = "".join(f"{T0 + 2 * i + 1} {_lr(i)} 0\n" for i in range(40)).encode()
    lr.write_bytes(data)
    whole = read(lr, run="r", fmt="mlruns", final=True, options=ReadOptions())
    assert whole.frame.get_column("step").to_list() == [0, 1, *(10 * i for i in range(2, 40))]
    lr.write_bytes(b"")
    cursor, frames = Cursor(), []
    for cut in [*sorted({int(f * len(data)) for f in fractions}), len(data)]:
        with open(lr, "ab") as fh:
            fh.write(data[lr.stat().st_size : cut])
        res = read(lr, cursor, run="r", fmt="mlruns", final=False, options=ReadOptions())
        frames.append(res.frame)
        cursor = res.cursor
    assert pl.concat(frames).equals(whole.frame) and cursor.pace == "loss"


def test_mlruns_lines_mlflow_appended_out_of_order_are_read_in_the_order_logged(tmp_path, monkeypatch):
    # Asynchronous logging (transformers' MLflowCallback) appends batches from a pool of threads: the
    # batch logged second lands first. In file order each step going back was a resume, and the rows
    # it seemed to replay replaced the spike before them.
    from mlflow.entities import Metric

    client, run = _file_store(tmp_path, monkeypatch)
    loss = {s: 9.0 if s == 150 else 2.0 + (s % 5) * 0.01 for s in range(0, 300, 10)}
    batches = [[(s, v) for s, v in loss.items() if lo <= s < lo + 100] for lo in (0, 100, 200)]
    for batch in (batches[0], batches[2], batches[1]):
        client.log_batch(run, metrics=[Metric("loss", v, T0 + s, s) for s, v in batch])
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert problems == [] and frame.select("step", "value").rows() == sorted(loss.items())
    code, report = _scan_json(tmp_path / "runs")
    assert code == 1 and [s["step"] for r in report["runs"] for s in r["spikes"]] == [150]


def test_mlruns_a_metric_whose_first_rows_share_a_step_keeps_its_steps_when_later_ones_differ(tmp_path, monkeypatch):
    # The first two rows decided it: a loss logged at every micro-batch of gradient accumulation
    # (four rows a step) was numbered 0..199 and its spike put at step 120, not 30; an eval at
    # step 0 before training's evals at 0, 10... was numbered 0..11.
    client, run = _file_store(tmp_path, monkeypatch)
    for gs in range(50):
        for micro in range(4):
            client.log_metric(run, "loss", 30.0 if gs == 30 else 2.0 + 0.01 * micro, timestamp=T0 + 4 * gs + micro, step=gs)
    client.log_metric(run, "eval_loss", 2.5, timestamp=T0, step=0)
    for i in range(11):
        client.log_metric(run, "eval_loss", 2.4, timestamp=T0 + 1 + i, step=10 * i)
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert problems == []
    assert frame.filter(pl.col("tag") == "loss").get_column("step").to_list() == [gs for gs in range(50) for _ in range(4)]
    assert frame.filter(pl.col("tag") == "eval_loss").get_column("step").to_list() == [0, *(10 * i for i in range(11))]
    code, report = _scan_json(tmp_path / "runs")
    assert code == 1 and {s["step"] for r in report["runs"] for s in r["spikes"] if s["metric"] == "loss"} == {30}


def test_mlruns_metric_keys_named_like_folders_a_walk_passes_over_are_read(tmp_path, monkeypatch):
    from mlflow.entities import Metric

    # A key's `/` is a folder: `artifacts/loss` sat in a folder named as the run's artifacts, `.git/x`
    # in one no walk enters, and both vanished without a word (the SQLite store reads them).
    client, run = _file_store(tmp_path, monkeypatch)
    keys = ["artifacts/loss", "traces/x", ".trash/y", ".git/x", "node_modules/q", "__pycache__/x", "wandb/loss", "metrics/acc"]
    for key in keys:
        client.log_batch(run, metrics=[Metric(key, 1.0 + s, T0 + s, s) for s in range(3)])
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert problems == [] and sorted(frame.get_column("tag").unique()) == sorted(keys)
    assert frame.height == 3 * len(keys)


@pytest.fixture(scope="module")
def long_metric(tmp_path_factory) -> tuple[Path, list[tuple[int, int]]]:
    """A file store metric of 3,000 lines (many probes long), timestamps repeating in pairs, a line
    of another shape among them and a last line still being written."""
    path = tmp_path_factory.mktemp("long") / "loss"
    rows = [(T0 + i // 2, i) for i in range(3000)]
    lines = [f"{ts} 2.0 {step}\n" for ts, step in rows]
    lines.insert(1500, "garbage here\n")
    path.write_text("".join(lines) + f"{T0 + 1500} 2.")
    return path, rows


@settings(max_examples=40, deadline=None)
@given(after=st.integers(-5, 1505), width=st.integers(0, 1600))
def test_mlruns_pace_rows_found_by_bisecting_a_metric_file_are_those_of_reading_it_whole(long_metric, after, width):
    from lossguard.ingest.formats.mlruns_pace import stamped

    path, rows = long_metric
    lo, hi = T0 + after, T0 + after + width
    seed = [r for r in rows if r[0] <= lo][-1:]
    assert stamped(path, lo, hi).rows() == seed + [r for r in rows if lo < r[0] <= hi]


@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=200) | st.text(alphabet=" ab'\":#\\\n\t-é\u2028\x85", max_size=200))
def test_mlruns_meta_yaml_scalars_read_as_pyyaml_reads_what_mlflow_writes(name):
    import yaml

    # As mlflow/utils/yaml_utils.write_yaml dumps a meta.yaml.
    text = yaml.dump({"lifecycle_stage": "active", "name": name, "start_time": 17}, default_flow_style=False, allow_unicode=True, Dumper=yaml.SafeDumper)
    assert scalars(text) == {"lifecycle_stage": "active", "name": yaml.safe_load(text)["name"], "start_time": "17"}


def test_the_daemon_follows_an_mlflow_run_as_it_grows_and_alerts_with_its_lr(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "runs" / "exp1" / "mlruns"
    client = mlflow.MlflowClient(tracking_uri=root.as_uri())
    run = client.create_run(client.create_experiment("exp one"), run_name="live")
    for step in range(40):
        client.log_metric(run.info.run_id, "train/loss", _loss(step), step=step)
        client.log_metric(run.info.run_id, "lr", _lr(step), step=step)
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    assert follower.run_pass(1.0).notices == []
    for step in range(40, STEPS):
        client.log_metric(run.info.run_id, "lr", _lr(step), step=step)
        client.log_metric(run.info.run_id, "train/loss", _loss(step), step=step)
    report = follower.run_pass(2.0)
    opened = [n for n in report.notices if n.kind == "opened"]
    assert [(n.incident.run, n.incident.step) for n in opened] == [("exp1/exp one/live", SPIKE)]
    assert "lr_schedule" in [c.cause for c in opened[0].incident.causes]
    state.close()


def test_a_pass_inotify_named_one_metric_file_of_an_mlflow_run_reads_the_runs_other_files_before_judging(tmp_path, monkeypatch):
    # The loss file's event alone started a pass; its spike was alerted with cause
    # `unknown`, the LR file (written the same step) read by the next pass, and relabelled then.
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "runs" / "exp1" / "mlruns"
    client = mlflow.MlflowClient(tracking_uri=root.as_uri())
    run = client.create_run(client.create_experiment("exp one"), run_name="live").info.run_id
    for step in range(40):
        client.log_batch(run, metrics=[mlflow.entities.Metric("train/loss", _loss(step), 0, step), mlflow.entities.Metric("lr", _lr(step), 0, step)])
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)
    for step in range(40, STEPS):
        client.log_batch(run, metrics=[mlflow.entities.Metric("train/loss", _loss(step), 0, step), mlflow.entities.Metric("lr", _lr(step), 0, step)])
    (loss,) = root.glob("*/*/metrics/train/loss")
    report = follower.run_pass(2.0, changed={str(loss)})  # (the LR file's event not yet in)
    state.close()
    (opened,) = [n.incident for n in report.notices if n.kind == "opened"]
    _, scanned = _scan_json(tmp_path / "runs")
    (spike,) = [s for r in scanned["runs"] for s in r["spikes"]]
    assert opened.step == spike["step"] == SPIKE
    assert [c.cause for c in opened.causes] == [c["cause"] for c in spike["causes"]] and opened.causes[0].cause == "lr_schedule"


# --- DeepSpeed csv_monitor -----------------------------------------------------------------------


def _csv_monitor_write(log_dir: Path, events: list[tuple[str, float, int]], filenames: list[str]) -> None:
    """deepspeed/monitor/csv_monitor.py, csvMonitor.write_events (microsoft/DeepSpeed 38327e07):
    a file an event name (`/` and spaces as `_`), opened `a+`, its header `step,<last part of the
    name>` written the first time this process writes it (`filenames`: a resumed job writes it again)."""
    for log_name, value, step in events:
        header = log_name.split("/")[-1]
        filename = log_name.replace("/", "_").replace(" ", "_")
        with open(f"{log_dir}/{filename}.csv", "a+") as fh:
            writer = csv.writer(fh)
            if filename not in filenames:
                filenames.append(filename)
                writer.writerow(["step", header])
            writer.writerow([step, value])


BATCH = 32


def _deepspeed_job(log_dir: Path, steps: range, filenames: list[str]) -> None:
    """The engine's events (deepspeed/runtime/engine.py): the loss at the gradient-accumulation
    boundary, the LR after the optimizer step, both at the global sample count."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for step in steps:
        _csv_monitor_write(log_dir, [("Train/Samples/train_loss", _loss(step), step * BATCH)], filenames)
        _csv_monitor_write(log_dir, [("Train/Samples/lr", _lr(step), (step + 1) * BATCH)], filenames)


def test_csv_monitor_files_of_one_folder_are_one_run_and_a_resumed_jobs_header_is_no_record(tmp_path):
    job = tmp_path / "runs" / "out" / "DeepSpeedJobName"
    _deepspeed_job(job, range(20), [])
    _deepspeed_job(job, range(20, 30), [])  # resumed: a new process, the headers again
    assert (job / "Train_Samples_train_loss.csv").read_text().count("step,train_loss") == 2
    frame, results, problems = read_paths([tmp_path / "runs"])
    assert problems == [] and [r.found.run for r in results] == ["out/DeepSpeedJobName"] * 2
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == [s * BATCH for s in range(30)]
    assert loss.get_column("value").to_list() == [_loss(s) for s in range(30)]
    assert frame.filter(pl.col("metric") == "lr").height == 30


def test_csv_monitor_spike_found_by_scan_with_the_lr_file_beside_it(tmp_path):
    job = tmp_path / "runs" / "out" / "DeepSpeedJobName"
    _deepspeed_job(job, range(STEPS), [])
    code, report = _scan_json(tmp_path / "runs")
    assert code == 1
    # (The LR is logged after the optimizer step: at the next step's sample count.)
    _spike_caused_by_the_lr_jump(report, "out/DeepSpeedJobName", SPIKE * BATCH, (JUMP + 1) * BATCH)


# --- Keras CSVLogger -----------------------------------------------------------------------------


def _keras_log(path: Path, epochs: range, *, nan_at: int | None = None) -> None:
    """keras/src/callbacks/csv_logger.py, CSVLogger.on_epoch_end (keras-team/keras 3422977a): the
    first epoch's keys sorted, `epoch` before them, a csv.excel dialect (\\r\\n), `NA` for a key an
    epoch did not log (validation every other epoch here); LearningRateScheduler puts
    `learning_rate` in the logs."""
    keys = None
    with open(path, "w") as fh:
        writer = None
        for epoch in epochs:
            logs = {"loss": float("nan") if epoch == nan_at else _loss(epoch), "accuracy": 0.5, "learning_rate": _lr(epoch)}
            if epoch % 2 == 0:
                logs["val_loss"] = 2.5
            if keys is None:
                keys = sorted(logs)
            if writer is None:
                writer = csv.DictWriter(fh, fieldnames=["epoch", *keys], dialect=csv.excel)
                writer.writeheader()
            row = collections.OrderedDict({"epoch": epoch})
            row.update((key, logs.get(key, "NA")) for key in keys)
            writer.writerow(row)


def test_keras_training_log_is_csv_its_epochs_the_steps_said_once(tmp_path):
    log = tmp_path / "runs" / "mnist" / "training.log"
    log.parent.mkdir(parents=True)
    _keras_log(log, range(12), nan_at=5)
    assert format_of(log) == "csv"
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert [p.message for p in problems] == ["no step finer than the epoch in this file: its epochs are the steps"]
    assert frame.get_column("run").unique().to_list() == ["mnist"]
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == list(range(12)) and math.isnan(loss.get_column("value")[5])
    assert frame.filter(pl.col("metric") == "eval_loss").get_column("step").to_list() == list(range(0, 12, 2))
    assert "epoch" not in frame.get_column("tag").to_list()


def test_keras_spike_found_by_scan_with_its_lr(tmp_path):
    log = tmp_path / "runs" / "mnist" / "training.log"
    log.parent.mkdir(parents=True)
    _keras_log(log, range(STEPS))
    code, report = _scan_json(tmp_path / "runs")
    assert code == 1
    _spike_caused_by_the_lr_jump(report, "mnist", SPIKE, JUMP)


def test_a_console_log_named_training_log_is_still_a_console_log(tmp_path):
    log = tmp_path / "training.log"
    log.write_text("".join(f"step {s} | loss {_loss(s)} | lr {_lr(s)}\n" for s in range(20)))
    assert format_of(log) == "kv_lines"


# --- pieces read one after another ---------------------------------------------------------------


def _files(root: Path) -> dict[str, tuple[Path, str]]:
    """One file of each, as its writer leaves it, at the place that names its format and metric."""
    dv = root / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv"
    dv.parent.mkdir(parents=True)
    dv.write_text("timestamp\tstep\tloss\n" + "".join(f"{1796191876559 + s}\t{s}\t{_loss(s) if s != 7 else 'nan'}\n" for s in range(40)))
    ml = root / "mlruns" / "0" / "abc" / "metrics" / "train" / "loss"
    ml.parent.mkdir(parents=True)
    (ml.parent.parent.parent / "meta.yaml").write_text("run_name: r\nstart_time: 1\n")
    ml.write_text("".join(f"{1796191876559 + s} {_loss(s) if s != 7 else 'nan'} {s}\n" for s in range(40)))
    ds = root / "ds" / "Train_Samples_train_loss.csv"
    ds.parent.mkdir()
    _csv_monitor_write(ds.parent, [("Train/Samples/train_loss", _loss(s), s * BATCH) for s in range(40)], [])
    keras = root / "keras" / "training.log"
    keras.parent.mkdir()
    _keras_log(keras, range(40), nan_at=7)
    return {"dvclive": (dv, "dvclive"), "mlruns": (ml, "mlruns"), "csv_monitor": (ds, "csv"), "keras": (keras, "csv")}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["dvclive", "mlruns", "csv_monitor", "keras"]), fractions=st.lists(st.floats(0, 1), max_size=8))
def test_pieces_read_one_after_another_equal_one_read(tmp_path_factory, which, fractions):
    root = tmp_path_factory.mktemp("pieces")
    path, fmt = _files(root)[which]
    data = path.read_bytes()
    whole = read(path, run="r", fmt=fmt, final=True, options=ReadOptions())
    path.write_bytes(b"")
    cursor, frames = Cursor(), []
    for cut in [*sorted({int(f * len(data)) for f in fractions}), len(data)]:
        with open(path, "ab") as fh:
            fh.write(data[path.stat().st_size : cut])
        res = read(path, cursor, run="r", fmt=fmt, final=False, options=ReadOptions())
        frames.append(res.frame)
        cursor = res.cursor
    assert whole.frame.height >= 40
    assert pl.concat(frames).equals(whole.frame) and cursor.offset == len(data)


def _calm_losses(client, run: str) -> None:  # noqa: ANN001
    from mlflow.entities import Metric

    client.log_batch(run, metrics=[Metric("loss", 2.0 + (i % 5) * 0.01, T0 + i, i) for i in range(50)])


def test_mlruns_a_quote_left_open_over_80000_lines_is_parsed_in_linear_time_and_the_run_named_by_its_id(tmp_path, monkeypatch):
    """An experiment's meta.yaml whose name opens a quote never closed: every line after it is the
    name's, each looked at once (each line joined again to all before it took 29 s for these)."""
    client, run = _file_store(tmp_path, monkeypatch)
    _calm_losses(client, run)
    (run_dir,) = (tmp_path / "runs" / "exp1" / "mlruns").glob(f"*/{run}")
    meta = run_dir.parent / "meta.yaml"
    meta.write_text(meta.read_text().replace("name: pretrain", "name: 'pretrain\n" + "".join(f"{i}\n" for i in range(80_000))))
    assert meta.stat().st_size < 1 << 20
    frame, _, problems = read_paths([tmp_path / "runs"])
    assert problems == [] and set(frame.get_column("run").to_list()) == {f"exp1/{meta.parent.name}/r1"}


def test_mlruns_a_run_name_of_50_mb_is_cut_and_said_reading_no_more_than_the_bounds(tmp_path, monkeypatch):
    """A run named by 50 MB (its tag holds it verbatim, its meta.yaml on one line, as MLflow's file
    store writes them): `read` held it on every row (7 GB, 53 s). The tag is read up to 4 bytes a
    character of the bound, the meta.yaml over 1 MiB not parsed, both said; tracemalloc, which
    counts every str and bytes, sees no more than a few MiB."""
    import tracemalloc

    client, run = _file_store(tmp_path, monkeypatch)
    _calm_losses(client, run)
    (run_dir,) = (tmp_path / "runs" / "exp1" / "mlruns").glob(f"*/{run}")
    name = "n" * (50 << 20)
    (run_dir / "tags" / "mlflow.runName").write_text(name)
    meta = run_dir / "meta.yaml"
    meta.write_text(meta.read_text().replace("run_name: r1", f"run_name: {name}"))
    tracemalloc.start()
    try:
        frame, _, problems = read_paths([run_dir / "metrics" / "loss"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    assert set(frame.get_column("run").to_list()) == {"pretrain/" + "n" * 4095 + "…"}
    assert [p.message for p in problems] == [
        f"{run}/meta.yaml over 1 MiB: not parsed; the run's name of 52,428,800 bytes cut to its first 4,095 characters and an ellipsis"
    ]
