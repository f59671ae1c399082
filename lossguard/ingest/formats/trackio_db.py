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
                names = _run_names(db, path, {(r[1], r[2]) for r in rows}) if has_ids else {r[1]: f"{path.stem}/{r[1]}" for r in rows}
        except sqlite_db.Unreadable as exc:
            return no_rows(source, cursor if exc.dead else sqlite_db.again(cursor), exc.message, dead=exc.dead)
        problems = [Problem(source, sqlite_db.RESTARTED)] if fetched.restarted else []
        frame, bad = _frame(rows, names)
        if bad:
            problems.append(Problem(source, f"metrics of {len(bad):,} row(s) are no JSON object (or one nested too deep); those rows are skipped, the first: id {bad[0]}"))
        return Parsed(frame, fetched.cursor, tuple(problems))


def _frame(rows: list[tuple], names: dict[str, str]) -> tuple[pl.DataFrame, list[int]]:
    """Raw rows of the fetched rows' numbers (a number, or a non-finite one as trackio spells it;
    media and tables are not metrics; a nested dict's numbers are, under their joined keys), and the ids of the rows holding no JSON object."""
    steps: list[int] = []
    tags: list[str] = []
    values: list[float] = []
    times: list[float | None] = []
    runs: list[str] = []
    bad: list[int] = []
    for row_id, run_id, _, step, blob, stamp in rows:
        try:
            got = bounds.json_value(blob)
        except (ValueError, TypeError):  # (bounds.TooDeep too: nested past what the parser follows)
            got = None
        if not isinstance(got, dict):
            bad.append(row_id)
            continue
        run = names[run_id]
        wall = _wall_time(stamp)
        for tag, value in _flat(got):
            number = NON_FINITE.get(value) if isinstance(value, str) else None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
            if number is None:
                continue
            steps.append(step)
            tags.append(tag)
            values.append(number)
            times.append(wall)
            runs.append(run)
    if not steps:
        return pl.DataFrame(schema=NAMED_RAW), bad
    return pl.DataFrame({"step": steps, "tag": tags, "value": values, "wall_time": times, "run": runs}, schema=NAMED_RAW), bad


def _flat(metrics: dict, prefix: str = "") -> list[tuple[str, object]]:
    """A logged dict's values by key, a nested dict's (`trackio.log({"train": {"loss": 2.3}})`,
    which trackio stores as given) by its keys joined by '.', as lossguard names W&B's nested keys:
    `train.loss`."""
    out: list[tuple[str, object]] = []
    # A stack, not recursion: a row's JSON may be nested as deep as the parser follows (~1,000),
    # past what this function's own frames could.
    todo = [(prefix, iter(metrics.items()))]
    while todo:
        at, items = todo[-1]
        for key, value in items:
            if isinstance(value, dict):
                todo.append((f"{at}{key}.", iter(value.items())))  # (its keys come here, in order)
                break
            out.append((f"{at}{key}", value))
        else:
            todo.pop()
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
