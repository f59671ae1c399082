"""trackio's project databases (`~/.cache/huggingface/trackio/<project>.db`, or under TRACKIO_DIR):
SQLite in WAL mode, a row per logged step whose `metrics` is a JSON object of that step's values,
non-finite ones as the strings "NaN", "Infinity" and "-Infinity" (trackio.utils.serialize_values).

One database is one project and holds its runs: each row's `run` is `project/run name`, the project
being the database's name. trackio lets a new run take a name an earlier one has (`resume="never"`
gives it a new run id): they are never merged, the earliest (by its first row) keeps the name and
each later one is `name (<first 8 characters of its run id>)`. Databases written before trackio 0.24
have no run ids: the name is the run. System metrics (CPU, GPU) are not read: nothing judges them."""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime
from pathlib import Path

import polars as pl

from .. import bounds
from ..cursor import Cursor
from ..problems import Problem
from ..sources import sqlite_db
from .base import NAMED_RAW, Format, Parsed, no_rows

TABLES = frozenset({"metrics", "configs", "sqlite_sequence"})
"""trackio's tables since its first release (`sqlite_sequence`: its AUTOINCREMENT ids)."""
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
FLOAT_LIMIT = 2**1024
"""Whole numbers from here on are past a float's range (float() raises on them)."""


def _table(has_ids: bool) -> sqlite_db.Table:
    run = "run_id" if has_ids else "run_name"
    return sqlite_db.Table("metrics", key="id", columns=f"{run}, run_name, step, metrics, timestamp", identity="run_name, step, timestamp")


class TrackioDbFormat:
    name = "trackio_db"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        source = str(path)
        size, _ = sqlite_db.stamp(path)
        try:
            with sqlite_db.opened(path) as db:
                has_ids = "run_id" in sqlite_db.columns(db, "metrics")
                fetched = sqlite_db.fetch(db, _table(has_ids), cursor, list, size=size, limit=limit)
                rows = [row for batch in fetched.batches for row in batch]
                runs = {(r[1], r[2]) for r in rows if isinstance(r[1], str) and isinstance(r[2], str)}
                names = _run_names(db, path, runs) if has_ids else {name: f"{path.stem}/{name}" for _, name in runs}
                told = db.told
        except sqlite_db.Unreadable as exc:
            return no_rows(source, cursor if exc.dead else sqlite_db.again(cursor), exc.message, dead=exc.dead)
        problems = [Problem(source, told, unfinished=True)] if told else []
        if fetched.restarted:
            problems.append(Problem(source, sqlite_db.RESTARTED))
        frame, passed = _frame(rows, names, path.stem)
        problems += sqlite_db.passed_over(source, passed)
        return Parsed(frame, fetched.cursor, tuple(problems))


def _frame(rows: list[tuple], names: dict[str, str], project: str) -> tuple[pl.DataFrame, list[sqlite_db.Passed]]:
    """Raw rows of the fetched rows' numbers (a number, or a non-finite one as trackio spells it;
    media and tables are not metrics; a nested dict's numbers are, under their joined keys), and the
    rows no reader can take: no run, a step that is no whole number (trackio stores `step=20.5` as
    given, and SQLite keeps what a column is given), values that are no JSON object or nested past
    what a parser takes. Each such row is passed over alone: the rows and runs beside it are read."""
    steps: list[int] = []
    tags: list[str] = []
    values: list[float] = []
    times: list[float | None] = []
    runs: list[str] = []
    passed: list[sqlite_db.Passed] = []
    for key, run_id, run_name, step, blob, stamp in rows:
        run = names.get(run_id) if isinstance(run_id, str) else None
        got, why = _values(blob) if run is not None and isinstance(step, int) else (None, None)
        if run is None:
            why = "no run id" if isinstance(run_name, str) else "no run name"
        elif not isinstance(step, int):
            why = f"step {step!r} is not a whole number"
        if got is None:
            passed.append(sqlite_db.Passed(run or f"{project}/{run_name if isinstance(run_name, str) else '?'}", key, why or ""))
            continue
        wall = _wall_time(stamp)
        for tag, number in got:
            steps.append(step)
            tags.append(tag)
            values.append(number)
            times.append(wall)
            runs.append(run)
    if not steps:
        return pl.DataFrame(schema=NAMED_RAW), passed
    return pl.DataFrame({"step": steps, "tag": tags, "value": values, "wall_time": times, "run": runs}, schema=NAMED_RAW), passed


def _values(blob: object) -> tuple[list[tuple[str, float]] | None, str | None]:
    """A row's metrics as (tag, number), or None and why no reader can take them."""
    try:
        got = bounds.json_value(blob) if isinstance(blob, (str, bytes)) else None
    except bounds.TooDeep:
        return None, "its metrics are JSON nested too deep to read"
    except ValueError:
        got = None
    if not isinstance(got, dict):
        return None, "its metrics are not a JSON object"
    out: list[tuple[str, float]] = []
    for tag, value in _flat(got):
        if isinstance(value, str):
            number = NON_FINITE.get(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            number = None
        elif isinstance(value, int) and not -FLOAT_LIMIT < value < FLOAT_LIMIT:
            return None, f"{tag} is a whole number past a float's range"
        else:
            number = float(value)
        if number is not None:
            out.append((tag, number))
    return out, None


def _flat(metrics: dict) -> list[tuple[str, object]]:
    """A logged dict's values by key, a nested dict's (`trackio.log({"train": {"loss": 2.3}})`,
    which trackio stores as given) by its keys joined by '.', as lossguard names W&B's nested keys:
    `train.loss`. Walked with a stack of its own: however deep the nesting JSON's parser took, this
    never runs out of Python's."""
    out: list[tuple[str, object]] = []
    stack = [("", iter(metrics.items()))]
    while stack:
        prefix, items = stack[-1]
        for key, value in items:
            if isinstance(value, dict):
                stack.append((f"{prefix}{key}.", iter(value.items())))
                break
            out.append((f"{prefix}{key}", value))
        else:
            stack.pop()
    return out


def _wall_time(stamp: object) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


_FIRST_ROWS: dict[tuple[str, str], int] = {}
"""(database, run id) -> the id of the run's first row, which never changes (trackio's ids are
AUTOINCREMENT keys): asked once a process, as it costs a scan of the run's rows."""


def _run_names(db: sqlite3.Connection, path: Path, runs: set[tuple[str, str]]) -> dict[str, str]:
    """run id -> `project/run name` for the runs of the rows read: a name other runs have too (the
    configs table has a row per run) is kept by the earliest of them."""
    named: dict[str, str] = {}
    for run_name in {name for _, name in runs}:
        peers = {r[0] for r in db.execute("SELECT run_id FROM configs WHERE run_name = ?", (run_name,))} if _has_run_ids(db) else set()
        peers |= {run_id for run_id, name in runs if name == run_name}
        ranked = sorted(peers, key=lambda run_id: (_first_row(db, path, run_id), run_id))
        for k, run_id in enumerate(ranked):
            named[run_id] = f"{path.stem}/{run_name}" if k == 0 else f"{path.stem}/{run_name} ({run_id[:8]})"
    return named


def _has_run_ids(db: sqlite3.Connection) -> bool:
    return "run_id" in sqlite_db.columns(db, "configs")


def _first_row(db: sqlite3.Connection, path: Path, run_id: str) -> float:
    key = (str(path), run_id)
    if key not in _FIRST_ROWS:
        row = db.execute("SELECT min(id) FROM metrics WHERE run_id = ?", (run_id,)).fetchone()
        if row[0] is None:
            return math.inf  # (no rows yet: not remembered, it will have some)
        _FIRST_ROWS[key] = row[0]
    return _FIRST_ROWS[key]


TRACKIO_DB = TrackioDbFormat()
FORMAT = Format(reader=TRACKIO_DB, tables=TABLES, names_runs=True)
