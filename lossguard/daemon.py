"""`lossguard watch`: watchdog and APScheduler around the same engine `scan` runs.

The watchdog handler only notes that something changed and asks for a pass now; the real work runs
in one scheduler job (one instance at a time, missed runs coalesced), which also runs every poll
interval because inotify sees nothing on NFS/Lustre. Delivery runs in its own job, so a slow Slack
never holds up reading. The main thread waits for signals and pings systemd's watchdog.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from .errors import LossguardError
from .follow import Follower
from .reader import ReadOptions
from .rules import RuleSet
from .sdnotify import Notifier
from .state import State

log = logging.getLogger("lossguard")
DEBOUNCE = 0.2


class _Changed(FileSystemEventHandler):
    def __init__(self, wake: callable) -> None:
        self.wake = wake

    def on_any_event(self, event) -> None:  # noqa: ANN001
        # Our own reads raise "opened" and "closed_no_write" events: reacting to them would spin.
        if event.event_type in ("modified", "created", "moved", "deleted", "closed"):
            self.wake()


def _grouped(state: State, sinks: dict, *, now: float) -> int:
    """A burst of new incidents for a sink that groups: one message listing them all."""
    sent = 0
    for name, sink in sinks.items():
        threshold = getattr(sink, "group_threshold", None)
        if threshold is None:
            continue
        burst = [r for r in state.pending(limit=1000) if r[2] == "opened" and json.loads(r[3]).get("sink") == name]
        if len(burst) < threshold:
            continue
        parent, replies = sink.deliver_group([json.loads(r[3]) for r in burst])
        if not parent.ok:
            for r in burst:
                state.mark_failed(r[0], parent.describe(), permanent=parent.permanent)
            continue
        with state.transaction() as db:
            for r, reply in zip(burst, replies or [parent] * len(burst)):
                db.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1 WHERE id=?", (now, r[0]))
                if parent.ts and r[1] is not None:
                    db.execute("UPDATE incidents SET thread=? WHERE id=?", (f"{parent.channel or ''}|{parent.ts}", r[1]))
        sent += len(burst)
    return sent


def deliver(state: State, sinks: dict, *, now: float) -> int:
    """Send what the outbox holds; an entry is marked sent only once its sink confirmed it."""
    sent = _grouped(state, sinks, now=now)
    for outbox_id, incident_id, kind, payload, attempts in state.pending():
        data = json.loads(payload)
        sink = sinks.get(data.get("sink"))
        if sink is None:
            state.mark_failed(outbox_id, f"sink {data.get('sink')!r} is not configured", permanent=True)
            continue
        thread = None
        if incident_id is not None:
            row = state.db.execute("SELECT thread FROM incidents WHERE id=?", (incident_id,)).fetchone()
            thread = row[0] if row else None
        delivery = sink.deliver(kind, data, thread=thread, outbox_id=outbox_id)
        if delivery.ok:
            with state.transaction() as db:
                db.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1 WHERE id=?", (now, outbox_id))
                if kind == "opened" and delivery.ts and incident_id is not None:
                    db.execute("UPDATE incidents SET thread=? WHERE id=?", (f"{delivery.channel or ''}|{delivery.ts}", incident_id))
            sent += 1
            continue
        state.mark_failed(outbox_id, delivery.describe(), permanent=delivery.permanent)
        if delivery.permanent:
            log.error("cannot deliver to %s: %s; the notification stays in the outbox (see `lossguard status`)", sink.name, delivery.describe())
        else:
            log.warning("delivery to %s failed, will retry: %s", sink.name, delivery.describe())
            break  # keep the order: try again on the next round
    return sent


class Daemon:
    def __init__(
        self,
        roots: list[Path],
        *,
        rules_loader: callable,
        state_dir: Path,
        sinks: dict,
        options: ReadOptions,
        poll_interval: float = 2.0,
        polling: bool = False,
        stall_after: float = 1800.0,
    ) -> None:
        self.roots = roots
        self.rules_loader = rules_loader
        self.poll_interval = poll_interval
        self.polling = polling
        self.notifier = Notifier()
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.state = State(state_dir, log=log.error)
        self.outbox = self.state.secondary()
        self.sinks = sinks
        rules: RuleSet = rules_loader()
        self.follower = Follower(roots, rules=rules, state=self.state, options=options, sinks=list(sinks), stall_after=stall_after, log=log.info)
        self.scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None})
        self.lock = threading.Lock()
        self._wake_pending = False

    def _pass(self) -> None:
        self._wake_pending = False
        if self.reload.is_set():
            self.reload.clear()
            try:
                self.follower.rules = self.rules_loader()
                log.info("rules reloaded (%d rules)", len(self.follower.rules.rules))
            except LossguardError as exc:
                log.error("new rules rejected, the old ones stay in force: %s", exc)
        with self.lock:
            try:
                report = self.follower.run_pass(time.time())
            except Exception:  # noqa: BLE001 - input must never kill the daemon
                log.exception("pass failed; will try again")
                return
        if report.notices:
            self.scheduler.modify_job("send", next_run_time=datetime.now())

    def _send(self) -> None:
        # Its own connection and no shared lock: a slow Slack never holds up reading the logs.
        try:
            deliver(self.outbox, self.sinks, now=time.time())
        except Exception:  # noqa: BLE001
            log.exception("delivery round failed; will try again")

    def wake(self) -> None:
        """A file changed: pass soon. Wakes within DEBOUNCE coalesce, so a run writing 1,000 lines a
        second costs a few passes a second, not one per write."""
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            self.scheduler.modify_job("follow", next_run_time=datetime.now() + timedelta(seconds=DEBOUNCE))
        except Exception:  # noqa: BLE001 - scheduler shutting down
            pass

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, lambda *_: (self.reload.set(), self.wake()))
        self.scheduler.add_job(self._pass, "interval", seconds=self.poll_interval, id="follow", next_run_time=datetime.now())
        self.scheduler.add_job(self._send, "interval", seconds=max(1.0, self.poll_interval), id="send")
        observer = None
        if not self.polling:
            observer = Observer()
            handler = _Changed(self.wake)
            for root in self.roots:
                if root.exists():
                    observer.schedule(handler, str(root if root.is_dir() else root.parent), recursive=True)
            observer.start()
        self.scheduler.start()
        log.info("following %s (%s, every %.1fs)", ", ".join(map(str, self.roots)), "polling" if self.polling else "inotify + polling", self.poll_interval)
        self.notifier.send("READY=1")
        ping = self.notifier.watchdog_interval or 1.0
        while not self.stop.wait(timeout=min(ping, 1.0)):
            if self.notifier.watchdog_interval:
                self.notifier.send("WATCHDOG=1")
        self.notifier.send("STOPPING=1")
        log.info("stopping: finishing the current pass")
        if observer is not None:
            observer.stop()
        self.scheduler.shutdown(wait=True)
        with self.lock:
            self.state.close()
        self.outbox.close()
        if observer is not None:
            observer.join(timeout=5)
        return 0


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger("lossguard")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: already running" is by design
