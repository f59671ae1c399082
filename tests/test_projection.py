"""A read told what its caller needs (scan's projection) gives exactly the rows of the full read that
the caller looks at, and says what steps all of them covered; `scan` reports the same with it."""

from __future__ import annotations

import json

import polars as pl
import pytest

from lossguard.ingest.aliases import Aliases
from lossguard.cli import main
from lossguard.ingest.cursor import Cursor
from lossguard.detection.engine import SCAN_NEEDS
from lossguard.ingest.formats.sniff import format_of
from lossguard.ingest.reader import ReadOptions, read
from lossguard.ingest.table import span_of

from .conftest import WAIT_FOR_EVERY_READ

from .test_incremental import TEXTS

OPTIONS = ReadOptions()


def _kept(frame: pl.DataFrame, options: ReadOptions = OPTIONS) -> pl.DataFrame:
    keep = SCAN_NEEDS.keeper(options.aliases)
    return frame.filter(pl.col("tag").map_elements(keep, return_dtype=pl.Boolean))


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_projected_read_is_the_full_read_less_the_tags_nobody_judges(tmp_path, name):
    fname, data = TEXTS[name]
    path = tmp_path / fname
    path.write_bytes(data)
    fmt = format_of(path)
    full = read(path, run="r", fmt=fmt, final=True, options=OPTIONS)
    projected = read(path, run="r", fmt=fmt, final=True, options=OPTIONS, needs=SCAN_NEEDS)
    assert projected.frame.equals(_kept(full.frame))
    assert projected.span == span_of(full.frame) == full.span
    assert projected.cursor == full.cursor
    assert projected.problems == full.problems


def test_a_user_alias_keeps_its_tag_through_the_projection(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {i}, "objective/ce": {2 + i / 100}, "tokens": {i * 512}}}\n' for i in range(1, 50)))
    options = ReadOptions(aliases=Aliases.build({"loss": ["objective/ce"]}))
    res = read(path, run="r", fmt="jsonl", final=True, options=options, needs=SCAN_NEEDS)
    assert res.frame.get_column("tag").unique().to_list() == ["objective/ce"]
    assert set(res.frame.get_column("metric").to_list()) == {"loss"}
    assert read(path, run="r", fmt="jsonl", final=True, options=ReadOptions(), needs=SCAN_NEEDS).frame.height == 0


def test_scan_reports_the_steps_of_metrics_it_does_not_judge(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    lines = [f'{{"step": {i}, "loss": {2 + (i % 7) / 100}}}\n' for i in range(10, 200)]
    # Evaluation accuracy only, before the first loss and after the last: still steps the run covers.
    lines = ['{"step": 3, "eval_accuracy": 0.1}\n', *lines, '{"step": 250, "eval_accuracy": 0.5}\n']
    (run / "metrics.jsonl").write_text("".join(lines))
    only_other = tmp_path / "other"
    only_other.mkdir()
    (only_other / "metrics.csv").write_text("step,accuracy\n" + "".join(f"{i},0.5\n" for i in range(5, 40)))
    main(["scan", str(tmp_path), "--format", "json", "--quiet"])
    runs = {r["run"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert (runs["run"]["first_step"], runs["run"]["last_step"], runs["run"]["steps"]) == (3, 250, 190)
    assert (runs["other"]["first_step"], runs["other"]["last_step"], runs["other"]["metrics"]) == (5, 39, {})


def test_a_rewritten_lightning_csv_projects_only_the_rows_not_read_before(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train_loss_step\n0,1,3.0\n0,2,2.9\n")
    first = read(path, Cursor(), run="r", fmt="csv", final=False, options=OPTIONS, needs=SCAN_NEEDS)
    assert first.frame.select("step", "metric").rows() == [(1, "loss"), (2, "loss")] and first.span == (1, 2)
    # Rewritten wider: rows 1 and 2 again, then new ones; one holds nothing scan judges, at a later step.
    path.write_text("epoch,step,train_loss_step,val_loss\n0,1,3.0,\n0,2,2.9,\n0,3,2.8,\n0,3,,2.7\n1,9,,\n")
    full = read(path, first.cursor, run="r", fmt="csv", final=False, options=OPTIONS)
    second = read(path, first.cursor, run="r", fmt="csv", final=False, options=OPTIONS, needs=SCAN_NEEDS)
    assert second.frame.equals(_kept(full.frame))
    assert second.frame.select("step", "metric", "value").rows() == [(3, "loss", 2.8), (3, "eval_loss", 2.7)]
    assert second.span == full.span == (3, 9)
    assert second.cursor == full.cursor and second.problems == full.problems


def test_the_daemon_builds_rows_only_for_what_it_judges_and_the_rest_still_moves_the_run_on(tmp_path):
    from lossguard.watch.follow import Follower
    from lossguard.detection.rules import default_rules
    from lossguard.state import State

    log = tmp_path / "runs" / "exp" / "metrics.csv"
    log.parent.mkdir(parents=True)
    log.write_text("epoch,step,train_loss,lr-AdamW,val_acc,tokens\n" + "".join(f"0,{i},{2 + (i % 7) / 100},0.0003,,{i * 512}\n" for i in range(1, 101)))
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    report = follower.run_pass(1.0)
    assert report.rows == 200  # loss and LR of 100 steps; not the epoch, tokens or accuracy
    with open(log, "a") as fh:
        fh.write("0,150,,,0.71,\n")  # an evaluation only: no row anything judges, yet the run went on
    report = follower.run_pass(2.0)
    assert report.rows == 0
    assert state.db.execute("SELECT last_step FROM runs").fetchall() == [(150,)]
    state.close()
