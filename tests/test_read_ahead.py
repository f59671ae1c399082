"""A line format reads the next block while this one parses (formats/ahead.py): what a read returns
(rows, cursor, problems in file order) is what a plain loop over the blocks returned, a failure
surfaces where the loop met it, and no thread outlives a read, however it ends."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.formats import base
from lossguard.ingest.formats.ahead import read_ahead
from lossguard.ingest.formats.kvlines import KV_LINES
from lossguard.ingest.formats.megatron import MEGATRON
from lossguard.ingest.sources import textfile

AHEAD = "lossguard-read-ahead"


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(AHEAD)]


def _plain_loop(items, prepare, *, worth_it):
    """What LineFormat.read did before it read ahead: each block prepared when the loop gets to it."""
    return (prepare(item) for item in items)


@pytest.mark.parametrize("worth_it", [True, False], ids=["read ahead", "one block: no thread"])
def test_read_ahead_prepares_every_item_in_order_and_never_two_at_once(worth_it):
    busy = threading.Lock()
    seen: list[int] = []

    def items():
        for i in range(20):
            assert busy.acquire(blocking=False), "the iterator ran while an item was being prepared"
            busy.release()
            yield i

    def prepare(i: int) -> int:
        assert busy.acquire(blocking=False), "two items prepared at once"
        try:
            seen.append(i)
            return i * i
        finally:
            busy.release()

    assert list(read_ahead(items(), prepare, worth_it=lambda _: worth_it)) == [i * i for i in range(20)]
    assert seen == list(range(20))
    assert not _ahead_threads()


def test_an_error_preparing_a_later_item_is_raised_after_the_earlier_ones_are_taken():
    def prepare(i: int) -> int:
        if i == 3:
            raise OSError("disk went away")
        return i

    got = []
    with pytest.raises(OSError, match="disk went away"):
        for item in read_ahead(iter(range(10)), prepare, worth_it=lambda _: True):
            got.append(item)
    assert got == [0, 1, 2]
    assert not _ahead_threads()


def _many_blocks(tmp_path: Path, lines: int = 3000) -> Path:
    path = tmp_path / "train.log"
    path.write_text("".join(f"step {i} | loss: {2 + 1 / (i + 1):.6f} | lr 3.0e-04 | norm: 1.{i % 97:02d}\n" for i in range(1, lines + 1)))
    return path


def test_a_read_in_many_blocks_reads_ahead_and_leaves_no_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(textfile, "BLOCK", 8192)
    path = _many_blocks(tmp_path)
    threads_while_parsing = []
    parse = KV_LINES.parse

    def watched(*args, **kwargs):
        threads_while_parsing.append(len(_ahead_threads()))
        return parse(*args, **kwargs)

    res = base.LineFormat(KV_LINES.name, watched, prefilter=KV_LINES.prefilter).read(path, Cursor(), final=True)
    assert max(threads_while_parsing) == 1 and len(threads_while_parsing) > 10
    assert not _ahead_threads()
    assert res.rows.filter(pl.col("tag") == "loss").height == 3000


def test_a_small_read_starts_no_thread(tmp_path):
    path = _many_blocks(tmp_path, lines=50)
    started = []
    parse = KV_LINES.parse

    def watched(*args, **kwargs):
        started.append(len(_ahead_threads()))
        return parse(*args, **kwargs)

    base.LineFormat(KV_LINES.name, watched, prefilter=KV_LINES.prefilter).read(path, Cursor(), final=True)
    assert started == [0]


@pytest.mark.parametrize("where", ["parse", "each"])
def test_a_failure_mid_read_is_raised_and_leaves_no_thread(tmp_path, monkeypatch, where):
    monkeypatch.setattr(textfile, "BLOCK", 8192)
    monkeypatch.setattr(textfile, "STREAMED_BLOCK", 8192)
    path = _many_blocks(tmp_path)
    calls = []
    parse = KV_LINES.parse

    def failing(*args, **kwargs):
        calls.append(1)
        if where == "parse" and len(calls) == 3:
            raise RuntimeError("parser broke")
        return parse(*args, **kwargs)

    def each(rows: pl.DataFrame) -> None:
        if where == "each" and len(calls) == 3:
            raise RuntimeError("sink broke")

    fmt = base.LineFormat(KV_LINES.name, failing, prefilter=KV_LINES.prefilter)
    with pytest.raises(RuntimeError, match="broke"):
        fmt.read(path, Cursor(), final=True, each=each)
    assert len(calls) == 3
    assert not _ahead_threads()


_NOISE = [b"", b"\xff\xfe not utf-8\n", b"\x00\x00\x00\n", b"x" * 3000 + b"\n", b"banner line\n"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reader=st.sampled_from(["kv", "megatron"]),
    noise=st.lists(st.tuples(st.integers(0, 400), st.sampled_from(_NOISE)), max_size=6),
    block=st.sampled_from([2048, 4096, 16384]),
    final=st.booleans(),
    limit=st.one_of(st.none(), st.integers(3000, 60000)),
    streamed=st.booleans(),
)
def test_reading_ahead_returns_what_the_plain_loop_returned(tmp_path, monkeypatch, reader, noise, block, final, limit, streamed):
    """Rows, cursor and problems (in file order: a line too long, bytes not UTF-8, binary damage)."""
    monkeypatch.setattr(textfile, "BLOCK", block)
    monkeypatch.setattr(textfile, "STREAMED_BLOCK", block)
    monkeypatch.setattr(textfile, "MAX_LINE", 2500)
    if reader == "kv":
        fmt = KV_LINES
        lines = [f"step {i} | loss: {2 + 1 / i:.6f} | lr 3.0e-04 | norm: 1.{i % 97:02d} | dt: {i % 7}.5ms\n".encode() for i in range(1, 401)]
    else:
        fmt = MEGATRON
        lines = [
            f" iteration {i:8d}/  100000 | learning rate: 1.5E-04 | lm loss: {2 + 1 / i:.6E} | loss scale: 4096.0 | grad norm: 0.{i % 89:02d} |\n".encode()
            for i in range(1, 401)
        ]
    for at, extra in sorted(noise, reverse=True):
        lines.insert(at, extra)
    path = tmp_path / "train.log"
    path.write_bytes(b"".join(lines) + b"step 401 | loss: 1.5")  # an unterminated last line

    def read():
        sunk: list[pl.DataFrame] = []
        res = fmt.read(path, Cursor(), final=final, limit=limit, each=sunk.append if streamed else None, keep=lambda t: t != "lr")
        return (pl.concat(sunk) if sunk else res.rows), res

    ahead_rows, ahead = read()
    with monkeypatch.context() as plain:
        plain.setattr(base, "read_ahead", _plain_loop)
        loop_rows, loop = read()
    assert ahead_rows.equals(loop_rows)
    assert (ahead.cursor, ahead.problems, ahead.span) == (loop.cursor, loop.problems, loop.span)
    assert not _ahead_threads()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.one_of(st.integers(0, 300), st.integers(600, 900)), max_size=40),
    tail=st.one_of(st.integers(0, 300), st.integers(600, 900)),
    block=st.integers(16, 1500),
    final=st.booleans(),
)
def test_blocks_number_every_line_they_hold_and_skip_only_the_overlong(tmp_path, lines, tail, block, final):
    """Whatever the block size: each line is in one block, at its line number in the file, each
    block's newline count is what it holds, and only lines over MAX_LINE are left out, one problem each."""
    max_line = 500
    texts = [b"%d:" % i + b"x" * n for i, n in enumerate(lines)]
    last = b"t" * tail
    path = tmp_path / "log"
    path.write_bytes(b"".join(t + b"\n" for t in texts) + last)
    problems: list = []
    got: dict[int, bytes] = {}
    for b in textfile.iter_blocks(path, Cursor(), final=final, problems=problems, block=block, max_line=max_line):
        assert b.newlines == b.data.count(b"\n")
        for k, text in enumerate(b.data.split(b"\n")[:-1]):
            assert b.first_line + k not in got
            got[b.first_line + k] = text
    # A line over MAX_LINE is skipped once the reader has buffered that much of it without its end:
    # one whose newline comes in the same read may still be kept.
    lines_in = {k + 1: t for k, t in enumerate(texts)}
    if final and tail:
        lines_in[len(texts) + 1] = last
    for k, t in lines_in.items():
        if len(t) < max_line:
            assert got[k] == t
        elif len(t) > max_line + block:
            assert k not in got
    assert set(got) <= set(lines_in) and all(got[k] == lines_in[k] for k in got)
    skipped = [k for k, t in enumerate(texts, 1) if k not in got] + ([len(texts) + 1] if tail > max_line and len(texts) + 1 not in got else [])
    assert [p.line for p in problems] == skipped
