"""The one reader API: a file and a cursor in, canonical rows and the next cursor out.

`read()` serves both the one-shot audit (final=True: the file is complete) and the daemon (final=False:
the file may still grow, so half-written data is left for the next call). Nothing raises out of it for
bad content or a file that vanished: problems come back as data, naming the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatch
from pathlib import Path

import polars as pl

from . import bounds, table
from .aliases import Aliases
from .cursor import Cursor
from ..errors import UsageError
from ..escaping import decodable
from .formats import FORMATS
from .formats.base import Keep, Parsed, Reader, Sink, kept_rows
from .formats.custom import LineFormatSpec
from .formats.sniff import by_name, format_of
from .needs import Needs
from .problems import Problem, summarised
from .sources import sqlite_db
from .discover import Found, collect

BUILTIN: dict[str, Reader] = {f.name: f.reader for f in FORMATS}
FORMAT_NAMES = tuple(BUILTIN)


@dataclass(frozen=True)
class ReadOptions:
    aliases: Aliases = field(default_factory=Aliases.default)
    custom: tuple[LineFormatSpec, ...] = ()
    format: str | None = None
    """Read every file as this format instead of detecting it."""

    def reader(self, name: str):
        for spec in self.custom:
            if spec.name == name:
                return spec.line_format()
        try:
            return BUILTIN[name]
        except KeyError:
            known = ", ".join([*FORMAT_NAMES, *(s.name for s in self.custom)])
            raise UsageError(f"unknown format {name!r}; known formats: {known}") from None

    @property
    def globs(self) -> list[str]:
        """File-name patterns of the user's own formats: files discovery must not pass over."""
        return [s.files for s in self.custom if s.files]

    def format_of(self, path: Path) -> str | None:
        return self.format or format_of(path, self.custom)


@dataclass(frozen=True)
class ReadResult:
    frame: pl.DataFrame
    cursor: Cursor
    problems: tuple[Problem, ...] = ()
    dead: bool = False
    span: table.Span | None = None
    """First and last step of the rows read, every tag's (with `needs`, also those left out); None:
    no rows."""
    named: bool = False
    """The file names the runs of its rows (a tracker's database holds many): each row's `run` is
    its own, and `span` covers them all."""


def read(
    path: Path, cursor: Cursor = Cursor(), *, run: str, fmt: str, final: bool, options: ReadOptions, lean: bool = False,
    limit: int | None = None, needs: Needs | None = None, each: Sink | None = None,
) -> ReadResult:
    """What `path` holds from `cursor` on; with `limit`, about that many bytes at most (whole lines
    or records: the cursor says where the next read goes on). With `needs`, only the rows of the
    tags it needs (projection; `span` still covers every row). With `each`, the table goes to it a
    block at a time, as it is read, and the result's frame is empty: memory is then bounded by a
    block, not by the file (formats read as one document give it in one piece)."""
    reader = options.reader(fmt)
    keep = needs.keeper(options.aliases) if needs is not None else None
    spans: list[table.Span | None] = []

    projects = keep is not None and getattr(reader, "projects", False)

    cut: dict[str, None] = {}

    def finished(rows: pl.DataFrame) -> pl.DataFrame:
        spans.append(table.span_of(rows))
        rows, said = _bounded_names(rows)
        cut.update(dict.fromkeys(said))
        return _finish(rows, keep=None if projects else keep, run=run, source=decodable(str(path)), options=options, lean=lean)

    extra: dict = {}
    if projects:
        extra["keep"] = keep
    streamed = each is not None and getattr(reader, "streams", False)
    if streamed:
        extra["each"] = lambda rows: _handed(each, finished(rows))
    try:
        parsed: Parsed = reader.read(path, cursor, final=final, limit=limit, **extra)
    except _SinkFailed as failed:
        raise failed.__cause__ from None  # the output's own failure (a closed pipe), not the file's
    except FileNotFoundError:
        return ReadResult(table.empty(lean=lean), cursor, (Problem(str(path), "file vanished before it could be read"),))
    except PermissionError:
        return ReadResult(table.empty(lean=lean), cursor, (Problem(str(path), "permission denied"),))
    except IsADirectoryError:
        return ReadResult(table.empty(lean=lean), cursor, (Problem(str(path), "is a folder, not a log file"),), dead=True)
    except OSError as exc:
        return ReadResult(table.empty(lean=lean), cursor, (Problem(str(path), f"cannot read: {exc.strerror or exc}"),))
    except Exception as exc:  # noqa: BLE001 - the one boundary for readers' bugs, scan's and the daemon's
        # Content no reader foresaw (a bug of ours): one problem naming the file, not a crashed
        # scan, or a daemon pass failing over the same bytes forever and holding up every other
        # run. The file is not read further. (Polars' messages run on for lines: the first says it.)
        why = (str(exc).strip().splitlines() or [""])[0]
        problem = Problem(str(path), f"cannot be read from byte {cursor.offset} on ({type(exc).__name__}: {why}); no longer read, please report it")
        return ReadResult(table.empty(lean=lean), cursor, (problem,), dead=True)
    frame = finished(parsed.rows)
    if each is not None and not streamed:
        if frame.height:
            each(frame)
        frame = frame.clear()
    span = parsed.span if parsed.projected else table.joined(spans)
    problems = parsed.problems + tuple(Problem(str(path), said) for said in cut)
    return ReadResult(frame, parsed.cursor, problems, parsed.dead, span, named="run" in parsed.rows.columns)


class _SinkFailed(Exception):
    """What `each` raised, carried past the boundary that turns a reader's failures into the file's
    problems: `lossguard read DIR | head` must stop at the closed pipe, not warn of every file."""


def _handed(each: Sink, rows: pl.DataFrame) -> None:
    try:
        each(rows)
    except Exception as exc:
        raise _SinkFailed from exc


def _bounded_names(rows: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """A parser's raw rows with every tag longer than bounds.MAX_NAME and run name longer than
    bounds.MAX_RUN (a run's name is made of a few, each bounded where a reader reads it) cut, and
    what was cut, to be said: a name is data from any file or store, held on every row of a table.
    (Asked of the few distinct names.)"""
    said: list[str] = []
    for column, what, limit in (("tag", "a metric name", bounds.MAX_NAME), ("run", "a run's name", bounds.MAX_RUN)):
        if column not in rows.columns or not rows.height:
            continue
        values = rows.get_column(column)
        if values.dtype == pl.String and (values.str.len_bytes().max() or 0) <= limit:
            continue  # (bytes are at least characters: the common case, asked in bulk)
        long = [n for n in values.unique().cast(pl.String).drop_nulls().to_list() if len(n) > limit]
        if long:
            dtype = rows.schema[column]
            rows = rows.with_columns(pl.col(column).cast(pl.String).replace({n: bounds.name(n, limit=limit)[0] for n in long}).cast(dtype))
            said.append(bounds.cut_name_said(what, max(map(len, long)), limit=limit))
    return rows, said


def _finish(rows: pl.DataFrame, *, keep: Keep | None, run: str, source: str, options: ReadOptions, lean: bool) -> pl.DataFrame:
    """A parser's raw rows as the canonical table, less the tags `keep` leaves out (when the reader
    did not leave them out itself)."""
    if keep is not None and rows.height:
        rows = kept_rows(rows, keep)
    tags = rows.get_column("tag").unique().to_list() if rows.height else []
    return table.finish(rows, run=run, source=source, metric_of=options.aliases.mapping(tags), lean=lean)


@dataclass(frozen=True)
class FileResult:
    found: Found
    format: str | None
    result: ReadResult | None


EMPTY = "empty file: no records"


def read_found(
    found: Found, options: ReadOptions, *, lean: bool = False, explicit: bool = False, needs: Needs | None = None, each: Sink | None = None,
    fmt: str | None = None,
) -> FileResult:
    """One file of an audit, completely. An empty file is not sniffed or parsed (a folder can hold
    thousands): it is a problem when its name promises records (an event file), or when a file of
    unknown name would be one (`unrecognised`); `explicit`: the user named this file; `needs` and
    `each`: as `read` takes them; `fmt`: its format, when the caller sniffed it already."""
    try:
        empty = found.path.stat().st_size == 0
        fmt = None if empty else fmt or options.format_of(found.path)
    except OSError as exc:
        problem = Problem(str(found.path), f"cannot read: {exc.strerror or exc}")
        return FileResult(found, None, ReadResult(table.empty(lean=lean), Cursor(), (problem,)))
    if empty:
        named = options.format or by_name(found.path.name) or next((s.name for s in options.custom if s.files and fnmatch(found.path.name, s.files)), None)
        warn = named is not None or unrecognised(found.path, explicit=explicit) is not None
        return FileResult(found, named, ReadResult(table.empty(lean=lean), Cursor(), (Problem(str(found.path), EMPTY),) if warn else ()))
    if fmt is None:
        return FileResult(found, None, None)
    return said_if_nothing(FileResult(found, fmt, read(found.path, run=found.run, fmt=fmt, final=True, options=options, lean=lean, needs=needs, each=each)))


TABLES = ("csv", "jsonl")
"""Formats whose every file is a table of metrics, named so by its suffix or claimed by its lines."""
NOTHING_READ = "no metric read from this file: none of its records holds a number at a step"


def said_if_nothing(res: FileResult) -> FileResult:
    """A whole file of a table format that gave no value and said nothing, with a problem saying
    so: a run whose one file was read as nothing was reported clean, a scan of it exit 0, having
    judged nothing. (Its reader says why where it can tell: a CSV's header, JSON it refused.)"""
    got = res.result
    if res.format not in TABLES or got is None or got.problems or got.span is not None or got.frame.height or got.named:
        return res
    return replace(res, result=replace(got, problems=(Problem(str(res.found.path), NOTHING_READ),)))


WORTH_A_WARNING = {".jsonl", ".ndjson", ".csv", ".log"}
UNRECOGNISED = "no training metrics recognised in this file"
"""The warning of a file no format claimed (a console log whose ending names a crash is no such
file: the crash finding says what it held)."""


def unrecognised(path: Path, *, explicit: bool) -> Problem | None:
    """A file no format claimed: worth a warning if the user named it or its name promises metrics
    (a stray README.txt under a runs folder is not), or if it is a database whose tables could not
    be read now (a writer's lock no private copy got past: whose it is is not known, and it may
    well be a tracker's). A name a format claims never comes here: the name alone settles its format."""
    if explicit or path.name.lower().endswith(sqlite_db.SUFFIXES):
        blocked = sqlite_db.tables_or_damage(path)[1]
        if blocked is not None and not blocked.dead:
            return Problem(str(path), blocked.message)
    if explicit or path.suffix.lower() in WORTH_A_WARNING:
        return Problem(str(path), UNRECOGNISED)
    return None


def read_paths(
    paths: Sequence[Path], options: ReadOptions = ReadOptions(), *, each: Sink | None = None
) -> tuple[pl.DataFrame, list[FileResult], list[Problem]]:
    """Read every log under the given files and folders, completely (the audit's case). With `each`,
    the table goes to it a block at a time, file after file, and the frame returned is empty."""
    found, problems = collect(paths, globs=options.globs)
    results = [read_found(f, options, explicit=f.path in paths, each=each) for f in found]
    frames = []
    for res in results:
        if res.result is None:
            problem = unrecognised(res.found.path, explicit=res.found.path in paths)
            if problem:
                problems.append(problem)
            continue
        problems.extend(res.result.problems)
        if res.result.frame.height:
            frames.append(res.result.frame)
    frame = pl.concat(frames, rechunk=False) if frames else table.empty()
    return frame, results, summarised(problems)


def steps_placed(results: Sequence[FileResult]) -> dict[str, list[str]]:
    """Per run, how the files whose format finds its steps several ways placed them (`read` says it)."""
    from .formats.hf_console import placement
    from .formats.wandb import steps_from

    said: dict[str, list[str]] = {}
    for res in results:
        if res.result is None:
            continue
        cursor = res.result.cursor
        if res.format == "hf_console" and (how := placement(cursor)):
            said.setdefault(res.found.run, []).append(f"steps of {res.found.path.name}: {how}")
        elif res.format == "wandb" and cursor.name is not None and (how := steps_from(cursor)):
            told = said.setdefault(table.run_of(res.found.run, cursor.name), [])
            if (line := f"steps of {res.found.path.name}: {how}") not in told:  # (a resumed run's files share a name)
                told.append(line)
    return said
