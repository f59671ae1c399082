"""The shapes every sink shares: a Post (one message for one sink, settling one or more outbox
entries), the Sink protocol, and the Delivery it answers with ("did it work; if not, is it worth
trying again, and what would fix it"). Only a confirmed delivery marks an outbox entry sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..model import Notice
from ..state import OutboxEntry


@dataclass(frozen=True)
class Delivery:
    ok: bool
    ts: str | None = None
    """The posted message's id (Slack's ts), for threads and updates."""
    channel: str | None = None
    error: str | None = None
    permanent: bool = False
    fix: str | None = None

    def describe(self) -> str:
        if self.ok:
            return "delivered"
        kind = "permanent" if self.permanent else "temporary"
        return f"{kind} error: {self.error}" + (f" ({self.fix})" if self.fix else "")


@dataclass(frozen=True)
class Rewrite:
    """A message posted earlier that a post changes in place (Slack's chat.update): only ever the
    incident's own alert (its header says it is over, or grew) or the summary that lists it."""

    thread: str
    """`channel|ts` of that message."""
    message: int | None = None
    """Its row in the state's `messages`."""
    summary: tuple[Notice, ...] = ()
    """A burst's summary: its incidents as they stand now, each one's state shown (empty: an
    alert, whose header takes the post's own text)."""
    said: tuple[str, ...] = ()
    """What was said on that message from Slack (`silenced 4 h by @ana at 03:12`): kept in the rewrite."""


@dataclass(frozen=True)
class Post:
    """One message: a notice, or (summary) one message listing several new incidents."""

    entries: tuple[OutboxEntry, ...]
    channel: str | None = None
    thread: str | None = None
    """`channel|ts` of the message this one replies to."""
    summary: bool = False
    in_summary: bool = False
    """A reply in the thread of the summary posted just before it (its ts is known only then)."""
    repeat: int | None = None
    """A summary whose first post a restart left in doubt (its `messages` row): said again
    briefly, its incidents not listed a second time."""
    rewrite: Rewrite | None = None
    """Set at delivery: the message this post's news changes."""

    @property
    def notice(self) -> Notice:
        return self.entries[0].notice

    @property
    def notices(self) -> tuple[Notice, ...]:
        return tuple(e.notice for e in self.entries)


class Sink(Protocol):
    name: str

    def send(self, post: Post) -> Delivery:
        """Deliver one post; never raises for a failed delivery (the Delivery says why)."""
        ...


@dataclass(frozen=True)
class Manners:
    """How a sink wants its posts shaped (stages of the pipeline): Slack's bot routes channels,
    threads follow-ups, groups bursts, keeps a run's alerts in one thread for a while and paces
    itself; a file or the console takes everything as it comes."""

    channels: bool = False
    """Posts name a channel and can reply in threads (a Slack bot; a webhook cannot)."""
    routes: tuple = ()
    """settings.SlackRoute: the first whose severities and run glob match picks the channel."""
    channel: str | None = None
    group_threshold: int | None = None
    run_cooldown: float = 0.0
    min_interval: float = 0.0
    acks: bool = False
    """An incident acknowledged from Slack has its updates (grew, cause revised) no longer posted here."""
    silences: bool = True
    """`lossguard silence` holds its posts back. Not Alertmanager's: it has silences of its own, and
    an alert hidden from it would resolve there and fire anew (a second page) when ours ended."""
