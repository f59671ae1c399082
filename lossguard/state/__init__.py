"""The daemon's memory, in one SQLite file (WAL): what it follows and how far it read, the tail of
each stream that the windows continue from, the incidents it raised, and an outbox of notifications
not yet delivered. A pass's offsets, incidents and outbox entries are committed in one transaction,
so after a crash the daemon resumes exactly where its last commit left it: nothing raised twice,
nothing lost.

The package, by what each module keeps: `schema` the layout and its migrations; `store` State
itself (opening, locking, the damaged file); `transaction` a pass's writes and the commit; `files`,
`incidents`, `outbox`, `messages`, `plots`, `silences`, `clicks` (what was done from Slack) and `owed` (roots whose history is still owed a
first reading) the parts State is composed of (one a
kind of row); `rows` the typed rows and `columns` how their values are stored; `view` the
read-only readers; `errors` why the state cannot be used. Import from here."""

from __future__ import annotations

from .errors import StateBusy, StateError, StateLocked, StateTooNew
from .rows import Backlog, FileRow, IncidentRow, OutboxEntry, PlotRow, Posted, RunRow, Tail, Undelivered
from .schema import VERSION
from .silences import SILENCES_KEPT_DAYS
from .store import State
from .transaction import Transaction
from .view import StateReader, read_silences, read_summary

__all__ = [
    "SILENCES_KEPT_DAYS",
    "VERSION",
    "Backlog",
    "FileRow",
    "IncidentRow",
    "OutboxEntry",
    "PlotRow",
    "Posted",
    "RunRow",
    "State",
    "StateBusy",
    "StateError",
    "StateLocked",
    "StateReader",
    "StateTooNew",
    "Tail",
    "Transaction",
    "Undelivered",
    "read_silences",
    "read_summary",
]
