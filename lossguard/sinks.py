"""Where notifications go. Every sink answers with a Delivery (alerts.slack): only a confirmed
delivery marks an outbox entry sent. The console sink is the default, so the daemon is useful out
of the box; the JSON-lines sink is for other tools (and for tests that count deliveries)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .alerts.message import Message, build
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
    name = "slack"

    def __init__(self, client: SlackBot | SlackWebhook) -> None:
        self.client = client
        self.host = socket.gethostname()

    def _message(self, kind: str, payload: dict) -> Message:
        if kind in ("stalled", "resumed"):
            text = _describe(kind, payload).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            return Message(text, ({"type": "section", "text": {"type": "mrkdwn", "text": text}},))
        inc = incident_from_json(payload)
        return build(inc, event=kind, host=self.host, source=payload.get("source", ""), version=__version__)

    def deliver(self, kind: str, payload: dict, *, thread: str | None = None, outbox_id: int | None = None) -> Delivery:
        message = self._message(kind, payload)
        if isinstance(self.client, SlackBot) and thread and kind != "opened":
            delivery = self.client.post(message, thread_ts=thread)
            if delivery.ok and kind == "resolved":
                channel, _, ts = thread.partition("|")
                self.client.update(self._message("resolved", payload), ts=ts or channel, channel=channel if ts else self.client.channel)
            return delivery
        return self.client.post(message)
