"""Columns of bare numbers under a header of names, apart by blanks: what a training script prints
when it writes its own log (`print(f"{'step':>6} {'loss':>10} {'lr':>10}")`, then a row a step), or
saves with numpy's `savetxt(..., header=...)` without its comment mark. Such a file is read as a
table (csvlog's aligned dialect) whatever its suffix, once its header names a step or a metric
lossguard judges and its first rows are numbers in as many columns."""

from __future__ import annotations

import json
import math

import pytest

from lossguard.ingest.formats.sniff import format_of
from lossguard.ingest.reader import ReadOptions, read

from .conftest import run_lossguard

SPIKE = 70


def _loss(step: int) -> float:
    return 8.0 if step == SPIKE else 2.5 - step * 0.004 + (step % 3) * 0.01


def _script_log(steps: int = 100, *, extra: dict[int, str] | None = None) -> str:
    """As a training loop prints it: a padded header, then one padded row a step."""
    lines = [f"{'step':>6} {'loss':>10} {'lr':>10} {'grad_norm':>10}"]
    for step in range(1, steps + 1):
        lines.append(f"{step:>6d} {_loss(step):>10.4f} {3e-4:>10.2e} {1.0 + (step % 4) * 0.05:>10.3f}")
        if extra and step in extra:
            lines.append(extra[step])
    return "\n".join(lines) + "\n"


def test_a_scripts_aligned_table_is_read_at_its_step_column_and_its_spike_found(tmp_path):
    log = tmp_path / "run7" / "train_log.txt"
    log.parent.mkdir()
    log.write_text(_script_log())
    res = run_lossguard("scan", str(tmp_path), "--format", "json")
    assert res.returncode == 1, res.stderr
    (run,) = json.loads(res.stdout)["runs"]
    assert run["metrics"] == {"loss": "loss", "lr": "lr", "grad_norm": "grad_norm"}
    assert (run["first_step"], run["last_step"], run["steps"]) == (1, 100, 100)
    assert [s["step"] for s in run["spikes"] if s["rule"] == "loss-spike"] == [SPIKE]


def test_a_tab_separated_table_under_a_log_name_is_read(tmp_path):
    log = tmp_path / "metrics.log"
    rows = "".join(f"{i * 10}\t{_loss(i):.5f}\t{'nan' if i == 90 else '0.001'}\n" for i in range(1, 101))
    log.write_text("iteration\tloss\tlr\n" + rows)
    res = read(log, run="r", fmt=format_of(log), final=True, options=ReadOptions())
    loss = res.frame.filter(metric="loss").sort("step")
    assert loss.get_column("step").to_list() == list(range(10, 1001, 10))
    assert math.isnan(res.frame.filter(metric="lr", step=900).item(0, "value"))


def test_lines_of_text_among_the_rows_cost_those_lines_in_one_warning(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(_script_log(extra={30: "saving checkpoint to ckpt-30.pt", 60: "saving checkpoint to ckpt-60.pt"}))
    res = run_lossguard("scan", str(log), "--format", "json")
    assert res.returncode == 1, res.stderr
    (run,) = json.loads(res.stdout)["runs"]
    assert run["steps"] == 100 and [s["step"] for s in run["spikes"] if s["rule"] == "loss-spike"] == [SPIKE]
    said = [line for line in res.stderr.splitlines() if "train.log" in line]
    assert len(said) == 1 and "train.log:32:" in said[0] and "1 more" in said[0], res.stderr


def test_the_header_written_again_is_no_row(tmp_path):
    log = tmp_path / "train_log.txt"
    text = _script_log()
    header = text.splitlines()[0]
    log.write_text(text + header + "\n" + "".join(f"{s:>6d} {2.1:>10.4f} {3e-4:>10.2e} {1.0:>10.3f}\n" for s in range(101, 121)))
    res = read(log, run="r", fmt=format_of(log), final=True, options=ReadOptions())
    assert res.problems == ()
    assert res.frame.filter(metric="loss").height == 120


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Loading the training data\n1 2 3 4\n5 6 7 8\n", id="words that name no metric"),
        pytest.param("step loss lr\nstarting the first epoch now\nstep 1 done\n", id="a header over words"),
        pytest.param("step loss lr\n1 2.5\n2 2.4\n", id="rows narrower than the header"),
        pytest.param("step loss lr\n", id="a header alone"),
        pytest.param("step: 1, loss: 2.5\n", id="one line of pairs"),
    ],
)
def test_text_that_only_looks_like_a_table_is_not_read_as_one(tmp_path, text):
    log = tmp_path / "notes.txt"
    log.write_text(text)
    assert format_of(log) != "csv"
