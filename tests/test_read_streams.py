"""`lossguard read --format csv|json` writes the table a block at a time as it reads it, and what it
writes is byte for byte what writing the whole table at once wrote: the CSV header once, JSON lines
as `json.dumps` of each row (NaN and infinities as strings, names escaped as json.dumps does)."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import threading

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossguard.cli import main
from lossguard.escaping import printable
from lossguard.model import json_number
from lossguard.ingest.reader import read_paths
from lossguard.report.rows import BlockWriter
from lossguard.ingest.sources import textfile
from lossguard.ingest.table import SCHEMA

from .conftest import FIXTURES


def _one_go(frame: pl.DataFrame, fmt: str) -> str:
    """What `lossguard read` wrote before it streamed: the whole table at once (in CSV, which has
    no escapes of its own, names with their control characters shown as the table shows them)."""
    if fmt == "csv":
        names = [pl.col(c).map_elements(printable, return_dtype=pl.String()) for c in ("run", "source", "metric", "tag")]
        return frame.with_columns(names).write_csv(float_precision=None)
    out = []
    for row in frame.iter_rows(named=True):
        row["value"] = json_number(row["value"])
        row["wall_time"] = json_number(row["wall_time"])
        out.append(json.dumps(row) + "\n")
    return "".join(out)


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("block", [None, 16384], ids=["one block a file", "16 KB blocks"])
def test_streamed_read_writes_what_the_whole_table_wrote(capsys, monkeypatch, fmt, block):
    if block:
        monkeypatch.setattr(textfile, "BLOCK", block)
        monkeypatch.setattr("lossguard.report.rows.SLICE", 333)
    runs = FIXTURES / "runs"
    frame, _, _ = read_paths([runs])
    assert main(["read", str(runs), "--format", fmt]) == 0
    assert capsys.readouterr().out == _one_go(frame, fmt)


def test_streamed_read_filters_metrics_block_by_block(capsys, monkeypatch):
    monkeypatch.setattr(textfile, "BLOCK", 16384)
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


HOSTILE = ["r\u00e9\"x", "a,b", 'say "hi"', "new\nline", "cr\rlf", "\x1b[2J", "tab\there", "l\u2028s", "", " lead", "back\\slash", "\x00nul"]
"""Names from disk that each output's own quoting must carry exactly (Linux allows them all)."""


def _table(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def _written(frames: list[pl.DataFrame], fmt: str, *, binary: bool, behind: bool) -> str:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="") if binary else io.StringIO()
    with BlockWriter(fmt, out, behind=behind) as writer:
        for frame in frames:
            writer.write(frame)
        writer.close()
    out.flush()
    return out.buffer.getvalue().decode() if binary else out.getvalue()


WAYS = [
    pytest.param(True, False, id="to the bytes under stdout"),
    pytest.param(False, False, id="to a text stream"),
    pytest.param(True, True, id="on the writer's thread"),
]


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize(("binary", "behind"), WAYS)
def test_hostile_run_source_and_tag_names_are_escaped_as_the_whole_table_wrote_them(fmt, binary, behind):
    # Each name as run, as source and as metric and tag; a file with wall times and one without.
    rows = []
    for i, name in enumerate(HOSTILE):
        rows += [(name, f"{name}/metrics.jsonl", i, "loss", name, 1.5, None), (name, f"{name}/metrics.jsonl", i, name, "x", -2.0, None)]
        rows += [("run", name, i, name, name, 0.25, 1.7e9 + i), ("run", name, i + 1, "lr", "lr", 3e-05, None)]
    frame = _table(rows)
    expected = _one_go(frame, fmt)
    # The whole table at once (stretches of one run and source) and one file's rows at a time.
    assert _written([frame], fmt, binary=binary, behind=behind) == expected
    assert _written(frame.partition_by("run", "source", maintain_order=True), fmt, binary=binary, behind=behind) == expected


def test_hostile_names_from_real_files_reach_json_exactly_and_csv_as_the_table_shows_them(tmp_path, capsys):
    run = tmp_path / 'run,"q"\n\x1b[2J \u00e9'
    run.mkdir()
    (run / "metrics.csv").write_text('step,"lo,ss","gr""ad\nnorm",lr\n1,1.5,0.2,0.1\n2,1.6,0.3,1e-6\n')
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 2.0 / i, "tab\tbed": 1e-5 * i, "grad norm": math.nan if i == 2 else 0.5}) + "\n" for i in range(1, 6)))
    frame, _, problems = read_paths([tmp_path])
    assert not problems
    assert {"lo,ss", 'gr""ad\nnorm'} <= set(frame.get_column("tag").to_list())
    for fmt in ("csv", "json"):
        assert main(["read", str(tmp_path), "--format", fmt]) == 0
        assert capsys.readouterr().out == _one_go(frame, fmt)


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200)
@given(values=st.lists(st.one_of(finite, st.floats(), st.none(), st.sampled_from([1e-4, 1e16, 5e-324, -0.0])), min_size=1, max_size=30), timed=st.booleans())
def test_json_lines_write_any_float_as_json_dumps_did(values, timed):
    frame = _table([("r", "s", i, "loss", "loss", v, (1.7e9 + v if v is not None and math.isfinite(v) else v) if timed else None) for i, v in enumerate(values)])
    assert _written([frame], "json", binary=True, behind=False) == _one_go(frame, "json")
    assert _written([frame], "csv", binary=True, behind=False) == _one_go(frame, "csv")


@pytest.mark.parametrize("behind", [True, False], ids=["on the writer's thread", "in the reading thread"])
def test_a_closed_output_is_raised_as_a_broken_pipe_and_stops_the_writers_thread(behind):
    read_end, write_end = os.pipe()
    os.close(read_end)
    frame = _table([("r", "s", i, "loss", "loss", 1.0, None) for i in range(1000)])
    with open(write_end, "w", encoding="utf-8") as out:
        with pytest.raises(BrokenPipeError), BlockWriter("csv", out, behind=behind) as writer:
            for _ in range(100):
                writer.write(frame)
            writer.close()
        assert not [t for t in threading.enumerate() if t.name == "lossguard-read-writer"]
        out.buffer.raw.close()  # nothing left to flush into the closed pipe


def test_read_piped_into_head_exits_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "lossguard", "read", str(FIXTURES / "runs"), "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(100)
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert first.startswith(b'{"run": ')
    assert proc.stderr.read() == b""


def test_an_output_that_fails_stops_the_read_and_is_not_blamed_on_the_file(tmp_path):
    from lossguard.ingest.reader import read_paths

    for k in range(3):
        (tmp_path / f"r{k}").mkdir()
        (tmp_path / f"r{k}" / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "loss": 2.0}}\n' for i in range(50)))
    handed = []

    def each(rows: pl.DataFrame) -> None:
        handed.append(rows.height)
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        read_paths([tmp_path], each=each)
    assert handed == [50]  # the other files are not opened, each to fail on the same closed pipe


def test_an_event_file_streams_a_chunk_at_a_time_and_projects_as_it_decodes(tmp_path, monkeypatch):
    from lossguard.detection.engine import SCAN_NEEDS
    from lossguard.ingest.formats import tfevents
    from lossguard.ingest.reader import ReadOptions, read

    from .writers import write_tb1

    points = [(s, tag, 2.0 + (s % 13) / 100) for s in range(1, 400) for tag in ("train/loss", "lr", "eval/accuracy", "gpu/temperature")]
    path = write_tb1(tmp_path / "run", points)
    whole = read(path, run="r", fmt="tfevents", final=True, options=ReadOptions())
    monkeypatch.setattr(tfevents, "CHUNK", 4096)
    handed: list[pl.DataFrame] = []
    streamed = read(path, run="r", fmt="tfevents", final=True, options=ReadOptions(), each=handed.append)
    assert len(handed) > 5 and not streamed.frame.height  # a chunk's rows at a time, none held back
    assert pl.concat(handed).equals(whole.frame)
    assert streamed.cursor == whole.cursor and streamed.span == whole.span
    projected = read(path, run="r", fmt="tfevents", final=True, options=ReadOptions(), needs=SCAN_NEEDS)
    assert projected.frame.equals(whole.frame.filter(pl.col("tag").is_in(["train/loss", "lr"])))
    assert projected.span == whole.span == (1, 399)
