"""Where notifications go. Every sink answers with a Delivery (alerts.slack): only a confirmed
delivery marks an outbox entry sent. The console sink is the default, so the daemon is useful out
of the box; the JSON-lines sink is for other tools (and for tests that count deliveries)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .alerts.message import MAX_SECTION, Message, build, cut_lines, escape
from .alerts.slack import Delivery, SlackBot, SlackWebhook
from .follow import incident_from_json


def _describe(kind: str, payload: dict) -> str:
    if kind in ("stalled", "resumed"):
        extra = f" after {payload.get('minutes')} min without a new step" if kind == "stalled" else ""
        return f"{kind.upper()} run {payload['run']} at step {payload.get('step')}{extra}"
    cause = payload["causes"][0]["cause"] if payload.get("causes") else "unknown"
    return (
        f"{kind.upper()} [{payload['severity']}] run {payload['run']}: {payload['metric']} spike at step {payload['step']} "
        f"(peak {payload['value']} at {payload['peak_step']}, baseline {payload['baseline']}, rule {payload['rule']}); likely {cause}"
    )


class ConsoleSink:
    name = "console"

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log

    def deliver(self, kind: str, payload: dict, *, thread: str | None = None, outbox_id: int | None = None) -> Delivery:
        self.log(_describe(kind, payload))
        return Delivery(ok=True)


class JsonlSink:
    """Appends {"event", "id", ...incident} lines. Idempotent by outbox id: if the daemon died after
    writing a line but before recording it as sent, the retry finds the line and does not repeat it."""

    name = "jsonl"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: set[int] | None = None

    def _already(self) -> set[int]:
        if self._written is None:
            self._written = set()
            try:
                with open(self.path, encoding="utf-8") as fh:
                    for line in fh:
                        try:
                            self._written.add(int(json.loads(line)["id"]))
                        except (ValueError, KeyError, TypeError):
                            continue
            except FileNotFoundError:
                pass
        return self._written

    def deliver(self, kind: str, payload: dict, *, thread: str | None = None, outbox_id: int | None = None) -> Delivery:
        if outbox_id is not None and outbox_id in self._already():
            return Delivery(ok=True)
        record = {"event": kind, "id": outbox_id, **{k: v for k, v in payload.items() if k != "sink"}}
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            return Delivery(ok=False, error=f"{self.path}: {exc.strerror or exc}")
        if outbox_id is not None:
            self._already().add(outbox_id)
        return Delivery(ok=True)


class SlackSink:
    """Slack, with the manners a busy channel needs: routing by severity and run, about one message a
    second per channel, follow-ups in the incident's thread (the parent's header updated on
    resolution), a run's new incidents threaded under its last alert for `run_cooldown` seconds, and
    a burst of new incidents sent as one message listing them (`deliver_group`)."""

    name = "slack"

    def __init__(
        self,
        client: SlackBot | SlackWebhook,
        *,
        routes: tuple = (),
        min_interval: float = 1.0,
        run_cooldown: float = 600.0,
        group_threshold: int = 3,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.routes = tuple(routes)
        self.min_interval = min_interval
        self.run_cooldown = run_cooldown
        self.group_threshold = group_threshold
        self.clock = clock
        self.sleep = sleep
        self.host = socket.gethostname()
        self._last_post: dict[str, float] = {}
        self._recent_run: dict[str, tuple[str, str, float]] = {}
        self._own: set[str] = set()

    @property
    def threads(self) -> bool:
        return isinstance(self.client, SlackBot)

    def channel_for(self, payload: dict) -> str | None:
        if not self.threads:
            return None
        for route in self.routes:
            if route.matches(payload.get("severity"), payload.get("run", "")):
                return route.channel
        return self.client.channel

    def _pace(self, channel: str | None) -> None:
        key = channel or "webhook"
        wait = self._last_post.get(key, -1e9) + self.min_interval - self.clock()
        if wait > 0:
            self.sleep(wait)
        self._last_post[key] = self.clock()

    def _post(self, message: Message, *, channel: str | None, thread_ts: str | None = None) -> Delivery:
        self._pace(channel)
        if self.threads:
            return self.client.post(message, channel=channel, thread_ts=thread_ts)
        return self.client.post(message)

    def _message(self, kind: str, payload: dict) -> Message:
        if kind in ("stalled", "resumed"):
            text = escape(_describe(kind, payload))
            return Message(text, ({"type": "section", "text": {"type": "mrkdwn", "text": text}},))
        inc = incident_from_json(payload)
        return build(inc, event=kind, host=self.host, source=payload.get("source", ""), version=__version__)

    def deliver(self, kind: str, payload: dict, *, thread: str | None = None, outbox_id: int | None = None) -> Delivery:
        message = self._message(kind, payload)
        if not self.threads:
            return self._post(message, channel=None)
        if kind == "opened":
            run = payload.get("run", "")
            channel = self.channel_for(payload)
            recent = self._recent_run.get(f"{channel}|{run}")
            if recent and self.clock() - recent[2] < self.run_cooldown:
                # The run alerted in this channel a moment ago: keep the channel readable, reply there.
                target, ts, _ = recent
                delivery = self._post(message, channel=target, thread_ts=ts)
                return Delivery(ok=delivery.ok, ts=ts if delivery.ok else None, channel=target, error=delivery.error, permanent=delivery.permanent, fix=delivery.fix)
            delivery = self._post(message, channel=channel)
            if delivery.ok and delivery.ts:
                self._recent_run[f"{channel}|{run}"] = (delivery.channel or channel, delivery.ts, self.clock())
                self._own.add(delivery.ts)
            return delivery
        if thread:
            channel, _, ts = thread.partition("|")
            delivery = self._post(message, channel=channel, thread_ts=ts)
            if delivery.ok and kind == "resolved" and ts in self._own:
                # The parent's header says it is over (its blocks are rebuilt as "resolved").
                self.client.update(message, ts=ts, channel=channel)
            return delivery
        return self._post(message, channel=self.channel_for(payload))

    def deliver_group(self, payloads: list[dict]) -> tuple[Delivery, list[Delivery]]:
        """One message listing several new incidents, each one's details in its thread."""
        lines = []
        for p in payloads:
            cause = p["causes"][0]["cause"].replace("_", " ") if p.get("causes") else "unknown"
            lines.append(f"• {escape(p['run'])}: {escape(p['metric'])} spike at step {p['step']} ({p['severity']}), likely {escape(cause)}")
        text = f"{len(payloads)} new spikes:\n" + "\n".join(lines)
        channel = self.channel_for(max(payloads, key=lambda p: {"info": 0, "warning": 1, "critical": 2}.get(p.get("severity"), 0)))
        summary = Message(text, ({"type": "section", "text": {"type": "mrkdwn", "text": cut_lines(text, MAX_SECTION)}},))
        parent = self._post(summary, channel=channel)
        if not parent.ok or not self.threads:
            return parent, []
        target = parent.channel or channel
        replies = [self._post(self._message("opened", p), channel=target, thread_ts=parent.ts) for p in payloads]
        for p in payloads:
            self._recent_run[f"{channel}|{p.get('run', '')}"] = (target, parent.ts, self.clock())
        return parent, replies
