"""The state read-only, for what looks on while the daemon runs: the metrics a scrape renders
(StateReader, on a connection of its own), what `lossguard status` shows (read_summary) and the
silences `scan --slack-digest` honours (read_silences). None of them writes or takes a lock, so a
reader never delays a pass, and a file that is no state is a StateError naming it."""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from ..escaping import decodable
from ..silences import Silence
from .columns import RUN, TAIL_FORMAT, chunks, column_or_null, marks, path_of, run_row
from .errors import StateError
from .rows import Backlog, RunRow
from .silences import select_silences


class StateReader:
    """The state read-only on a connection of its own, for what the metrics show at scrape time: in
    WAL mode a reader never waits for a pass's writes nor holds them up, so a scrape cannot delay an
    alert. Queries are serialised here (several scrapes may come at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self.db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False, timeout=5)
            self.db.execute("PRAGMA busy_timeout=5000")
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{path}: cannot open the state file to read ({exc})") from None

    def _all(self, query: str, args: Sequence[object] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self.db.execute(query, args).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StateError(f"{self.path}: cannot read the state file ({exc})") from None

    def data_version(self) -> int:
        """Changes whenever another connection (a pass, the sender) commits: what to render anew."""
        return self._all("PRAGMA data_version")[0][0]

    def live_runs(self, *, since: float) -> list[RunRow]:
        """Runs that logged a new step at or after `since` (older ones are left out: bounded)."""
        return [run_row(r) for r in self._all(f"{RUN} WHERE advanced_at >= ? ORDER BY run", (since,))]

    def touched(self, since: int) -> tuple[int, set[str]]:
        """The number of the last commit that changed a run's metrics, and the runs changed by
        commits after `since` (read before their data: a commit in between is seen again later)."""
        row = self._all("SELECT value FROM meta WHERE key='touched'")
        last = int(row[0][0]) if row else 0
        return last, {r[0] for r in self._all("SELECT run FROM runs WHERE touched > ?", (since,))} if last > since else set()

    def _by_run(self, query: str, args: Sequence[object], runs: Collection[str] | None, group: str = "") -> list[tuple]:
        """`query` (ending in a WHERE clause) over every run, or over `runs` only (in chunks)."""
        if runs is None:
            return self._all(query.replace(" AND {runs}", "") + group, args)
        out = []
        for chunk in chunks(sorted(runs)):
            out += self._all(query.replace("{runs}", f"run IN ({marks(chunk)})") + group, (*args, *chunk))
        return out

    def latest_values(self, metrics: Sequence[str], runs: Collection[str] | None = None) -> dict[tuple[str, str], float]:
        """(run, metric) -> the last value of its stream, from the small `latest` table (a busy box
        scraped every 15 s: reading 4,000 tails of up to 400 points cost 14 ms a scrape); of every
        run, or of `runs`. (Layout 7 filled it for streams not written since layout 6.)"""
        unpack = struct.Struct(TAIL_FORMAT[1].replace("<f8", "<d")).unpack  # (a scrape reads thousands)
        rows = self._by_run(f"SELECT run, metric, value FROM latest WHERE metric IN ({marks(metrics)}) AND {{runs}}", metrics, runs)
        return {(run, metric): unpack(last)[0] for run, metric, last in rows}

    def open_incidents_by_severity(self, runs: Collection[str] | None = None) -> dict[tuple[str, str], int]:
        """Open incidents that were alerted: those folded into a run's noisy notice were not, and
        are counted apart (`folded_incidents`); history found at the first start was not either,
        and another rank's incident that joined one is counted as that one."""
        rows = self._by_run(
            "SELECT run, coalesce(json_extract(body, '$.severity'), ''), count(*) FROM incidents "
            "WHERE status='open' AND folded=0 AND quiet=0 AND joined IS NULL AND {runs}", (), runs, " GROUP BY 1, 2",
        )
        return {(run, severity): n for run, severity, n in rows}

    def folded_incidents(self, runs: Collection[str] | None = None) -> dict[str, int]:
        """run -> its open incidents folded into its noisy notice (recorded, never alerted)."""
        return dict(self._by_run("SELECT run, count(*) FROM incidents WHERE status='open' AND folded=1 AND {runs}", (), runs, " GROUP BY run"))

    def incidents_by_rule(self, runs: Collection[str] | None = None) -> dict[tuple[str, str], int]:
        """Incidents ever raised per run and rule (history found at the first start included)."""
        return {(run, rule): n for run, rule, n in self._by_run("SELECT run, rule, count(*) FROM incidents WHERE 1 AND {runs}", (), runs, " GROUP BY run, rule")}

    def backlog(self) -> Backlog:
        n, oldest = self._all("SELECT count(*), min(created) FROM outbox WHERE sent_at IS NULL")[0]
        return Backlog(n, oldest)

    def files_followed(self) -> int:
        return self._all("SELECT count(*) FROM files WHERE dead=0")[0][0]

    def size_bytes(self) -> int:
        """state.db and its write-ahead log: together, what the state takes on disk."""
        total = 0
        for name in (self.path.name, self.path.name + "-wal"):
            try:
                total += (self.path.parent / name).stat().st_size
            except OSError:
                pass
        return total

    def close(self) -> None:
        self.db.close()


T = TypeVar("T")


def _read_only(path: Path, read: Callable[[sqlite3.Connection], T]) -> T:
    """`read` on the state file opened read-only (safe while the daemon runs); a file that is no
    state is a StateError naming it."""
    if path.is_dir():
        raise StateError(f"{path}: the state file is a folder")
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10)
    except sqlite3.DatabaseError as exc:
        raise StateError(f"{path}: cannot open the state file ({exc})") from None
    try:
        return read(db)
    except sqlite3.DatabaseError as exc:
        raise StateError(f"{path}: not a lossguard state file ({exc})") from None
    finally:
        db.close()


def read_summary(path: Path) -> dict[str, list[dict[str, object]]]:
    """What `lossguard status` shows."""
    return _read_only(path, _summary)


def _summary(db: sqlite3.Connection) -> dict[str, list[dict[str, object]]]:
    from ..ingest.cursor import Cursor

    q = db.execute
    folded = column_or_null(db, "incidents", "folded")  # (NULL: a state from before layout 12 folded none)
    not_folded = f"coalesce({folded}, 0)=0"
    # Alerted: not history found at the first start (recorded without a word), nor a rank's incident
    # that joined another rank's (said by that one, which names its ranks).
    alerted = f"{not_folded} AND quiet=0 AND {column_or_null(db, 'incidents', 'joined')} IS NULL"
    return {
        "files": [
            {"path": decodable(path_of(p)), "run": r, "format": f, "offset": cur.offset, "dead": bool(d), "named": cur.name}
            for p, r, f, cur, d in ((p, r, f, Cursor.from_json(c), d) for p, r, f, c, d in q("SELECT path, run, format, cursor, dead FROM files ORDER BY path"))
        ],
        "open_incidents": [{"run": r, "rule": ru, "step": st, "acked_by": a, **({"ranks": json.loads(rk)} if rk else {})} for r, ru, st, a, rk in q(
            f"SELECT run, rule, step, {column_or_null(db, 'incidents', 'acked_by')}, json_extract(body, '$.ranks') FROM incidents "
            f"WHERE status='open' AND {alerted} ORDER BY run, step")],
        "history_incidents": [{"run": r, "rule": ru, "open": n} for r, ru, n in q(
            "SELECT run, rule, count(*) FROM incidents WHERE status='open' AND quiet=1 GROUP BY run, rule ORDER BY run, rule")],
        # Firings within a run's own noise: recorded and said once in its noisy notice, never alerted.
        "folded_incidents": [{"run": r, "rule": ru, "folded": n} for r, ru, n in q(
            f"SELECT run, rule, count(*) FROM incidents WHERE status='open' AND NOT {not_folded} GROUP BY run, rule ORDER BY run, rule")],
        "undelivered": [
            {"id": i, "kind": k, "attempts": a, "error": e, "permanent": bool(p)}
            for i, k, a, e, p in q("SELECT id, kind, attempts, last_error, permanent FROM outbox WHERE sent_at IS NULL ORDER BY id")
        ],
        "silences": [s.to_json() for s in select_silences(db, now=time.time())],
        "slack_link": _link(db),
    }


def _link(db: sqlite3.Connection) -> dict[str, object] | None:
    """How the daemon's Socket Mode link stood when it last changed (None: no app token, or a
    daemon from before layout 9)."""
    row = db.execute("SELECT value FROM meta WHERE key='slack_link'").fetchone()
    return None if row is None else json.loads(row[0])


def read_silences(path: Path, *, now: float) -> list[Silence]:
    """The silences in force (`scan --slack-digest` leaves out what they cover)."""
    return _read_only(path, lambda db: select_silences(db, now=now))
