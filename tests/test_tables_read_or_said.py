"""A table of metrics (CSV, JSON lines) is read whatever its dialect, or says why it was not: a
scan never calls a run clean having read nothing of it. CSV files are written by Python's csv
module with the delimiter given, and as a spreadsheet in a comma-decimal locale exports them
(LibreOffice's and Excel's `;` separator and `1,5`); W&B's chart export has the shape its web
app's "Export CSV" of a line chart writes (`Step`, then `<run> - <metric>` with its `__MIN` and
`__MAX` range columns, every field quoted: wandb/wandb#5349, #6474)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import polars as pl
import pytest

from lossguard.cli import main
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths

INF_AT, STEPS = 322, 400
"""A run that hits Inf at INF_AT."""


def _loss(step: int, shift: int = 0) -> float:
    return math.inf if step == INF_AT else 2.0 * math.exp(-step / 200) + 0.01 * ((step * 7 + shift) % 5)


def _scan(capsys, *args: str) -> tuple[int, dict]:
    code = main(["scan", *map(str, args), "--format", "json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


def _write(path: Path, rows: list[list[object]], *, delimiter: str = ",", decimal_comma: bool = False, quoting: int = csv.QUOTE_MINIMAL) -> Path:
    """Rows as the csv module writes them; with `decimal_comma`, numbers as a spreadsheet in a
    comma-decimal locale shows them (its CSV export writes the cell as shown: `2,5`, `0,001`)."""
    shown = [[str(v).replace(".", ",") if decimal_comma and isinstance(v, float) else v for v in row] for row in rows]
    with open(path, "w", newline="") as fh:
        csv.writer(fh, delimiter=delimiter, quoting=quoting).writerows(shown)
    return path


def _run_rows() -> list[list[object]]:
    return [["step", "loss", "lr"], *([s, _loss(s), 0.001] for s in range(STEPS))]


@pytest.mark.parametrize(
    ("delimiter", "decimal_comma"),
    [
        pytest.param("\t", False, id="tabs (csv.writer delimiter='\\t')"),
        pytest.param(";", True, id="spreadsheet export, comma-decimal locale"),
        pytest.param(";", False, id="semicolons, decimal points"),
        pytest.param("|", False, id="pipes"),
        pytest.param(",", False, id="commas"),
    ],
)
def test_a_csv_in_any_common_dialect_is_read_and_its_inf_found(tmp_path, capsys, delimiter, decimal_comma):
    path = _write(tmp_path / "metrics.csv", _run_rows(), delimiter=delimiter, decimal_comma=decimal_comma)
    frame, _, problems = read_paths([path])
    assert problems == []
    loss = frame.filter(pl.col("metric") == "loss").sort("step")
    assert loss.get_column("step").to_list() == list(range(STEPS))
    assert loss.get_column("value").to_list() == pytest.approx([_loss(s) for s in range(STEPS)])
    assert frame.filter(pl.col("metric") == "lr").get_column("value").unique().to_list() == [0.001]
    code, report = _scan(capsys, path, "--strict")
    assert code == 1
    assert [s["step"] for s in report["runs"][0]["spikes"]] == [INF_AT]


def test_a_comma_decimal_csv_read_in_pieces_equals_one_read(tmp_path):
    """The dialect comes from the header the cursor keeps: the daemon's later reads see no header."""
    rows = _run_rows()
    path = _write(tmp_path / "metrics.csv", rows[:100], delimiter=";", decimal_comma=True)
    options = ReadOptions()
    first = read(path, run="r", fmt="csv", final=False, options=options)
    with open(path, "a", newline="") as fh:
        csv.writer(fh, delimiter=";").writerows([[str(v).replace(".", ",") if isinstance(v, float) else v for v in row] for row in rows[100:]])
    second = read(path, first.cursor, run="r", fmt="csv", final=False, options=options)
    pieces = pl.concat([first.frame, second.frame]).select("step", "tag", "value")
    whole = read(path, Cursor(), run="r", fmt="csv", final=True, options=options).frame.select("step", "tag", "value")
    assert pieces.height == 2 * STEPS and pieces.equals(whole)


def test_a_csv_with_no_number_is_said_and_fails_strict(tmp_path, capsys):
    for run in ("good", "later"):
        (tmp_path / run).mkdir()
    _write(tmp_path / "good" / "metrics.csv", _run_rows())
    notes = _write(tmp_path / "notes.csv", [["name", "comment"], ["a", "lr sweep"], ["b", "warmup 2k"]])
    header = _write(tmp_path / "later" / "metrics.csv", [["step", "loss"]])
    code, report = _scan(capsys, tmp_path)
    assert code == 1  # the good run's Inf; the rest said
    said = {w["source"]: w["message"] for w in report["warnings"]}
    assert said[str(notes)].startswith("no metric read from this file: none of its columns holds a number")
    assert "'name,comment'" in said[str(notes)]
    assert said[str(header)] == "a header and no data row: no metric read from this file"
    code, _ = _scan(capsys, tmp_path, "--strict")
    assert code == 2


def test_a_json_lines_file_of_no_number_is_said(tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"event": e, "loss": None}) + "\n" for e in ("start", "stop")))
    code = main(["scan", str(events), "--strict", "--quiet"])
    capsys.readouterr()
    assert code == 2
    _, _, problems = read_paths([events])
    assert [(p.source, p.message) for p in problems] == [(str(events), "no metric read from this file: none of its records holds a number at a step")]


def test_a_csv_row_whose_step_is_inf_is_said_with_its_line(tmp_path, capsys):
    rows = [["step", "loss"], *([s, 2.0 - s / 100] for s in range(100))]
    rows[31][0] = math.inf  # step 30, line 32
    rows[61][0] = "nan"
    path = _write(tmp_path / "metrics.csv", rows)
    frame, _, problems = read_paths([path])
    assert sorted(frame.get_column("step").to_list()) == [s for s in range(100) if s not in (30, 60)]
    assert [(p.line, p.message) for p in problems] == [(32, "step is not a whole number from 0 to 2^63-1; this row's values are skipped (and 1 more row(s) like it)")]


def test_a_csv_header_written_again_on_resume_is_no_row_to_warn_of(tmp_path):
    """DeepSpeed's csv_monitor repeats its header when a job resumes into the same folder."""
    path = _write(tmp_path / "Train_Samples_train_loss.csv", [["step", "train_loss"], [1, 2.0], ["step", "train_loss"], [2, 1.9]])
    frame, _, problems = read_paths([path])
    assert problems == [] and frame.get_column("step").to_list() == [1, 2]


def _chart_export(path: Path, runs: list[str], metrics: list[str], *, inf_in: str) -> Path:
    """W&B's "Export CSV" of a line chart: `Step`, then per run and metric the value and its range."""
    header = ["Step"] + [f"{r} - {m}{suffix}" for r in runs for m in metrics for suffix in ("", "__MIN", "__MAX")]
    rows: list[list[object]] = [header]
    for step in range(0, 300):
        row: list[object] = [step]
        for k, run in enumerate(runs):
            for metric in metrics:
                value = 2.0 * math.exp(-step / 100) + 0.01 * ((step * 7 + k) % 5) + (0.3 if metric.startswith("eval") else 0.0) + k
                if run == inf_in and metric == "train/loss" and step == 222:
                    value = math.inf
                if metric.startswith("eval") and step % 50:
                    row += ["", "", ""]  # (eval logged every 50 steps: empty cells between)
                else:
                    row += [value, value, value]
        rows.append(row)
    return _write(path, rows, quoting=csv.QUOTE_ALL)


def test_a_wandb_chart_export_is_one_run_a_prefix_its_range_columns_not_judged(tmp_path, capsys):
    path = _chart_export(tmp_path / "wandb_export_2026-01-05T10_00_00.000+01_00.csv", ["glad-sun-12", "wild - moon-13"], ["train/loss", "eval/loss"], inf_in="wild - moon-13")
    frame, _, problems = read_paths([path])
    assert problems == []
    stem = path.stem
    assert sorted(frame.get_column("run").unique().to_list()) == [f"{stem}/glad-sun-12", f"{stem}/wild - moon-13"]
    assert sorted(frame.get_column("tag").unique().to_list()) == ["eval/loss", "train/loss"]
    for k, run in enumerate(["glad-sun-12", "wild - moon-13"]):
        mine = frame.filter(pl.col("run") == f"{stem}/{run}")
        evals = mine.filter(pl.col("tag") == "eval/loss")
        assert evals.get_column("step").to_list() == list(range(0, 300, 50))  # each run's own, not merged
        assert evals.get_column("value").to_list() == pytest.approx([2.0 * math.exp(-s / 100) + 0.01 * ((s * 7 + k) % 5) + 0.3 + k for s in range(0, 300, 50)])
        assert mine.filter(pl.col("tag") == "train/loss").height == 300
    code, report = _scan(capsys, path)
    assert code == 1
    by_run = {r["run"]: r for r in report["runs"]}
    assert by_run[f"{stem}/glad-sun-12"]["spikes"] == []
    assert [(s["step"], s["metric"]) for s in by_run[f"{stem}/wild - moon-13"]["spikes"]] == [(222, "loss")]
    assert all(r["metrics"]["loss"] == "train/loss" for r in report["runs"])
    assert not [w for r in report["runs"] for w in r["warnings"]]


def _jsonl(path: Path, broken: dict[int, str]) -> Path:
    lines = [broken.get(s, json.dumps({"step": s, "loss": 2.0 - s / 100})) for s in range(100)]
    path.write_text("\n".join(lines) + "\n")
    return path


BROKEN = {40: '{"step": 40, "loss": 1.6', 50: '{"step": 50 "loss": 1.5}', 70: '{"step": 70, "loss": }'}
"""A line cut short, a missing comma, a missing value: lines 41, 51 and 71."""


def test_malformed_json_lines_are_said_with_the_first_line_and_the_rest_read(tmp_path):
    path = _jsonl(tmp_path / "metrics.jsonl", BROKEN)
    frame, _, problems = read_paths([path])
    assert frame.get_column("step").to_list() == [s for s in range(100) if s not in BROKEN]
    assert [(p.line, p.message) for p in problems] == [(41, "not valid JSON (Expecting ',' delimiter at column 25); this line is skipped (and 2 more line(s) like it)")]


def test_malformed_json_lines_of_small_files_read_together_are_said(tmp_path, capsys):
    """Small files of a scan are parsed in one batch (readmany): a file with a refused line is
    read on its own, which says it; the others stay in the batch."""
    for k in range(3):
        (tmp_path / f"r{k}").mkdir()
        # (lines that give no row at all: a line whose step the regex misses is read alone anyway)
        _jsonl(tmp_path / f"r{k}" / "metrics.jsonl", {40: BROKEN[40], 70: BROKEN[70]} if k == 1 else {})
    code, report = _scan(capsys, tmp_path, "--strict")
    assert code == 2
    said = [(w["source"], w["line"]) for w in [*report["warnings"], *(w for r in report["runs"] for w in r["warnings"])]]
    assert said == [(str(tmp_path / "r1" / "metrics.jsonl"), 41)]
    assert [r["steps"] for r in report["runs"]] == [100, 98, 100]


def test_json_lines_read_by_their_values_or_holding_no_number_are_not_refused(tmp_path):
    """A tensor's repr printed into a JSON-looking line is read, not refused; JSON holding no
    number (an event) is no malformed line."""
    lines = [json.dumps({"step": s, "loss": 2.0}) for s in range(20)]
    lines[5] = '{"step": 5, "loss": tensor(2.0)}'
    lines[6] = '{"event": "checkpoint saved", "path": "ckpt/6"}'
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    frame, _, problems = read_paths([path])
    assert problems == [] and 5 in frame.get_column("step").to_list()
