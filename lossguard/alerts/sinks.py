"""Where notifications go. The console sink is the default, so the daemon is useful out of the box;
the JSON-lines sink is for other tools (and for tests that count deliveries); Slack is what people
read; Alertmanager routes, groups and silences for many machines. Each turns a Post into its own wire form; what to post, where and when is the pipeline's."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from .. import silences
from ..escaping import printable
from ..model import Notice
from ..state import OutboxEntry, State
from ..version import __version__
from . import actions, labels, message
from .alertmanager import AlertmanagerClient
from .delivery import Delivery, Manners, Post
from .plots import Plot
from .slack import SlackBot, SlackWebhook

_log = logging.getLogger("lossguard")


class ConsoleSink:
    name = "console"
    manners = Manners()
    takes_plots = True

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log

    def send(self, post: Post) -> Delivery:
        for notice in post.notices:
            self.log(message.describe(notice))
        return Delivery(ok=True)

    def send_plot(self, plot: Plot) -> Delivery:
        self.log(f"PLOT {plot.title}: {printable(str(plot.path))}")
        return Delivery(ok=True)


class JsonlSink:
    """Appends {"event", "id", ...incident as in the scan report, "source"} lines. Idempotent by
    outbox key (`id`: the state's random id and the entry's number, so a state started over after
    damage never reuses one): if the daemon died after writing a line but before recording it as
    sent, the retry finds the line and does not repeat it. The file is private (0600) from its
    first line: it holds run names and paths. One sink serves two threads (the sender's alerts and
    the plotter's pictures): an append is one step under a lock, so neither sees the ids of the
    file half read by the other (after a restart, the alert the kill left unrecorded was
    written again)."""

    name = "jsonl"
    manners = Manners()
    takes_plots = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: set[str] | None = None
        self._torn: bool | None = None
        """The file ends in a line a kill cut short (None: not looked at yet)."""
        self._lock = threading.Lock()
        """Held from reading what the file holds to recording what was appended."""

    def _already(self) -> set[str]:
        if self._written is None:
            self._written = set()
            try:
                with open(self.path, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        try:
                            self._written.add(str(json.loads(line)["id"]))
                        except (ValueError, KeyError, TypeError):
                            continue
            except FileNotFoundError:
                pass
        return self._written

    @staticmethod
    def record(key: str, notice) -> dict:  # noqa: ANN001
        body: dict[str, object] = {"run": notice.run}
        if notice.incident is not None:
            body = {**notice.incident.to_report(), "source": notice.source}
            if notice.previous_cause is not None:
                body["previous_cause"] = notice.previous_cause
        else:
            body["step"] = notice.step
            if notice.minutes is not None:
                body["minutes"] = notice.minutes
            if notice.noisy is not None:
                body.update(notice.noisy.to_json(), message=notice.noisy.message, source=notice.source)
            if notice.kind == "stalled":
                body.update(tail=notice.tail, finished=notice.finished)
        if notice.silenced_by is not None:
            body["silenced_by"] = notice.silenced_by
        return {"event": notice.kind, "id": key, **body}

    def send(self, post: Post) -> Delivery:
        return self._append({e.key: self.record(e.key, e.notice) for e in post.entries})

    def send_plot(self, plot: Plot) -> Delivery:
        """{"event": "plot", "id", "alert": the id of the alert it shows, run, rule, metric, step, "path"}."""
        inc = plot.picture.incident
        record = {"event": "plot", "id": plot.key, "alert": plot.alert_key, "run": inc.run, "rule": inc.rule,
                  "metric": inc.metric, "step": inc.step, "path": str(plot.path)}
        return self._append({plot.key: record})

    def _append(self, records: dict[str, dict]) -> Delivery:
        with self._lock:
            return self._append_locked(records)

    def _append_locked(self, records: dict[str, dict]) -> Delivery:
        """The records not in the file yet, appended (the caller holds the lock)."""
        todo = {key: record for key, record in records.items() if key not in self._already()}
        lines = "".join(json.dumps(record) + "\n" for record in todo.values())
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if self._torn is None:
                self._torn = _ends_torn(self.path)
            if self._torn:  # a kill -9 cut the last line: the next record starts a line of its own
                lines = "\n" + lines
            with open(fd, "a", encoding="utf-8") as fh:
                fh.write(lines)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            return Delivery(ok=False, error=f"{self.path}: {exc.strerror or exc}")
        self._already().update(todo)
        self._torn = False
        return Delivery(ok=True)


def _ends_torn(path: Path) -> bool:
    """The file's last byte is not a line's end (a write a kill interrupted)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except OSError:
        return False


class SlackSink:
    """Slack, bot or webhook. The bot's messages go to routed channels, follow-ups in the incident's
    thread, and a resolution also rewrites the header of the incident's own alert (or its state in
    the summary that listed it)."""

    name = "slack"

    def __init__(self, client: SlackBot | SlackWebhook, *, routes: tuple = (), min_interval: float = 1.0,
                 run_cooldown: float = 600.0, group_threshold: int = 3, state_dir: Path | None = None, buttons: bool = False,
                 plot_button: bool = False) -> None:
        self.client = client
        self.state_dir = state_dir
        """Where the daemon keeps its state: the silence command an alert shows names it."""
        bot = isinstance(client, SlackBot)
        self.buttons = buttons and bot
        """An incident's alert carries the buttons (an app token: Socket Mode takes their clicks)."""
        self.plot_button = plot_button
        """Show the plot among them: no picture follows the alert by itself (`plots = false`)."""
        self.manners = Manners(
            channels=bot, routes=tuple(routes), channel=client.channel if bot else None,
            group_threshold=group_threshold, run_cooldown=run_cooldown if bot else 0.0, min_interval=min_interval, acks=self.buttons,
        )
        self.takes_plots = bot
        """A bot uploads an incident's picture into its thread; a webhook cannot upload files."""
        self.host = socket.gethostname()

    def send(self, post: Post) -> Delivery:
        """The post (in its thread, if it has one), then the message its news rewrites: the
        incident's own alert or the summary listing it, as the pipeline found them in the state."""
        text = self._text(post)
        if not self.manners.channels:
            return self.client.post(text)
        channel, _, ts = (post.thread or "").partition("|")
        delivery = self.client.post(text, channel=channel or post.channel, thread_ts=ts or None)
        if delivery.ok and post.rewrite is not None:
            target, _, target_ts = post.rewrite.thread.partition("|")
            rewritten = message.summary(post.rewrite.summary) if post.rewrite.summary else replace(text, blocks=actions.said_in(text.blocks, post.rewrite.said))
            self.client.update(rewritten, ts=target_ts, channel=target)
        return delivery

    def _text(self, post: Post) -> message.Message:
        if post.repeat is not None:
            return message.summary_again(len(post.entries))
        if post.summary:
            return message.summary(post.notices)
        hint = silences.command_for(post.notice, state_dir=None if self.state_dir is None else str(self.state_dir))
        entry = post.entries[0]
        buttons = None
        if self.buttons and entry.incident_id is not None:
            buttons = actions.buttons(actions.key_of(entry.key.rpartition("-")[0], entry.incident_id), plot=self.plot_button)
        return message.for_notice(post.notice, host=self.host, version=__version__, silence=hint, actions=buttons)

    def send_plot(self, plot: Plot) -> Delivery:
        """Into the incident's thread (where its alert went: its own message, a burst's summary or
        the run's recent alert)."""
        if not isinstance(self.client, SlackBot) or not plot.thread:
            return Delivery(ok=False, error="no thread to upload the plot into", permanent=True)
        channel, _, ts = plot.thread.partition("|")
        return self.client.upload(plot.path, channel=channel, thread_ts=ts, title=plot.title)


class AlertmanagerSink:
    """Alertmanager: every notice becomes the alert of its incident (or stalled run), posted to every
    replica; a resolution or a resume resolves it. Alertmanager forgets an alert not posted again
    within its resolve_timeout (and all of them when it restarts: it keeps no alerts on disk), so
    `resend` posts whatever is still firing every `resend_interval`, and at once after a start.

    The re-send reads the open incidents and stalled runs from the state rather than re-queueing
    them in the outbox: what fires is already there, committed with the pass that found it, so a
    kill -9 loses nothing and the outbox stays a log of changes (at least once each), not a
    heartbeat that grows every minute. It runs after the delivery round on the same thread, so a
    resolution committed since is never overtaken by a stale firing post."""

    name = "alertmanager"
    manners = Manners(silences=False)

    def __init__(self, client: AlertmanagerClient, *, host: str | None = None, extra_labels: Mapping[str, str] = {},  # noqa: B006
                 resend_interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.host = host or socket.gethostname()
        self.extra = dict(extra_labels)
        self.resend_interval = resend_interval
        self.clock = clock
        self._due = -1e18
        self._failing = False
        self._refused: set[tuple] = set()
        """Label sets of firing alerts refused for good at a re-send, already said."""

    def alert_of(self, entry: OutboxEntry) -> dict[str, object]:
        notice = entry.notice
        created = entry.created
        if notice.incident is None:  # a run: it stopped `minutes` before the notice
            starts = created - (notice.minutes or 0) * 60
        else:
            starts = entry.opened_at if entry.opened_at is not None else created
        ends = created if notice.kind in labels.RESOLVING else None
        return labels.alert(notice, starts=starts, ends=ends, host=self.host, extra=self.extra)

    def send(self, post: Post) -> Delivery:
        # A noisy run's notice says how a rule fits a run: no alert fires, and none is posted.
        alerts = [self.alert_of(e) for e in post.entries if e.notice.kind != "noisy"]
        return self.client.post(alerts) if alerts else Delivery(ok=True)

    def resend(self, state: State) -> Delivery | None:
        """Post what still fires, if `resend_interval` passed since the last time (None: not due,
        or nothing fires). A failure is tried again within 10 s, said once until it works."""
        now = self.clock()
        if now < self._due:
            return None
        incidents, runs = state.firing()
        alerts = [
            labels.alert(Notice("opened", row.incident.run, row.incident, source=row.source), starts=row.opened_at or row.notified_at or time.time(),
                         ends=None, host=self.host, extra=self.extra)
            for row in incidents
        ] + [
            labels.alert(Notice("stalled", run.run, step=run.last_step), starts=run.advanced_at or time.time(), ends=None, host=self.host, extra=self.extra)
            for run in runs
        ]
        self._due = now + self.resend_interval
        if not alerts:
            return None
        sent = self.client.post_batches(alerts)
        self._say_refused(sent)
        failed = next((d for _, d in sent if not d.ok and not d.permanent), None)
        if failed is not None:
            self._due = now + min(self.resend_interval, 10.0)
            if not self._failing:
                _log.warning("re-sending %d firing alert(s) to alertmanager failed, will retry: %s", len(alerts), failed.describe())
        elif self._failing:
            _log.info("re-sending firing alerts to alertmanager works again")
        self._failing = failed is not None
        refused = [d for _, d in sent if not d.ok]
        return failed or (refused[0] if refused else Delivery(ok=True))

    def _say_refused(self, sent: list[tuple[list[dict], Delivery]]) -> None:
        """Alerts refused for good (a malformed one, a body a proxy will not take) are said once, in
        one line naming them, until they are accepted again; the other batches went their own way."""
        new: list[dict] = []
        why = None
        for batch, delivery in sent:
            keys = {_identity(a) for a in batch}
            if delivery.ok:
                self._refused -= keys
            elif delivery.permanent and not keys <= self._refused:
                self._refused |= keys
                new += batch
                why = why or delivery
        if why is not None:
            names = ", ".join(printable(f"{a['labels'].get('alertname')} run={a['labels'].get('run')}") for a in new[:5])
            more = f" and {len(new) - 5} more" if len(new) > 5 else ""
            _log.warning("alertmanager refused %d firing alert(s) for good (%s%s), the others are re-sent: %s", len(new), names, more, why.describe())


def _identity(alert: dict) -> tuple:
    """An alert's identity for Alertmanager: its label set."""
    return tuple(sorted(alert["labels"].items()))


def alertmanager_client(settings, urls: list[str] | None = None) -> AlertmanagerClient:  # noqa: ANN001
    """A client for the configured replicas (or for `urls` of them), with the configured credentials."""
    secret = lambda value: None if value is None else value.get_secret_value()  # noqa: E731
    return AlertmanagerClient(
        settings.alertmanager_urls if urls is None else urls, username=settings.alertmanager_username,
        password=secret(settings.alertmanager_password), bearer_token=secret(settings.alertmanager_bearer_token),
        ca_file=settings.alertmanager_ca_file,
    )


def alertmanager_sink(settings) -> AlertmanagerSink:  # noqa: ANN001
    """The Alertmanager sink the settings describe (settings.alertmanager_urls is not empty)."""
    return AlertmanagerSink(alertmanager_client(settings), host=settings.alertmanager_host, extra_labels=settings.alertmanager_extra_labels,
                            resend_interval=settings.alertmanager_resend_interval)
