"""How values are kept in the tables' columns and read back: paths that are not UTF-8, stream tails
as packed numbers, and the SELECTs of the rows several parts of the state read (each with the one
function that turns its tuple into a row). Shared by State's parts, its Transaction and the
read-only view, so a column is encoded in one place."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence

import numpy as np

from ..model import Incident
from .rows import IncidentRow, RunRow, Tail

TAIL_FORMAT = ("<i8", "<f8")
"""A tail on disk: its steps (int64), then its values (float64, NaN and infinities as they are)."""

CHUNK = 500
"""Values bound in one IN (...) list: well under SQLite's limit on a statement's parameters."""

INCIDENT = "SELECT id, status, body, source, quiet, notified_value, notified_at, top_cause, thread, opened_at FROM incidents"
INCIDENT_RUN = INCIDENT.replace("SELECT id,", "SELECT run, id,", 1)
"""INCIDENT with the run first (queries over many runs group by it)."""
RUN = "SELECT run, last_step, advanced_at, stalled FROM runs"


def column_or_null(db: sqlite3.Connection, table: str, column: str) -> str:
    """`column` as a SELECT names it, or NULL in a file laid out before the column was added (read
    by `status` and the other read-only readers, which never migrate a state)."""
    return column if any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})")) else "NULL"


def chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    """`items` CHUNK at a time, for one IN (...) list each."""
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def marks(items: Sequence[object]) -> str:
    """The parameters of an IN (...) list of `items`: `?,?,?`."""
    return ",".join("?" * len(items))


def incident_row(r: tuple) -> IncidentRow:
    """A row of INCIDENT."""
    return IncidentRow(r[0], r[1], Incident.from_json(json.loads(r[2])), r[3], bool(r[4]), r[5], r[6], r[7], r[8], r[9])


def run_row(r: tuple) -> RunRow:
    """A row of RUN."""
    return RunRow(r[0], r[1], r[2], bool(r[3]))


def stored(path: str) -> str | bytes:
    """A followed file's path as `files.path` keeps it: text, or (a name that is not UTF-8, which
    Python holds as lone surrogates and SQLite's text cannot) its bytes, as a BLOB: the file must be
    opened again by its real name, and a BLOB never equals a text, so no two paths meet."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def path_of(value: str | bytes) -> str:
    """`stored` undone: the path as os.fsdecode gives it, which opens the file."""
    return os.fsdecode(value) if isinstance(value, bytes) else value


def pack_tail(tail: Tail) -> bytes:
    """Packed, not JSON: the daemon writes every busy stream's tail (up to 400 points) each pass.
    Its last 8 bytes are the stream's latest value (what the `latest` table keeps)."""
    return np.ascontiguousarray(tail.steps, TAIL_FORMAT[0]).tobytes() + np.ascontiguousarray(tail.values, TAIL_FORMAT[1]).tobytes()


def unpack_tail(tail: bytes | str, seen: int, timeline: int = 0) -> Tail:
    """`pack_tail` undone; a text is a tail of layout 1 (JSON)."""
    if isinstance(tail, str):  # version 1: JSON [[step, value], ...], non-finite values as strings
        points = json.loads(tail)
        return Tail(np.array([p[0] for p in points], np.int64), np.array([float(p[1]) for p in points], np.float64), seen, timeline)
    step_size, value_size = (np.dtype(t).itemsize for t in TAIL_FORMAT)
    n = len(tail) // (step_size + value_size)
    steps = np.frombuffer(tail, TAIL_FORMAT[0], n).copy()
    return Tail(steps, np.frombuffer(tail, TAIL_FORMAT[1], n, offset=step_size * n).copy(), seen, timeline)
