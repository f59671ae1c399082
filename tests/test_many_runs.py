"""Many runs read and judged in one set of queries (what a daemon pass over hundreds of busy runs
does) give exactly what reading and judging each run on its own gives: the batched paths change the
cost, never the answer."""

from __future__ import annotations

import numpy as np
import polars as pl
from polars.testing import assert_frame_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pathlib import Path

import lossguard
from lossguard.ingest import reader as reader_module
from lossguard.ingest.cursor import Cursor
from lossguard.detection.engine import SCAN_NEEDS
from lossguard.ingest.readmany import Job, read_many
from lossguard.ingest.reader import ReadOptions, read
from lossguard.detection.rules import default_rules, rule_from
from lossguard.detection.spikes import find_incidents, find_incidents_by_run
from lossguard.detection.streams import collapse

KINDS = [
    {"kind": "ratio", "factor": 2.0, "window": 9},
    {"kind": "ratio", "factor": 1.3, "window": 12, "min_history": 2, "baseline": "median"},
    {"kind": "zscore", "k": 2.0, "window": 12, "min_history": 3},
    {"kind": "ewm", "factor": 1.4, "alpha": 0.2},
    {"kind": "sustained", "factor": 1.2, "window": 8, "patience": 3},
    {"kind": "slope", "window": 6, "rate": 0.02},
    {"kind": "threshold", "above": 500.0, "patience": 2},
    {"kind": "nonfinite"},
    {"kind": "nonfinite", "patience": 2},
    {"kind": "ratio", "factor": 1.5, "window": 4, "cooldown": 5},
]

value = st.one_of(st.integers(1, 900).map(float), st.floats(0.1, 900.0), st.sampled_from([float("nan"), float("inf")]))
stream = st.tuples(
    st.lists(value, min_size=0, max_size=60),
    st.lists(st.integers(-3, 3), max_size=60),  # step deltas: a negative one is a resume
    st.integers(0, 40),  # points the stream held before (a daemon's tail)
)


def _points(values: list[float], deltas: list[int]) -> pl.DataFrame:
    steps, step = [], 100
    for i in range(len(values)):
        step += deltas[i] if i < len(deltas) and deltas[i] != 0 else 1
        steps.append(step)
    return collapse(pl.DataFrame({"step": steps, "value": values}, schema={"step": pl.Int64, "value": pl.Float64}))


@settings(max_examples=150, deadline=None)
@given(params=st.sampled_from(KINDS), streams=st.lists(stream, min_size=1, max_size=6))
def test_runs_judged_together_raise_what_each_run_judged_alone_raises(params, streams):
    rule = rule_from({"name": "r", "metric": "loss", **params})
    runs = [f"run{k}" for k in range(len(streams))]
    parts, alone = [], {}
    for k, (values, deltas, before) in enumerate(streams):
        points = _points(values, deltas)
        found = find_incidents(points, rule, run=runs[k], seen_before=before)
        if found:
            alone[k] = found
        parts.append(points.select(pl.lit(k, dtype=pl.Int64).alias("run"), "step", "value", "segment"))
    together = find_incidents_by_run(pl.concat(parts), rule, runs=runs, seen_before=[s[2] for s in streams])
    assert repr(together) == repr(alone)  # (repr: an incident's value may be NaN, which equals nothing)


def test_a_spike_in_one_of_many_runs_is_that_runs_alone():
    rule = default_rules().rules[0]
    calm = [2.0 + (s % 7) * 0.01 for s in range(60)]
    spiked = calm[:40] + [9.0] + calm[41:]
    parts = [
        pl.DataFrame({"run": [k] * 60, "step": np.arange(1, 61), "value": spiked if k == 2 else calm, "segment": [0] * 60})
        for k in range(5)
    ]
    found = find_incidents_by_run(pl.concat(parts), rule, runs=[f"r{k}" for k in range(5)])
    assert list(found) == [2]
    (inc,) = found[2]
    assert (inc.run, inc.step, inc.value) == ("r2", 41, 9.0)


line = st.one_of(
    st.builds(lambda s, loss: f'{{"step": {s}, "loss": {loss}, "lr": 1e-4}}', st.integers(0, 10**6), st.floats().map(repr)),
    st.builds(lambda s, v: f'{{"global_step": {s}, "eval_loss": "{v}"}}', st.integers(0, 10**6), st.floats(0, 10).map(repr)),
    st.builds(lambda s: f'{{"step": {s}, "loss": 2.0, "tokens": {s * 4096}, "epoch": 0.5}}', st.integers(0, 10**6)),  # tags nothing judges
    st.sampled_from([
        '{"loss": 2.5, "lr": 0.1}',  # no step: numbered, or the last step before it
        '{"epoch": 1, "valid_loss": 3.0}',
        '{"step": "abc", "loss": 1.0}',  # a step that is no number
        '{"step": 3.5, "loss": 1.0}',
        "not json at all",
        '{"event": "checkpoint"}',
        '{"step": 7, "train_runtime": 10.0, "train_loss": 2.0}',  # the end-of-training summary
        '{"step": 8, "loss": NaN, "grad_norm": Infinity}',
        '{"step": 9, "valid_num_updates": 9, "valid_loss": 2.0}',
        '{"step": 10, "lossguard batch probe": 1.0}',
        "\x00\x00\x00",
    ]),
)


def logs_of(line: st.SearchStrategy[str], *, lines: int = 10) -> st.SearchStrategy:
    """A few logs, each (the lines a daemon read before, the lines written since, a last line still
    being written or not)."""
    return st.lists(st.tuples(st.lists(line, max_size=lines), st.lists(line, max_size=lines), st.booleans()), min_size=1, max_size=5)


READS = {"needs": st.sampled_from([None, SCAN_NEEDS]), "final": st.booleans(), "lean": st.booleans()}
"""How a batch may read: with scan's projection or without, a complete file or a growing one, lean or not."""


def _read_together_as_alone(tmp, logs, *, fmt: str, torn: str, needs, final: bool, lean: bool, path_of=None) -> None:  # noqa: ANN001
    """Each log written as `before`, read as a daemon would, then grown by `after` (and a line still
    being written): what the batch reads of each is what reading it alone gives."""
    options = ReadOptions()
    jobs = []
    for k, (before, after, torn_at_end) in enumerate(logs):
        path = path_of(tmp, k) if path_of is not None else tmp / f"run{k}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{text}\n" for text in before))
        cursor = read(path, run=f"run{k}", fmt=fmt, final=False, options=options).cursor
        with open(path, "a") as fh:
            fh.write("".join(f"{text}\n" for text in after) + (torn if torn_at_end else ""))
        jobs.append(Job(path, cursor, f"run{k}", fmt, final=final))
    together = read_many(jobs, options=options, needs=needs, lean=lean)
    for job, got in zip(jobs, together):
        if got is not None:
            alone = read(job.path, job.cursor, run=job.run, fmt=fmt, final=final, options=options, needs=needs, lean=lean)
            assert got.cursor == alone.cursor and got.span == alone.span
            assert got.problems == alone.problems and got.dead == alone.dead
            assert_frame_equal(got.frame, alone.frame)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs=logs_of(line, lines=12), **READS)
def test_json_lines_of_many_files_read_together_are_what_each_file_read_alone_gives(tmp_path_factory, logs, needs, final, lean):
    _read_together_as_alone(tmp_path_factory.mktemp("logs"), logs, fmt="jsonl", torn='{"step": 99, "lo', needs=needs, final=final, lean=lean)


def test_a_batch_too_big_for_one_file_alone_reads_what_each_file_gives(tmp_path):
    """Past 2,000 lines the JSON parser takes its fast path: the batch does, the small files alone do not."""
    jobs = []
    for k in range(30):
        path = tmp_path / f"run{k}.jsonl"
        path.write_text("".join(f'{{"step": {s}, "loss": {2.0 + (s % 7) * 0.013}, "lr": 3e-4, "grad_norm": {0.1 * k}}}\n' for s in range(100)))
        jobs.append(Job(path, Cursor(), f"run{k}", "jsonl"))
    together = read_many(jobs, options=ReadOptions())
    assert all(got is not None for got in together)
    for job, got in zip(jobs, together):
        alone = read(job.path, job.cursor, run=job.run, fmt="jsonl", final=False, options=ReadOptions())
        assert got.cursor == alone.cursor
        assert_frame_equal(got.frame, alone.frame)


@settings(max_examples=60, deadline=None)
@given(streams=st.lists(st.tuples(stream, st.lists(st.floats(0.5, 80.0), min_size=0, max_size=60)), min_size=1, max_size=5))
def test_runs_judged_and_labelled_together_are_what_judge_says_of_each(streams):
    from lossguard.detection.engine import Seen, context_of, judge, judge_runs

    rules = default_rules().rules
    runs = [f"run{k}" for k in range(len(streams))]
    windows, seen, alone = [], [], {}
    for k, ((values, deltas, before), grads) in enumerate(streams):
        mine = {"loss": _points(values, deltas), "grad_norm": _points(grads, [])}
        for m in ("eval_loss", "lr", "loss_scale"):
            mine[m] = _points([], [])
        windows.append(mine)
        seen.append(Seen(before={"loss": before}, new_from={m: int(w.get_column("step")[0]) for m, w in mine.items() if w.height}))
        found = judge(mine, context_of(pl.DataFrame(), mine), rules, run=runs[k], seen=seen[k])
        if found:
            alone[k] = found
    long = {
        m: pl.concat([w[m].select(pl.lit(k, dtype=pl.Int64).alias("run"), "step", "value", "segment") for k, w in enumerate(windows)])
        for m in ("loss", "grad_norm")
    }

    def view(k):  # noqa: ANN001, ANN202
        w = windows[k]
        return (lambda m: int(w[m].get_column("segment").max()) if w[m].height else 0), context_of(pl.DataFrame(), w)

    together = judge_runs(long, runs=runs, rules=[rules] * len(runs), seen=seen, view=view)
    assert repr(together) == repr(alone)


def _table(values: list[float], deltas: list[int], extra: list[float], tagged: bool) -> pl.DataFrame:
    """A run's lean table: loss as the points give it, an epoch mean of it and an LR (other tags of
    judged metrics), and DeepSpeed's OVERFLOW rows (a tag the labeller reads as it is)."""
    points = _points(values, deltas)
    steps = points.get_column("step").to_list()
    rows = [(s, "loss", "loss", v) for s, v in zip(steps, points.get_column("value").to_list())]
    rows += [(s, "loss", "train/loss_epoch", v) for s, v in zip(steps[::5], extra)]
    rows += [(s, "lr", "lr", 1e-4 * (1 + (i % 13))) for i, s in enumerate(steps)]
    if tagged:
        rows += [(s, "loss_scale", "OVERFLOW loss scale", 2.0 ** (16 - i)) for i, s in enumerate(steps[::7])]
    return pl.DataFrame(rows, schema={"step": pl.Int64, "metric": pl.String, "tag": pl.String, "value": pl.Float64}, orient="row")


@settings(max_examples=30, deadline=None)  # (each example judges up to 5 runs twice with every default rule: ~0.15 s)
@given(runs=st.lists(st.tuples(stream, st.lists(st.floats(0.5, 80.0), max_size=12), st.booleans()), min_size=1, max_size=5))
def test_runs_analysed_together_are_what_each_run_analysed_alone_gives(runs):
    from lossguard.detection.engine import analyse_runs

    rules = default_rules()
    frames = [_table(values, deltas, extra, tagged) for (values, deltas, _), extra, tagged in runs]
    names = [f"run{k % 2}" for k in range(len(frames))]  # names need not be unique: runs are told apart by position
    together = analyse_runs(frames, rules, runs=names)
    alone = [analyse_runs([f], rules, runs=[n])[0] for f, n in zip(frames, names)]
    assert repr([a for a, _ in together]) == repr([a for a, _ in alone])
    for (_, mine), (_, own) in zip(together, alone):
        assert repr({m: [a.tolist() for a in p] for m, p in mine.items()}) == repr({m: [a.tolist() for a in p] for m, p in own.items()})


def test_a_scan_cuts_its_runs_into_batches_in_order_within_the_bytes_a_batch_may_hold():
    from lossguard.report.audit import BATCH_BYTES, BATCH_RUNS, batches

    runs = [f"r{k:03d}" for k in range(300)]
    sizes = {r: 100_000 for r in runs} | {"r010": BATCH_BYTES * 2}
    cut = batches(runs, sizes, workers=2)
    assert [r for b in cut for r in b] == runs
    assert ["r010"] in cut  # a run bigger than a batch is a batch of its own
    assert all(len(b) <= BATCH_RUNS and (len(b) == 1 or sum(sizes[r] for r in b) <= BATCH_BYTES) for b in cut)
    assert len(batches(runs[20:36], sizes, workers=2)) == 8  # few runs: still work for every worker to share


megatron_line = st.one_of(
    st.builds(
        lambda s, loss, lr: f" iteration {s:8d}/  100000 | consumed samples: {s * 512} | learning rate: {lr:.3E} | lm loss: {loss} | loss scale: 4096.0 | grad norm: 0.95 | number of skipped iterations:   0 |",
        st.integers(0, 10**6), st.floats(allow_infinity=True, allow_nan=True).map(repr), st.floats(0, 1),
    ),
    st.builds(lambda s, v: f" validation loss at iteration {s} | lm loss value: {v:.6E} | lm loss PPL: 2.4E+01 |", st.integers(0, 10**6), st.floats(0, 10)),
    st.builds(lambda a: f"[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {a}, reducing to {a // 2}", st.sampled_from([1048576, 65536, 4096])),
    st.sampled_from([
        "[default7]: iteration      300/    1200 | lm loss: 2.5E+00 | grad norm: 1.1 |",  # a launcher's prefix
        " iteration 99999999999999999999/ 10 | lm loss: 1.0 |",  # a step past Int64
        " iteration        5/    1200 | lm loss: nan | grad norm: inf | loss scale: 1.0 |",
        "using world size: 64, data-parallel size: 8",
        "> building GPT2BPETokenizer tokenizer ...",
        " iteration 7/ 10 | elapsed time per iteration (ms): 812.3 | tokens: 4096 |",  # nothing judged
        "\x00\x00",
        "",
    ]),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs=logs_of(megatron_line), **READS)
def test_megatron_logs_read_together_are_what_each_file_read_alone_gives(tmp_path_factory, logs, needs, final, lean):
    """OVERFLOW lines take the step after the iteration line before them: in a batch, only one from
    their own file may give it."""
    _read_together_as_alone(tmp_path_factory.mktemp("logs"), logs, fmt="megatron", torn=" iteration 9/ 10 | lm loss: 3.0", needs=needs, final=final, lean=lean)


kv_line = st.one_of(
    st.builds(lambda s, loss: f"iter {s}: loss {loss}, time 12.3ms, mfu 3.2%", st.integers(0, 10**6), st.floats(allow_nan=True, allow_infinity=True).map(repr)),
    st.builds(lambda s, loss: f"step {s:5d} | loss: {loss:.6f} | lr 6.0e-04 | norm: 0.512 | dt: 412.1ms", st.integers(0, 10**6), st.floats(0, 20)),
    st.builds(lambda s: f"step:{s}/20344 train_loss:2.5 train_time:123ms", st.integers(0, 10**6)),
    st.builds(lambda e: f"epoch: {e} | loss: 42.5 | lr: 0.1", st.integers(0, 50)),  # the epoch is the step only where nothing finer is
    # Steps named by a header: mmengine's (E - 1) x N + i, clu's [N], llm.c's s:N.
    st.builds(lambda e, i: f"05/12 10:36:43 - mmengine - INFO - Epoch(train)  [{e}][{i:3d}/735]  lr: 1.9870e-04  eta: 1 day, 2:03:04  loss: 2.7522", st.integers(1, 20), st.integers(1, 735)),
    st.builds(lambda s: f"I0312 10:00:00.123456 140000 logging_writer.py:48] [{s}] learning_rate=0.001, loss=3.2", st.integers(0, 10**6)),
    st.builds(lambda s: f"s:{s} trl:3.4012 lr:0.000600 norm:0.31", st.integers(0, 10**6)),
    st.sampled_from([
        "05/12 11:36:43 - mmengine - INFO - Epoch(val) [1][500/500]    loss: 2.1000  data_time: 0.0041",  # at the training's step before it
        "06/10 14:30:01 - mmengine - INFO - Iter(val) [ 50/500]    eta: 0:00:45  time: 0.1000",
        "Steps 100, Rank 0, Loss: tensor(8.4300, device='cuda:0')",
        "[2024-01-01 10:00:00] epoch: 0, step: 7, loss: [2.3456], lr: 0.001",
        "iter 8 loss=array(2.0137, dtype=float32)",
        "(TaskRunner pid=4072644) step:1 - actor/pg_loss:np.float64(0.0123) - critic/score/mean:0.5",
        "epoch 3 | nupdates 1000 | loss 4.2",
        "[Rank 0] step=10, skipped=0, lr=[9.9e-05, 9.9e-05], mom=[(0.9, 0.95)]",
        "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096, reducing to 2048",
        "validation loss: 3.2",  # no step: no record
        "at step 20 loss 3.0",
        "train.py:96 step 11 loss 2.0",
        "step 1e400 loss 2.0",  # no usable step
        "step 12 | loss: 1,234.5 | tokens: 4,096",
        "banner: training starts",
        "",
    ]),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs=logs_of(kv_line), **READS)
def test_key_value_logs_read_together_are_what_each_file_read_alone_gives(tmp_path_factory, logs, needs, final, lean):
    """Which keys are steps is chosen on a whole block (`step` if any line has one, else the
    epoch): a batch's choice holds for a file only where the file alone would choose the same."""
    _read_together_as_alone(tmp_path_factory.mktemp("logs"), logs, fmt="kv_lines", torn="step 99 | loss: 3.", needs=needs, final=final, lean=lean)


dvclive_line = st.one_of(
    # As dvclive/plots/metric.py's csv.DictWriter (tab-separated) writes them, its header first.
    # (Steps of a few values too: a metric logged again before next_step repeats its step.)
    st.builds(lambda s, v: f"{s}\t{v}", st.one_of(st.integers(0, 2), st.integers(0, 10**6)), st.floats(allow_nan=True, allow_infinity=True).map(repr)),
    st.builds(lambda t, s, v: f"{t}\t{s}\t{v}", st.integers(1_700_000_000_000, 1_800_000_000_000), st.integers(0, 10**6), st.floats(-5, 5).map(repr)),
    st.sampled_from(["step\tloss", "timestamp\tstep\tlr", "3\tnan", "4\tinf", "5\tnot a number", "six\t2.0", "1\t2\t3\t4", "", "\x00"]),
)


def _dvclive_file(tmp: Path, k: int) -> Path:
    """Runs' files as dvclive lays them out: each one's path names its metric (its rows' tag)."""
    return tmp / f"run{k}" / "dvclive" / "plots" / "metrics" / "train" / f"{('loss', 'lr', 'grad_norm', 'acc')[k % 4]}.tsv"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs=logs_of(dvclive_line), **READS)
def test_dvclive_metric_files_read_together_are_what_each_file_read_alone_gives(tmp_path_factory, logs, needs, final, lean):
    """One metric a file, named by its path: a batch gives each file's rows that file's tag."""
    tmp = tmp_path_factory.mktemp("logs")
    _read_together_as_alone(tmp, logs, fmt="dvclive", torn="7\t2.5", needs=needs, final=final, lean=lean, path_of=_dvclive_file)


def test_a_scan_of_many_dvclive_runs_reads_their_files_together(tmp_path, monkeypatch):
    """Each run's metrics come back under their own names, at their own steps, and no file is read
    on its own (reader.read costs a dozen polars queries a file: 300 runs of 3 metrics took 4 s)."""
    for k in range(6):
        for metric, value in (("loss", 2.0 + k), ("lr", 1e-3), ("grad_norm", 0.5)):
            path = tmp_path / f"run{k}" / "dvclive" / "plots" / "metrics" / "train" / f"{metric}.tsv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"step\t{metric}\n" + "".join(f"{s}\t{value}\n" for s in range(20)))
    alone = []
    real = reader_module.read
    monkeypatch.setattr(reader_module, "read", lambda *a, **k: alone.append(a[0]) or real(*a, **k))
    report = lossguard.scan(tmp_path)
    assert alone == []
    assert sorted(r["run"] for r in report.runs) == [f"run{k}" for k in range(6)]
    frame = lossguard.read(tmp_path / "run3")
    assert sorted(set(frame.get_column("tag").to_list())) == ["train/grad_norm", "train/loss", "train/lr"]
    assert frame.filter(pl.col("tag") == "train/loss").get_column("value").to_list() == [5.0] * 20


def test_a_megatron_overflow_before_its_files_first_iteration_is_read_alone(tmp_path):
    """Alone it is at step 1 (no iteration before it); in a batch the previous file's last iteration
    would place it."""
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text("".join(f" iteration {s:8d}/    1200 | lm loss: 2.0 | loss scale: 4096.0 |\n" for s in range(1, 40)))
    second.write_text(
        "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096, reducing to 2048\n"
        + "".join(f" iteration {s:8d}/    1200 | lm loss: 2.0 | loss scale: 2048.0 |\n" for s in range(1, 40))
    )
    jobs = [Job(first, Cursor(), "a", "megatron", final=True), Job(second, Cursor(), "b", "megatron", final=True)]
    together = read_many(jobs, options=ReadOptions())
    assert together[0] is not None and together[1] is None
    alone = read(second, run="b", fmt="megatron", final=True, options=ReadOptions())
    overflow = alone.frame.filter(pl.col("tag") == "OVERFLOW loss scale")
    assert overflow.select("step", "value").rows() == [(1, 2048.0)]
