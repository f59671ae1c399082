"""What the sender delivered but could not record in the state, because another writer held the
state's lock (an outside `sqlite3` shell left in a transaction, a disk that stalls): a post Slack
accepted must not be sent again because its record failed. The record goes to this append-only
file instead (fsynced before the sender goes on, no lock to wait for), and is folded into the state
before the next post, by this process or, after a crash, the next one. Until it is folded the sink
sends nothing more: a follow-up must find the thread its alert started, and an entry is never
taken for undelivered while its record waits here.

A line is one State delivery write (`op`, the entries' ids and incident ids, its arguments) with the
state's id: a journal left beside a state that was moved aside and started over is not applied to
the new one."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..state import OutboxEntry, State, StateBusy

log = logging.getLogger("lossguard")
NAME = "delivered.journal"
OPS = ("mark_sent", "set_thread")
"""The State writes a delivered post makes: only these are journalled and replayed."""


@dataclass(frozen=True)
class Ref:
    """An outbox entry as the delivery writes use it: its id and its incident's."""

    id: int
    incident_id: int | None


class Journal:
    def __init__(self, state: State, sink: str) -> None:
        self.state = state
        self.path = state.directory / f"{NAME}.{sink}"
        """One file a sink: each sink's sender runs on a thread of its own."""

    def write(self, op: str, entries: Sequence[OutboxEntry | Ref], **args: object) -> None:
        """Append one record and fsync it (an OSError here is the sender's to report: the post
        was made and could not be recorded anywhere)."""
        record = {"state": self.state.id, "op": op, "entries": [[e.id, e.incident_id] for e in entries], **args}
        _synced(self.path, [record], os.O_APPEND)

    def _keep(self, records: list[dict]) -> None:
        """The journal holding only `records` (replaced whole: a crash leaves the old or the new)."""
        fresh = self.path.with_name(self.path.name + ".new")
        _synced(fresh, records, os.O_TRUNC)
        os.replace(fresh, self.path)

    def waiting(self) -> bool:
        return self.path.exists()

    def fold(self) -> bool:
        """Apply every record to the state, then drop the file. False while the state is still
        locked (StateBusy from the state: the file stays, nothing is sent meanwhile)."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return True
        records = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # (a line cut by a crash while it was written: that post's record is lost)
            if isinstance(record, dict) and record.get("state") == self.state.id and record.get("op") in OPS:
                records.append(record)
        for k, record in enumerate(records):
            args = dict(record)
            entries = [Ref(int(i), None if inc is None else int(inc)) for i, inc in args.pop("entries")]
            op = args.pop("op")
            args.pop("state")
            try:
                getattr(self.state, op)(entries, **args)
            except StateBusy:
                self._keep(records[k:])  # (those applied are not applied again)
                return False
        os.unlink(self.path)
        if records:
            log.info("%d delivery record(s) kept while the state was locked are now in the state", len(records))
        return True


def _synced(path: Path, records: list[dict], mode: int) -> None:
    """`records` as JSON lines written to `path` (private: run names, threads) and fsynced before
    it returns (`mode`: O_APPEND or O_TRUNC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
    try:
        os.write(fd, "".join(json.dumps(r) + "\n" for r in records).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
