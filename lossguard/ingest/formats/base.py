"""What every format reader shares: the result type, the driver for line-oriented formats, and
`Format`, what each format module declares of itself for the registry (formats/__init__.py).

A reader never raises for bad content: it returns the rows it could read, a cursor just past the
complete data it consumed, and Problems naming the file and line. `dead` marks a file that can not be
read further without guessing (a corrupt record length), so callers stop reopening it in a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Protocol

import numpy as np
import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources import textfile
from ..sources.textfile import STREAMED_BLOCK, TextBlock, iter_blocks, not_utf8
from .ahead import read_ahead


@dataclass(frozen=True)
class Parsed:
    rows: pl.DataFrame
    """Raw rows (step, tag, value, wall_time), in file order."""
    cursor: Cursor
    problems: tuple[Problem, ...] = ()
    dead: bool = False
    span: table.Span | None = None
    """With a projection (`keep`), the steps every row would have covered, kept or not."""
    projected: bool = False
    """`rows` hold only the tags `keep` kept (and `span` says what all of them covered)."""


NAMED_RAW = {**table.RAW_SCHEMA, "run": pl.String()}
"""A parser's raw rows when its file names each row's run (table.finish)."""


def no_rows(source: str, cursor: Cursor, problem: str, *, dead: bool) -> Parsed:
    """A read of a file naming its rows' runs that got nothing: the `run` column all the same (a
    file that names its runs gives it on every frame, empty ones too, table.finish)."""
    return Parsed(pl.DataFrame(schema=NAMED_RAW), cursor, (Problem(source, problem),), dead=dead)


Keep = Callable[[str], bool]
"""A projection: tag -> does the caller need its rows (needs.Needs.keeper)."""
Sink = Callable[[pl.DataFrame], None]
"""Takes a read's rows a block at a time, as the blocks are read (`lossguard read` writes them out)."""


@dataclass(frozen=True)
class Together:
    """What lets the lines of many files be parsed in one call (lossguard.ingest.readmany), where a parse's
    fixed cost, a few dozen polars queries, is most of a small file's read."""

    marks: Callable[[pl.DataFrame], pl.DataFrame]
    """A batch's lines worth parsing (`line_no`, `text`, and `file`: which of the batch's files each
    is from) -> a row per line: `alone`, true where the line's rows depend on lines before it in its
    file, or on the cursor, in a way the batch can not keep apart (its file is then read on its own);
    optionally `record`, whether the line's rows count as a record of the cursor's `index` (else
    every line with rows does), and `last_step`, the step the line leaves its file's cursor at, null
    where it leaves it as it was (else the step of the file's last row does). Any other column goes
    to `parse` with the lines, in their order: what a parser and its marks both need, found once."""
    settles: Callable[[Cursor, Cursor, bool], dict[str, object] | None] | None = None
    """For a parser whose choices are made on a whole block (kv_lines: which keys are steps): given a
    file's cursor before, the cursor the batch's parse ended at and whether the file got rows, the
    other cursor fields reading the file alone would set, or None when the batch can not tell (the
    file is then read on its own). None: the parser sets none."""
    repeats: bool = False
    """Whether the parser says once of a file that its rows repeat a step (Cursor.steps REPEATS): a
    file whose rows do, not said yet, is then read on its own."""


@dataclass(frozen=True)
class LineFormat:
    """A format whose records are lines. `parse` turns a frame of lines (columns `line_no`, `text`) and
    the cursor into raw rows plus the cursor fields it changed (index, last_step). It also gets the
    block's bytes when the frame holds every line of them (nothing was filtered out), for parsers
    that can cut fields straight from the bytes."""

    name: str
    parse: Callable[[pl.DataFrame, Cursor, bytes | None], tuple[pl.DataFrame, Cursor]]
    prefilter: str | None = None
    """A regex a line must match to be worth parsing; cuts the regex work on noisy logs."""
    narrows: bool = False
    """`parse` takes the projection (`keep=`) and may leave out rows of tags it does not keep, never
    all of a record's: what the rows say of the read (its span, its records, lines left unplaced)
    is the same, and the rest are filtered out here anyway."""
    together: Together | None = None
    """How lines of many files are parsed in one call; None: each file is read on its own."""
    carriage: bool = False
    """A carriage return ends a record too (textfile.iter_blocks): progress bars, whose line holds
    every redraw of a bar and ends only when the bar's loop does, are read as they are drawn."""
    refused: Callable[[pl.DataFrame, pl.DataFrame], list[tuple[int, str]]] | None = None
    """The lines that gave no placed row because the format's own syntax refuses them (a JSON line
    cut short or mistyped), each with why (`not valid JSON (...)`): (the lines parsed, the rows they gave, with `line_no`)
    -> (line_no, reason). Said once a read, as a step that is no number is; None: the format has no
    syntax of its own to hold a line to."""

    streams = True
    """`each` takes the rows of each block as it is read (reader.read)."""
    projects = True
    """`keep` leaves out the rows of unneeded tags block by block, so they are never gathered."""

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None, each: Sink | None = None, keep: Keep | None = None) -> Parsed:
        problems: list[Problem] = []
        frames: list[pl.DataFrame] = []
        spans: list[table.Span | None] = []
        source = str(path)
        start = cursor
        warned = False
        unplaced, first_unplaced = 0, None
        refused, first_refused = 0, None
        binary, first_binary = 0, None
        size = STREAMED_BLOCK if each is not None else None
        # What the blocks' reading says (a line too long) is said in file order, before the block read
        # after it: the next block is read while this one parses (read_ahead).
        said: list[Problem] = []
        blocks = iter_blocks(path, cursor, final=final, problems=said, limit=limit, block=size, carriage=self.carriage)
        told = 0

        def prepare(block: TextBlock) -> _Lines:
            nonlocal told
            found, told = said[told:], len(said)
            return _Lines.of(block, self.prefilter, source=source, found=found)

        def worth_it(first: _Lines) -> bool:
            # A full first block, and more allowed: more blocks are likely (a daemon's pass reads
            # a few new lines, and pays for no thread).
            room = limit is None or first.block.cursor.offset - cursor.offset < limit
            return room and len(first.block.data) >= min(size or textfile.BLOCK, textfile.BLOCK) // 2

        with closing(read_ahead(blocks, prepare, worth_it=worth_it)) as prepared:
            for ready in prepared:
                block = ready.block
                problems.extend(ready.found)
                if ready.problem and not warned:
                    problems.append(ready.problem)
                    warned = True
                if ready.binary:
                    binary += ready.binary
                    first_binary = first_binary if first_binary is not None else ready.first_binary
                rows, state = self.parse(ready.kept, cursor, ready.raw, keep=keep) if self.narrows and keep is not None else self.parse(ready.kept, cursor, ready.raw)
                if "line_no" in rows.columns:
                    if self.refused is not None and (bad := self.refused(ready.kept, rows)):
                        refused += len(bad)
                        first_refused = first_refused or bad[0]
                        rows = rows.filter(~pl.col("line_no").is_in([n for n, _ in bad]))
                    if rows.get_column("step").null_count():
                        lost = rows.filter(pl.col("step").is_null()).get_column("line_no").unique()
                        unplaced += lost.len()
                        first_unplaced = first_unplaced if first_unplaced is not None else int(lost.min())
                        rows = rows.filter(pl.col("step").is_not_null())
                    rows = rows.drop("line_no")
                if keep is not None and rows.height:
                    spans.append(table.span_of(rows))
                    rows = kept_rows(rows, keep)
                if rows.height:
                    each(rows) if each is not None else frames.append(rows)
                # Where the block ends is the block's; what the parser carries on (its last step, its
                # own state) is the parser's.
                cursor = state.advance(offset=block.cursor.offset, line=block.cursor.line, skipping=block.cursor.skipping)
        problems.extend(said[told:])
        # Relaxed: a block's tags may be Categorical (fast paths) or String (a parser's odd rows).
        rows = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed", rechunk=False) if frames else table.empty_raw()
        note = STEP_FALLBACKS.get(cursor.steps) if cursor.steps != start.steps else None
        if note:
            problems.append(Problem(source, note))
        if binary:
            # A crashed node's file system can leave a run of NULs where a write was lost; what
            # follows is still the log. Once a read, as for the lines below.
            more = f" (and {binary - 1:,} more line(s) like it)" if binary > 1 else ""
            problems.append(Problem(source, f"NUL or other binary bytes in a text log; this line is skipped{more}, the rest of the file is read", line=first_binary))
        if first_refused is not None:
            more = f" (and {refused - 1:,} more line(s) like it)" if refused > 1 else ""
            line, why = first_refused
            problems.append(Problem(source, f"{why}; this line is skipped{more}", line=line))
        if unplaced:
            # One summary per read, not a warning per line: a log can hold millions of them.
            more = f" (and {unplaced - 1:,} more line(s) like it)" if unplaced > 1 else ""
            problems.append(Problem(source, f"step is not a whole number from 0 to 2^63-1; this line's values are skipped{more}", line=first_unplaced))
        return Parsed(rows, cursor, tuple(problems), span=table.joined(spans), projected=keep is not None)


@dataclass(frozen=True)
class _Lines:
    """A block made ready to parse: what of it needs no cursor (read_ahead does it for the next
    block while this one parses)."""

    block: TextBlock
    kept: pl.DataFrame
    """The lines worth parsing (not binary, passing the prefilter)."""
    raw: bytes | None
    """The block's bytes, when `kept` holds every line of them."""
    problem: Problem | None
    """Bytes that are not UTF-8 (the first such line)."""
    binary: int
    first_binary: int | None
    found: list[Problem]
    """What reading the block said before it (iter_blocks: a line too long)."""

    @classmethod
    def of(cls, block: TextBlock, prefilter: str | None, *, source: str, found: list[Problem]) -> _Lines:
        lines, problem = split_lines(block.data, block.first_line, source=source)
        text, binary, first_binary = lines, 0, None
        bad = binary_lines(block.data, lines, newlines=block.newlines)
        if bad is not None:
            binary = int(bad.sum())
            first_binary = int(lines.filter(bad).item(0, "line_no"))
            text = lines.filter(~bad)
        coloured = b"\x1b" in block.data
        if coloured:  # (rich, colorlog, torchtitan's console: the words between the colours are read)
            text = text.with_columns(pl.col("text").str.replace_all(ANSI, ""))
        kept = text.filter(pl.col("text").str.contains(prefilter)) if prefilter else text
        raw = block.data if kept.height == lines.height and problem is None and not coloured else None
        return cls(block, kept, raw, problem, binary, first_binary, found)


def kept_rows(rows: pl.DataFrame, keep: Keep) -> pl.DataFrame:
    """The raw rows of the tags `keep` keeps (asked once per distinct tag)."""
    tags = [t for t in rows.get_column("tag").unique().to_list() if t is not None]
    kept = [t for t in tags if keep(t)]
    return rows if len(kept) == len(tags) else rows.filter(pl.col("tag").is_in(kept))


REPEATS = "repeats"
"""Cursor.steps of a file some of whose rows are at the step of the row before them."""


def repeats(steps: np.ndarray, last: int | None) -> bool:
    """Whether a row is at the step of the row before it (`last`: the file's step before these rows)."""
    return steps.size > 0 and (bool((steps[1:] == steps[:-1]).any()) or (last is not None and int(steps[0]) == last))


STEP_FALLBACKS = {
    REPEATS: "rows at the step of the row before them in this file (a metric logged again before its step moved on: micro-batches, or DVCLive's log_metric without Live.next_step()): one value a step is judged, the last",
    "epoch": "no step finer than the epoch in this file: its epochs are the steps",
    "samples": "its Keras progress bar counts samples, not batches (Keras 1, or Keras 2 fitting arrays: `Train on N samples`): its epochs are the steps, each at the epoch's mean",
    "numbered": "no step in this file (no progress bar, no epoch with a known number of steps per epoch): its records are numbered 1, 2, 3... in file order",
}
"""What a read says, once a file, when a parser had to fall back (Cursor.steps) to a coarser step."""

LATER_WRITE_WINS = frozenset({"tfevents"})
"""Formats whose own viewer keeps only a step's later write. TensorBoard, on an event whose step is
below the most recent one, purges the earlier events of its tags at that step and after
(tensorboard/backend/event_processing/event_accumulator.py: _MaybePurgeOrphanedData,
_CheckForOutOfOrderStepAndMaybePurge): a run restarted from the checkpoint at step 200 after
logging to 266 writes 200-266 again to a new event file, and the first writes of those steps are
gone. Elsewhere (a console log resumed in place) the points before a resume stay what the run did:
the spike that crashed it is reported, ended by the resume."""


class Reader(Protocol):
    name: str

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed: ...


class BlockReader(Reader, Protocol):
    """A reader that hands out its rows block by block (`each`, when `streams`) and can leave out the
    rows of tags nobody needs while it reads (`keep`, when `projects`; `Parsed.projected`)."""

    streams: bool
    projects: bool

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None, each: Sink | None = None, keep: Keep | None = None) -> Parsed: ...


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where a tracker keeps its runs: a folder of its own name (`wandb/`, `mlruns/`, `dvclive/`)
    beside the training code's output, laid out its own way, with files no name test can place
    (an MLflow metric file is named for its metric, `loss`, and has no suffix) among copies and media
    that are not logs (W&B's `files/`, `latest-run`). Inside it, only this says what is a log; the
    run is the folder holding the tracker's folder (the one the trainer ran in), and a reader that
    knows the run's own name from the files (W&B's project and display name) gives each row's
    `run` (table.finish)."""

    folder: str
    """The tracker folder's name."""
    logs: Callable[[tuple[str, ...]], bool]
    """Whether a file is one of the format's logs, given the parts of its path below the tracker
    folder (`("run-20261201_120000-abc", "run-abc.wandb")`)."""
    skip: frozenset[str] = frozenset()
    """Folders below the tracker folder that are never entered (copies, media, artifacts, a
    `latest-run` link to a run folder that must be walked under its own name)."""
    renamed: Callable[[list[str]], int | None] | None = None
    """For a tracker whose folder may be given another name (`Live(dir="exp3")`): given the parts
    of a file's path, the index of its tracker folder by what the tracker writes in it, or None.
    Such a folder, named by the user, names the run itself."""
    keys: Callable[[tuple[str, ...]], bool] | None = None
    """Whether a folder (its path's parts below the tracker folder) holds the tracker's data named by
    the user, in which no folder name is the tracker's own or a copy's (an MLflow run's `metrics/`,
    where a key `artifacts/loss` or `.git/x` is a folder): `skip` and the folders no walk enters do
    not apply there."""
    own: Callable[[str], bool] | None = None
    """Whether a name directly in a folder of the tracker's name is the tracker's (W&B's `run-*`,
    `offline-run-*`, `latest-run`, `debug.log`); None: every name. A folder named `wandb` that is
    someone's project (`~/code/wandb/runs/...`) is then walked as any folder."""


@dataclass(frozen=True, kw_only=True)
class Format:
    """One log format, as the sniffer and the folder walk need to know it. Each format module declares
    its own, so that a new format is one module and its place in `formats.FORMATS`, whose order is
    the sniffing precedence (a line counts for the first format claiming it; a tie goes to the first)."""

    reader: Reader
    names: tuple[str, ...] = ()
    """Shell patterns (case-sensitive) of file names that settle the format whatever the content;
    a folder walk also takes such files for logs."""
    suffixes: tuple[str, ...] = ()
    """The same by suffix, in any case: a dot and no other (`.csv`)."""
    head: Callable[[Path, Callable[[], bytes]], bool] | None = None
    """For whole documents, which no line test can see: is this file ours, given its path and a
    callable returning its first few MB (read once, and only if asked). Tried before lines are counted."""
    line: Callable[[str], object] | None = None
    """Truthy when one line of a file's head is this format's: content sniffing counts them."""
    layout: Layout | None = None
    """The tracker folder whose files are this format's, whatever their names (discovery)."""
    tables: frozenset[str] | None = None
    """For a tracker's SQLite database, known by its catalogue whatever the file is called: the
    tables that make a database this format's (sniff asks the database once for all formats)."""
    names_runs: bool = False
    """Its files name the runs of their rows (a raw `run` column, table.finish): a run filter
    (`scan --run`) can judge such a file only once it is read."""

    @property
    def name(self) -> str:
        return self.reader.name

    def claims_name(self, name: str) -> bool:
        # Plain loops: asked of every file a walk lists, of every format, most of which claim no
        # name at all, where building a generator for any() would be most of the cost.
        for pattern in self.names:
            if fnmatchcase(name, pattern):
                return True
        for suffix in self.suffixes:
            # As Path.suffix reads it: a name that is only the suffix (`.csv`) is a hidden file's.
            if len(name) > len(suffix) and name.lower().endswith(suffix):
                return True
        return False


def binary_lines(data: bytes, lines: pl.DataFrame, *, newlines: int | None = None) -> pl.Series | None:
    """Which lines hold binary damage (BINARY_LINE), or None when none does. A block whose only
    control bytes are its newlines (nearly every log) is settled by one count over its bytes: the
    regex over every line cost a quarter of a JSON lines read. `newlines`: how many the block
    holds, when its reader counted them already (TextBlock.newlines)."""
    if only_newlines(data, newlines):
        return None
    bad = lines.get_column("text").str.contains(BINARY_LINE)
    return bad if bad.any() else None


def only_newlines(data: bytes, newlines: int | None = None) -> bool:
    """Whether the newlines are the only control bytes of `data` (then no line is binary damage,
    settled by one count over the bytes); `newlines`: how many it holds, if counted already."""
    controls = int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) < 0x20))
    return controls == (data.count(b"\n") if newlines is None else newlines)


BINARY_LINE = r"[\x00-\x07\x0e-\x1a\x1c-\x1e]"
"""A line holding one of these is binary damage, not text: NUL and the C0 controls no text log
writes (tab, newline, vertical tab, form feed, carriage return, backspace and ESC, which progress
bars and colours use, are not among them; nor is the unit separator, which some writers use as a
field separator). For polars' engine and Python's `re` alike."""
ANSI = r"\x1b\[[0-9;:?<=>]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]"
"""Terminal escape sequences (colours and cursor moves: CSI `ESC [ ... m`, OSC `ESC ] ... BEL`, and
the short ones: `ESC ( B`, which `tput sgr0` writes, `ESC 7`), which a coloured console log holds between its words; for polars' engine and `re`."""
SEPARATOR = b"\x1f"
"""What the CSV reader is told separates fields: a byte logs almost never hold (a block that does is
cut in Python instead)."""
SMALL_BLOCK = 256 << 10
"""Below this, lines are cut in Python: polars' CSV reader costs ~1 ms a call whatever the size
(most of a daemon pass's read of a few hundred new lines); above it the reader is 5x faster."""


COMPRESSED = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda", b"\x1f\x8b", b"\x28\xb5\x2f\xfd")
"""Block starts that polars' CSV reader takes for zlib, gzip or zstd data and decompresses (to
nothing): `x^` is zlib's header. Such a block, and one holding a NUL, is cut in Python."""


def split_lines(data: bytes, first_line: int, *, source: str) -> tuple[pl.DataFrame, Problem | None]:
    """A block of complete lines as a frame (line_no, text). Big blocks are cut by polars' native
    CSV reader (a separator that never occurs, no quoting), far faster than splitting in Python;
    small ones, and any holding that separator byte or a NUL after all, in Python, to the same result: a
    trailing \r dropped, a byte-order mark at the start dropped, bad UTF-8 replaced (U+FFFD)."""
    if not data:
        return pl.DataFrame(schema={"line_no": pl.Int64(), "text": pl.String()}), None
    problem = None
    if len(data) < SMALL_BLOCK or SEPARATOR in data or b"\x00" in data or data.startswith(COMPRESSED):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            problem = not_utf8(data, first_line=first_line, source=source)
            text = data.decode("utf-8", "replace")
        texts = lines_of(text.removeprefix("\ufeff"))
        line_no = np.arange(first_line, first_line + len(texts), dtype=np.int64)
        return pl.DataFrame({"line_no": line_no, "text": pl.Series(texts, dtype=pl.String())}), problem
    try:
        lines = _read_lines(data, "utf8")
    except pl.exceptions.ComputeError:
        problem = not_utf8(data, first_line=first_line, source=source)
        lines = _read_lines(data, "utf8-lossy")
    lines = lines.with_row_index("line_no", offset=first_line).with_columns(pl.col("line_no").cast(pl.Int64()))
    return lines, problem


def lines_of(text: str) -> list[str]:
    """The lines of decoded text as the CSV reader cuts them: at \n, a trailing \r dropped, no
    empty line after the last newline."""
    texts = text.split("\n")
    if texts[-1] == "":
        texts.pop()
    return [t[:-1] if t.endswith("\r") else t for t in texts]


def _read_lines(data: bytes, encoding: str) -> pl.DataFrame:
    return pl.read_csv(
        data, has_header=False, separator=SEPARATOR.decode(), quote_char=None, new_columns=["text"], infer_schema=False,
        truncate_ragged_lines=True, encoding=encoding, raise_if_empty=False, missing_columns="insert",
    ).select(pl.col("text").fill_null(""))
