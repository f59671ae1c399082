"""`lossguard read --format csv|json` writes the table a block at a time as it reads it, and what it
writes is byte for byte what writing the whole table at once wrote: the CSV header once, JSON lines
as `json.dumps` of each row (NaN and infinities as strings, names escaped as json.dumps does)."""

from __future__ import annotations

import io
import json
import math

import polars as pl
import pytest

from lossguard import render
from lossguard.cli import main
from lossguard.model import json_number
from lossguard.reader import read_paths
from lossguard.render import BlockWriter
from lossguard.sources import textfile

from .conftest import FIXTURES


def _one_go(frame: pl.DataFrame, fmt: str) -> str:
    """What `lossguard read` wrote before it streamed: the whole table at once."""
    if fmt == "csv":
        return frame.write_csv(float_precision=None)
    out = []
    for row in frame.iter_rows(named=True):
        row["value"] = json_number(row["value"])
        row["wall_time"] = json_number(row["wall_time"])
        out.append(json.dumps(row) + "\n")
    return "".join(out)


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("block", [None, 4096], ids=["one block a file", "4 KB blocks"])
def test_streamed_read_writes_what_the_whole_table_wrote(capsys, monkeypatch, fmt, block):
    if block:
        monkeypatch.setattr(textfile, "BLOCK", block)
        monkeypatch.setattr(render, "SLICE", 333)
    runs = FIXTURES / "runs"
    frame, _, _ = read_paths([runs])
    assert main(["read", str(runs), "--format", fmt]) == 0
    assert capsys.readouterr().out == _one_go(frame, fmt)


def test_streamed_read_filters_metrics_block_by_block(capsys, monkeypatch):
    monkeypatch.setattr(textfile, "BLOCK", 4096)
    runs = FIXTURES / "runs"
    frame, _, _ = read_paths([runs])
    main(["read", str(runs), "--format", "csv", "--metric", "lr", "--metric", "loss"])
    kept = frame.filter(pl.col("metric").is_in(["lr", "loss"]) | pl.col("tag").is_in(["lr", "loss"]))
    assert capsys.readouterr().out == _one_go(kept, "csv")
    main(["read", str(runs), "--format", "csv", "--metric", "no-such-metric"])
    assert capsys.readouterr().out == "run,source,step,metric,tag,value,wall_time\n"


@pytest.mark.parametrize(
    "value",
    [2.5, 1e-05, 1.234e-05, -3e-07, 5e-324, 1e16, 1e15, 0.1, 1 / 3, -0.0, 0.0, 1.5e300, 9007199254740993.0, 0.0001, 0.00009999,
     math.nan, math.inf, -math.inf, None],
)
@pytest.mark.parametrize("binary", [True, False], ids=["to the bytes under stdout", "to a text stream"])
def test_json_lines_write_numbers_as_json_dumps_did(value, binary):
    frame = pl.DataFrame(
        {"run": ["r\u00e9\"x"], "source": ["a\\b\n"], "step": [7], "metric": ["loss"], "tag": ["l\u2028"], "value": [value], "wall_time": [None]},
        schema={"run": pl.String, "source": pl.String, "step": pl.Int64, "metric": pl.String, "tag": pl.String, "value": pl.Float64, "wall_time": pl.Float64},
    )
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8") if binary else io.StringIO()
    writer = BlockWriter("json", out)
    writer.write(frame)
    writer.close()
    out.flush()
    written = out.buffer.getvalue().decode() if binary else out.getvalue()
    assert written == _one_go(frame, "json")


def test_a_log_with_no_readable_rows_writes_nothing_and_fails(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text("not json at all\n")
    assert main(["read", str(log), "--format", "csv"]) == 2
    assert capsys.readouterr().out == ""
