"""The state's rows as the rest of lossguard holds them: typed and frozen, one class a kind of row,
so no caller indexes a tuple of columns (how each is read from its table is the reading part's)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import Incident, Notice

@dataclass(frozen=True)
class FileRow:
    path: str
    run: str
    format: str | None
    device: int
    inode: int
    fingerprint: bytes
    cursor: str
    dead: bool
    quiet: int
    """Offset up to which the file is history from before the daemon's first start: read for the
    windows, not alerted on (0: nothing is; databases from before this wrote 1 = the first read)."""
    mtime: int = 0
    """st_mtime_ns when last read: an unchanged size with a new mtime means rewritten in place."""


@dataclass(frozen=True)
class Tail:
    """The last points of one stream, as committed: what the next pass's windows continue from."""

    steps: np.ndarray
    values: np.ndarray
    seen: int
    """Points the stream has held in all (the tail keeps only the last of them)."""
    timeline: int = 0
    """The timeline the tail's last point is on (model.Incident.timeline): how many times the
    stream's steps went back before it, since the daemon's first read of it."""

    @classmethod
    def empty(cls) -> Tail:
        return cls(np.empty(0, np.int64), np.empty(0, np.float64), 0)


@dataclass(frozen=True)
class RunRow:
    run: str
    last_step: int | None
    advanced_at: float | None
    """When the run last logged a new step (the daemon's clock)."""
    stalled: bool


@dataclass(frozen=True)
class IncidentRow:
    """An incident as raised, and what was last said about it (the notification log)."""

    id: int
    status: str
    """open | resolved"""
    incident: Incident
    source: str
    quiet: bool
    """Raised from history found at the first start: recorded, never announced."""
    notified_value: float | None
    notified_at: float | None
    top_cause: str | None
    thread: str | None
    """`channel|ts` of the Slack message the incident's follow-ups reply to."""
    opened_at: float | None = None
    """When the daemon raised it (wall clock): Alertmanager's startsAt."""


@dataclass(frozen=True)
class OutboxEntry:
    id: int
    incident_id: int | None
    sink: str
    notice: Notice
    attempts: int
    key: str = ""
    """`<state id>-<id>`: unique across state files (a state moved aside and started over counts
    its ids from 1 again), so a sink that deduplicates by it is never fooled."""
    created: float = 0.0
    """When the notice was raised (wall clock): a resolution's endsAt."""
    opened_at: float | None = None
    """When its incident was raised (None: a run's notice): an alert's startsAt."""


@dataclass(frozen=True)
class Posted:
    """A message lossguard posted in a sink with threads (state layout 8)."""

    id: int
    role: str
    """alert: incidents' own alert; summary: a burst's listing; repeat: the short message that
    stood for a summary whose first post a restart left in doubt."""
    thread: str | None
    """`channel|ts` (None: a summary not known to be posted)."""
    incidents: tuple[IncidentRow, ...]
    """As they stand now: what it announces or lists."""


@dataclass(frozen=True)
class PlotRow:
    """A picture to show in one sink, its incident's alert there delivered."""

    incident_id: int
    sink: str
    picture: str
    """plot.Picture as JSON."""
    attempts: int
    thread: str | None
    """`channel|ts` of the incident's Slack thread."""
    alert_key: str
    """The outbox key of the alert it follows (what a JSON-lines reader joins it on)."""


@dataclass(frozen=True)
class Undelivered:
    """An outbox entry as the operator sees it."""

    id: int
    sink: str
    kind: str
    run: str
    created: float
    attempts: int
    error: str | None
    permanent: bool


@dataclass(frozen=True)
class Backlog:
    """Undelivered outbox entries (permanent failures too: they wait for the operator)."""

    pending: int
    oldest_created: float | None
