"""Where notifications go. The console sink is the default, so the daemon is useful out of the box;
the JSON-lines sink is for other tools (and for tests that count deliveries); Slack is what people
read. Each turns a Post into its own wire form; what to post, where and when is the pipeline's."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from .. import __version__
from . import message
from .delivery import Delivery, Manners, Post
from .slack import SlackBot, SlackWebhook


class ConsoleSink:
    name = "console"
    manners = Manners()

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log

    def send(self, post: Post) -> Delivery:
        for notice in post.notices:
            self.log(message.describe(notice))
        return Delivery(ok=True)


class JsonlSink:
    """Appends {"event", "id", ...incident as in the scan report, "source"} lines. Idempotent by
    outbox key (`id`: the state's random id and the entry's number, so a state started over after
    damage never reuses one): if the daemon died after writing a line but before recording it as
    sent, the retry finds the line and does not repeat it. The file is private (0600) from its
    first line: it holds run names and paths."""

    name = "jsonl"
    manners = Manners()

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: set[str] | None = None

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
        return {"event": notice.kind, "id": key, **body}

    def send(self, post: Post) -> Delivery:
        todo = [e for e in post.entries if e.key not in self._already()]
        lines = "".join(json.dumps(self.record(e.key, e.notice)) + "\n" for e in todo)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with open(fd, "a", encoding="utf-8") as fh:
                fh.write(lines)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            return Delivery(ok=False, error=f"{self.path}: {exc.strerror or exc}")
        self._already().update(e.key for e in todo)
        return Delivery(ok=True)


class SlackSink:
    """Slack, bot or webhook. The bot's messages go to routed channels, follow-ups in the incident's
    thread, and a resolution also rewrites the header of the alert that opened it."""

    name = "slack"

    def __init__(self, client: SlackBot | SlackWebhook, *, routes: tuple = (), min_interval: float = 1.0,
                 run_cooldown: float = 600.0, group_threshold: int = 3) -> None:
        self.client = client
        bot = isinstance(client, SlackBot)
        self.manners = Manners(
            channels=bot, routes=tuple(routes), channel=client.channel if bot else None,
            group_threshold=group_threshold, run_cooldown=run_cooldown if bot else 0.0, min_interval=min_interval,
        )
        self.host = socket.gethostname()
        self._own: set[str] = set()
        """ts of the alerts this process opened at the top of a channel (their headers it may rewrite)."""

    def send(self, post: Post) -> Delivery:
        text = message.summary(post.notices) if post.summary else message.for_notice(post.notice, host=self.host, version=__version__)
        if not self.manners.channels:
            return self.client.post(text)
        channel, _, ts = (post.thread or "").partition("|")
        delivery = self.client.post(text, channel=channel or post.channel, thread_ts=ts or None)
        if not delivery.ok:
            return delivery
        if post.thread is None and post.notice.kind == "opened" and delivery.ts:
            self._own.add(delivery.ts)
        if post.notice.kind in ("resolved", "escalated") and ts in self._own:
            self.client.update(text, ts=ts, channel=channel)  # the parent's header says it is over, or grew
        return delivery
