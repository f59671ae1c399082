"""From the outbox to the sinks, as Alertmanager's notify pipeline does it: each stage takes posts
and gives posts (the same, fewer, or reshaped), the chain for a sink is built in one place
(`chain`) from the sink's Manners, and the sender paces, delivers and records each post as its sink
accepts it. Stages are lazy generators, so a stage that looks at what was just delivered (a run's
recent alert) sees the post before it.

    route -> threads -> group -> cooldown -> [pace -> deliver -> record]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from ..model import Notice
from ..silences import ANNOUNCING, CLOSING, Silence, covering
from ..state import OutboxEntry, State, StateBusy
from .delivery import Delivery, Manners, Post, Rewrite, Sink
from .journal import Journal
from .message import describe

log = logging.getLogger("lossguard")
Stage = Callable[[Iterable[Post]], Iterator[Post]]
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
STARTS_THREAD = ("opened", "escalated", "unsilenced")
"""Kinds whose post is the message an incident's follow-ups reply to (an incident whose alert a
silence held back is first posted when the silence ends)."""
ANNOUNCES = ("opened", "unsilenced")
"""Kinds a burst's summary lists (an escalation is posted on its own, in its first alert's thread)."""
TAKEN_QUIET = ("updated", "relabelled")
"""What is no longer posted of an incident someone acknowledged: news of it that needs no one to act."""
BATCH = 100
"""Outbox entries taken at a time; a round goes on while entries are waiting."""


def news_first(entries: Iterable[OutboxEntry], *, listed: Callable[[int], bool]) -> list[OutboxEntry]:
    """The entries with the news (an incident's alert: opened, escalated, unsilenced) ahead of
    follow-ups and of a posted summary's details: a burst's replies take a second or more of a busy
    Slack, and a new spike must not wait behind them. News never overtakes an earlier entry of its
    own run (an escalation stays behind its first alert, an alert behind its run's stall notice), nor
    other news; `listed`: the incident is in a summary already posted (its post is that summary's
    reply, a detail like the others)."""
    news: list[OutboxEntry] = []
    rest: list[OutboxEntry] = []
    behind: set[str] = set()  # (runs with an entry that stays in place: their later entries stay behind it)
    for e in entries:
        ident, kind = e.incident_id, e.notice.kind
        if ident is not None and kind in STARTS_THREAD and e.notice.run not in behind and not (kind in ANNOUNCES and listed(ident)):
            news.append(e)
        else:
            rest.append(e)
            behind.add(e.notice.run)
    return news + rest


def route(manners: Manners) -> Stage:
    """The channel: the first route matching the severity and run, else the sink's own."""

    def channel_of(post: Post) -> str | None:
        notices = post.notices
        notice = max(notices, key=lambda n: SEVERITY_RANK.get(n.severity or "", 0))
        for r in manners.routes:
            if r.matches(notice.severity, notice.run):
                return r.channel
        return manners.channel

    def stage(posts: Iterable[Post]) -> Iterator[Post]:
        for post in posts:
            yield replace(post, channel=channel_of(post))

    return stage


def threads(state: State) -> Stage:
    """An incident's follow-ups reply in the thread its alert started (or the summary it was in)."""

    def stage(posts: Iterable[Post]) -> Iterator[Post]:
        for post in posts:
            ident = post.entries[0].incident_id
            thread = state.thread(ident) if ident is not None and post.thread is None else None
            yield replace(post, thread=thread) if thread else post

    return stage


def group(threshold: int, *, channels: bool, in_doubt: Callable[[], Mapping[int, int]] = dict) -> Stage:
    """A burst of `threshold` or more new incidents (or incidents still open as their silence
    ends): one message listing them, each one's details as a reply in its thread (a webhook has no
    threads: the summary is all). `in_doubt`: incident -> the summary a restart interrupted the
    post of; its incidents go under a short message standing for it, not into a new listing."""

    def stage(posts: Iterable[Post]) -> Iterator[Post]:
        posts = list(posts)
        fresh = [p for p in posts if announces(p)]
        doubt = in_doubt() if channels and fresh else {}
        again: dict[int, list[Post]] = {}
        for p in fresh:
            if p.entries[0].incident_id in doubt:
                again.setdefault(doubt[p.entries[0].incident_id], []).append(p)
        burst = [p for p in fresh if p.entries[0].incident_id not in doubt]
        if len(burst) < threshold:
            burst = []
        if not burst and not again:
            yield from posts
            return
        for message, some in again.items():
            yield Post(tuple(e for p in some for e in p.entries), channel=route_of(some), summary=True, repeat=message)
        if burst:
            yield Post(tuple(e for p in burst for e in p.entries), channel=route_of(burst), summary=True)
        listed = {id(p) for p in burst} | {id(p) for some in again.values() for p in some}
        for post in posts:
            if id(post) not in listed:
                yield post
            elif channels:
                yield replace(post, in_summary=True)

    def announces(post: Post) -> bool:
        return post.notice.kind in ANNOUNCES and post.notice.incident is not None and post.thread is None

    def route_of(burst: list[Post]) -> str | None:
        return max(burst, key=lambda p: SEVERITY_RANK.get(p.notice.severity or "", 0)).channel

    return stage


@dataclass
class RecentRuns:
    """The thread of each run's last alert per channel, and when it was posted."""

    seen: dict[tuple[str | None, str], tuple[str, float]] = field(default_factory=dict)

    def note(self, post: Post, thread: str, now: float) -> None:
        for notice in post.notices:
            self.seen[(post.channel, notice.run)] = (thread, now)


def cooldown(recent: RecentRuns, seconds: float, clock: Callable[[], float]) -> Stage:
    """A run that alerted in this channel a moment ago: its new incident replies in that thread,
    keeping the channel readable."""

    def stage(posts: Iterable[Post]) -> Iterator[Post]:
        for post in posts:
            if post.notice.kind == "opened" and post.thread is None and not post.summary and not post.in_summary:
                last = recent.seen.get((post.channel, post.notice.run))
                if last is not None and clock() - last[1] < seconds:
                    post = replace(post, thread=last[0])
            yield post

    return stage


def chain(sink: Sink, state: State, recent: RecentRuns, clock: Callable[[], float]) -> list[Stage]:
    """The stages one sink's posts go through: the one place the pipeline is put together."""
    m = sink.manners
    stages: list[Stage] = []
    if m.channels:
        stages += [route(m), threads(state)]
    if m.group_threshold is not None:
        stages.append(group(m.group_threshold, channels=m.channels, in_doubt=lambda: state.summaries_in_doubt(sink.name)))
    if m.channels and m.run_cooldown > 0:
        stages.append(cooldown(recent, m.run_cooldown, clock))
    return stages


class Dispatcher:
    """Delivers what the outbox holds, sink by sink, in order; an entry is marked sent as soon as
    its post is accepted (a crash then repeats at most the post in flight). A temporary failure
    ends the sink's round (order is kept; the next round retries); a permanent one is said once,
    loudly, and the entry waits in the outbox for the operator's fix (tried again at the next start
    or reload, or by `lossguard outbox retry`)."""

    def __init__(
        self, state: State, sinks: Mapping[str, Sink], *, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep, wall: Callable[[], float] = time.time,
        on_delivery: Callable[[str, bool], None] = lambda sink, ok: None, configured: Collection[str] | None = None,
    ) -> None:
        self.state = state
        self.sinks = dict(sinks)
        self.configured = set(self.sinks if configured is None else configured)
        """Every sink the daemon has (the others' dispatchers deliver theirs): an entry for a sink not
        among them is failed for good here."""
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.on_delivery = on_delivery
        """Told of every post: its sink and whether it was accepted (the daemon's metrics count them)."""
        self._recent = {name: RecentRuns() for name in self.sinks}
        self._journals = {name: Journal(state, name) for name in self.sinks}
        self._locked_said = False
        self._last_post: dict[tuple[str, str | None], float] = {}
        self._silences: list[Silence] = []

    def round(self) -> int:
        """Deliver what waits, after reporting what the silences that just ended held back."""
        now = self.wall()
        try:
            if self.state.end_silences(now):
                log.info("silences ended; what they held back and is still wrong is reported now")
        except StateBusy:
            pass  # (reported at a round that can write; the silence holds nothing meanwhile: it ended)
        self._silences = self.state.silences(now=now)
        sent = 0
        for name in self.state.pending_sinks():
            sink = self.sinks.get(name)
            if sink is None:
                if name in self.configured:
                    continue  # (delivered by the dispatcher of its own)
                self.state.mark_failed(self.state.pending(limit=10_000, sink=name), f"sink {name!r} is not configured", permanent=True)
                continue
            sent += self._drain(sink)
        return sent

    def _drain(self, sink: Sink) -> int:
        """The sink's entries in order, after the records its journal kept while the state was
        locked (until they are in the state, the sink sends nothing: see alerts.journal)."""
        sent = 0
        try:
            if not self._journals[sink.name].fold():
                self._locked(sink)
                return 0
            while entries := self.state.pending(limit=BATCH, sink=sink.name):
                taken = max(e.id for e in entries)
                full = len(entries) == BATCH
                entries = self._hold(sink, self._taken(sink, entries))
                if not entries:
                    continue  # (all held: the next batch)
                if sink.manners.channels:
                    entries = news_first(entries, listed=lambda ident: self.state.thread(ident) is not None)
                done, ok, cut = self._deliver(sink, entries, taken=taken)
                sent += done
                if not ok or not (full or cut):
                    break
        except StateBusy:
            self._locked(sink)
            return sent
        if self._locked_said:
            self._locked_said = False
            log.info("the state can be written again: delivery to %s goes on", sink.name)
        return sent

    def _locked(self, sink: Sink) -> None:
        if not self._locked_said:
            self._locked_said = True
            log.warning("the state is locked by another writer (a sqlite3 shell in a transaction?): delivery to %s waits for it; "
                        "what was delivered meanwhile is kept in %s", sink.name, self._journals[sink.name].path)

    def _settle(self, sink: Sink, op: str, entries: tuple[OutboxEntry, ...], **args: object) -> bool:
        """Record a delivered post (`op`: a State delivery write). The state locked past the wait:
        the record goes to the sink's journal, so the post is never taken for undelivered and
        sent again, and the sink's round ends (False) until the journal is folded in."""
        try:
            getattr(self.state, op)(entries, **args)
            return True
        except StateBusy:
            self._journals[sink.name].write(op, entries, **args)
            self._locked(sink)
            return False

    def _deliver(self, sink: Sink, entries: list[OutboxEntry], *, taken: int) -> tuple[int, bool, bool]:
        """The batch's posts, each recorded as it is accepted: how many entries they settled, whether
        the sink took them all (False: a temporary failure or a locked state ends its round), and
        whether the batch was cut short for news recorded since it was `taken` (the next batch
        carries that news ahead of the rest: see news_first)."""
        posts: Iterable[Post] = (Post((e,)) for e in entries)
        for stage in chain(sink, self.state, self._recent[sink.name], self.clock):
            posts = stage(posts)
        sent = 0
        for n, post in enumerate(posts):
            if n and sink.manners.channels and self._news_since(sink, taken):
                return sent, True, True  # (between two posts: what is delivered is recorded, as at a batch's end)
            if sink.manners.channels:
                post = self._at_delivery(sink, post)
            self._pace(sink, post.channel)
            intent = self._intend(sink, post)
            delivery = sink.send(post)
            self._last_post[(sink.name, post.channel)] = self.clock()
            self.on_delivery(sink.name, delivery.ok)
            if not delivery.ok:
                if intent is not None and post.repeat is None:
                    self.state.forget_message(intent)  # (refused: it did not go out)
                self._failed(sink, post.entries, delivery)
                if not delivery.permanent:
                    return sent, False, False
                continue
            done, recorded = self._record(sink, post, delivery, intent)
            if sink.name != "console":  # (the console sink's delivery is itself this line)
                for notice in post.notices:
                    log.info("sent to %s: %s", sink.name, describe(notice))
            sent += done
            if not recorded:
                return sent, False, False
        return sent, True, False

    def _news_since(self, sink: Sink, taken: int) -> bool:
        """An incident's alert recorded for the sink after its batch was taken (outbox ids grow)."""
        return self.state.waiting(sink=sink.name, kinds=STARTS_THREAD, after=taken)

    def _at_delivery(self, sink: Sink, post: Post) -> Post:
        """What only the moment of sending knows, since earlier posts of this very round may have
        made it: the thread a follow-up replies in (its alert, or the summary listing it, may
        have just been posted) and the message its news rewrites."""
        ident = post.entries[0].incident_id
        if ident is None or post.summary:
            return post
        if post.thread is None:
            post = replace(post, thread=self.state.thread(ident))
        return replace(post, rewrite=self._rewrite(sink, post.notice.kind, ident))

    def _rewrite(self, sink: Sink, kind: str, ident: int) -> Rewrite | None:
        """The incident's own alert, when its header changes (it grew into an escalation; it is
        over, and so is everything it announces), or the summary listing it (a member's state
        changed). Never a message it merely replied in."""
        if kind not in ("resolved", "escalated"):
            return None
        alert = self.state.alert_message(ident, sink.name)
        if alert is not None and alert.thread is not None:
            over = all(row.status == "resolved" or row.id == ident for row in alert.incidents)
            return Rewrite(alert.thread, alert.id, said=tuple(self.state.said(alert.thread))) if kind == "escalated" or over else None
        listed = self.state.summary_of(ident, sink.name) if kind == "resolved" else None
        if listed is None or listed.role != "summary" or listed.thread is None:
            return None
        members = tuple(Notice("opened", row.incident.run, row.incident, source=row.source) for row in listed.incidents)
        return Rewrite(listed.thread, listed.id, members)

    def _intend(self, sink: Sink, post: Post) -> int | None:
        """A summary's `messages` row, written before it is sent (a repeat's is the one in doubt)."""
        if not post.summary or not sink.manners.channels:
            return None
        return post.repeat if post.repeat is not None else self.state.intend_summary(sink.name, post.entries, now=self.wall())

    def _record(self, sink: Sink, post: Post, delivery: Delivery, intent: int | None) -> tuple[int, bool]:
        """The accepted post, recorded at once (a crash then repeats at most the post in flight):
        the entries it settled, and whether the record is in the state (not only in the journal)."""
        thread = post.thread or (f"{delivery.channel or post.channel or ''}|{delivery.ts}" if delivery.ts else None)
        if post.summary and sink.manners.channels:
            # The replies settle the entries; recorded now, a restart replies in this thread
            # instead of posting the summary again.
            if not thread:
                return 0, True
            self._recent[sink.name].note(post, thread, self.clock())
            return 0, self._settle(sink, "set_thread", post.entries, thread=thread, message=intent, repeat=post.repeat is not None)
        starts = post.notice.kind in STARTS_THREAD
        own = sink.name if sink.manners.channels and starts and post.thread is None and delivery.ts else None
        joins = post.rewrite.message if post.rewrite is not None and post.notice.kind == "escalated" else None
        recorded = self._settle(sink, "mark_sent", post.entries, now=self.wall(), thread=thread if starts else None, alert_in=own, joins=joins)
        if post.notice.kind == "opened" and thread and not post.in_summary:
            self._recent[sink.name].note(post, thread, self.clock())
        return len(post.entries), recorded

    def _hold(self, sink: Sink, entries: list[OutboxEntry]) -> list[OutboxEntry]:
        """The entries no silence covers, and the resolutions of what this sink was told (CLOSING);
        those a silence covers are settled as held by it (read at every round, so a silence added
        while the daemon runs holds the very next post)."""
        if not sink.manners.silences or not self._silences:
            return entries
        now = self.wall()
        held: dict[int, tuple[Silence, list[OutboxEntry]]] = {}
        free: list[OutboxEntry] = []
        told: set[tuple[int | None, str]] = set()  # (what this batch announces, before it is sent)
        for e in entries:
            subject = (e.incident_id, e.notice.run)
            silence = covering(self._silences, e.notice, now)
            if silence is None or (e.notice.kind in CLOSING and (subject in told or self.state.announced(e))):
                free.append(e)
                if e.notice.kind in ANNOUNCING:
                    told.add(subject)
            else:
                held.setdefault(silence.id, (silence, []))[1].append(e)
        for silence, some in held.values():
            if self.state.hold(some, silence, now=now):
                log.info("%d notification(s) to %s held back by silence %s", len(some), sink.name, silence.describe())
            else:  # (its end was reported since this round read it: it holds nothing)
                free += some
        return sorted(free, key=lambda e: e.id)

    def _taken(self, sink: Sink, entries: list[OutboxEntry]) -> list[OutboxEntry]:
        """Without the updates of incidents someone acknowledged from Slack (settled unsent: they
        took it, and watch it themselves); its resolution still goes out and closes its alert."""
        if not sink.manners.acks:
            return entries
        acked = self.state.acked([e.incident_id for e in entries if e.incident_id is not None and e.notice.kind in TAKEN_QUIET])
        quiet = tuple(e for e in entries if e.incident_id in acked and e.notice.kind in TAKEN_QUIET)
        if not quiet:
            return entries
        self.state.mark_sent(quiet, now=self.wall())
        log.info("%d update(s) to %s not posted: their incident was acknowledged (%s)", len(quiet), sink.name, ", ".join(sorted(set(acked.values()))))
        skipped = {e.id for e in quiet}
        return [e for e in entries if e.id not in skipped]

    def _pace(self, sink: Sink, channel: str | None) -> None:
        """Waits until min_interval has passed since the channel's last post was answered: counted
        from its answer, not from its start, so a post held up on its way (a slow commit of its intent,
        a busy machine) cannot arrive at Slack closer to the next one than the interval."""
        wait = self._last_post.get((sink.name, channel), -1e18) + sink.manners.min_interval - self.clock()
        if wait > 0:
            self.sleep(wait)

    def _failed(self, sink: Sink, entries: tuple[OutboxEntry, ...], delivery: Delivery) -> None:
        self.state.mark_failed(entries, delivery.describe(), permanent=delivery.permanent)
        if delivery.permanent:
            log.error(
                "cannot deliver to %s: %s; the notification stays in the outbox: it is tried again when the daemon restarts "
                "or reloads (SIGHUP), or at once with `lossguard outbox retry` (`lossguard outbox list` shows them)", sink.name, delivery.describe(),
            )
        else:
            log.warning("delivery to %s failed, will retry: %s", sink.name, delivery.describe())
