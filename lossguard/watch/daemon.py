"""`lossguard watch`: watchdog and APScheduler around the same engine `scan` runs.

The watchdog handler only notes that something changed and asks for a pass now; the real work runs
in one scheduler job (one instance at a time, missed runs coalesced), which also runs every poll
interval because inotify sees nothing on NFS/Lustre. Delivery runs in its own job, so a slow Slack
never holds up reading. The main thread waits for signals and pings systemd's watchdog.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from ..alerts.pipeline import Dispatcher
from ..alerts.link import slack_link
from ..alerts.plots import Plotter, takes_plots
from ..errors import LossguardError
from ..escaping import printable, printable_lines
from .follow import Follower
from .inotify import watch
from .metrics import TEXTFILE_EVERY, Metrics
from .mirrors import Mirrors, local_roots
from .mounts import remote_roots
from ..ingest.reader import ReadOptions
from ..ingest.sources import sqlite_db
from ..redact import scrub
from ..detection.rules import RuleSet
from .sdnotify import Notifier
from ..state import State, StateBusy

log = logging.getLogger("lossguard")
DEBOUNCE = 0.1
BUSY_SPACING = 0.5
BUSY_ROWS = 100
"""After a pass that found at least BUSY_ROWS new values (a fast writer), the next starts no
sooner than BUSY_SPACING after it. A pass costs ~20 ms of polars calls whatever it reads, so a run
writing 1,000 steps a second costs two passes a second, and its alerts still go out within a
second (the spacing plus one pass). Hundreds of busy runs make a pass of ~0.15-0.3 s (all runs are
read and judged together, ~0.5 ms a run): the spacing plus that pass is what their alerts wait, so
the spacing is 0.5 s, not the 0.8 s one fast run could afford. A run writing now and then gets its
pass DEBOUNCE after the write."""
DUTY = 0.5
"""The share of a core passes may take back to back: after a pass that used T seconds of CPU the
next starts no sooner than T / DUTY after it. Only very many busy runs make passes that long (~0.5 ms a run here):
their alerts then come every couple of seconds instead of the daemon taking the whole core."""
SLOW_PASS = 1.0
RECORD_WAIT = 2.0
"""Seconds a sender waits for the state's write lock to record a delivered post (a pass holds it a
few ms, while it judges and commits) before it keeps the record in its journal instead."""
MAX_DIRTY = 10_000
KILL_AT = "LOSSGUARD_TEST_KILL_AT"
"""A test hook: `before-first-commit` makes the daemon SIGKILL itself as its first pass is about to
commit, so the tests can drive that crash window deterministically instead of hoping to hit it."""


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
        rescan_interval: float = 300.0,
        stall_after: float = 1800.0,
        crash_after: float = 120.0,
        metrics: Callable[[Path, list[str]], Metrics] | None = None,
        plots: bool = True,
        slack_app: dict | None = None,
    ) -> None:
        """`slack_app`: app_token, base_url, bot (a SlackBot of its own) and actors, when the
        buttons on alerts are on: their clicks come down a Socket Mode link on a thread of its own."""
        self.mirrors = Mirrors.of(roots, state_dir=state_dir, poll_interval=poll_interval, log=log.info, warn=log.warning)
        self.given, self.roots, self.watched = [str(r) for r in roots], *local_roots(roots, self.mirrors)
        self.rules_loader = rules_loader
        self.poll_interval = poll_interval
        self.polling = polling
        self.rescan_interval = rescan_interval
        self.notifier = Notifier()
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.state = State(state_dir, log=log.warning)
        # (Built once the state exists: the metrics read it on a read-only connection of their own.)
        self.metrics = metrics(self.state.path, list(sinks)) if metrics else None
        # A dispatcher, a connection and a job for each sink: a sink that hangs (Slack timing out,
        # retried for a minute) delays no other (Alertmanager). A dispatcher waits RECORD_WAIT at
        # most for the state's write lock to record a delivery (then journals it: alerts.journal).
        on_delivery = {"on_delivery": self.metrics.health.delivery} if self.metrics else {}
        self.dispatchers = {
            name: Dispatcher(self.state.secondary(lock_wait=RECORD_WAIT), {name: sink}, configured=list(sinks), **on_delivery)
            for name, sink in sinks.items()
        }
        plot_sinks = [name for name, sink in sinks.items() if plots and takes_plots(sink)]
        # A job and a connection of its own: a drawing (~1 s, in a child process) or an upload is
        # not something the next alert waits for; a picture goes out after its alert was delivered.
        self.plotter = Plotter(self.state.secondary(), sinks, directory=state_dir / "plots") if plot_sinks else None
        rules: RuleSet = rules_loader()
        self.follower = Follower(self.roots, rules=rules, state=self.state, options=options, sinks=list(sinks), plot_sinks=plot_sinks,
                                 stall_after=stall_after, crash_after=crash_after, log=log.info, warn=log.warning, clock=time.monotonic,
                                 shown=self.mirrors.shown if self.mirrors else None,
                                 answered=self.mirrors.answered if self.mirrors else None,
                                 written=[state_dir, *(sink.path for sink in sinks.values() if isinstance(getattr(sink, "path", None), Path))])
        self.follower.budget.wake = self.note  # a slow read, left running by a pass, is done
        if os.environ.get(KILL_AT) == "before-first-commit":
            self.follower.before_commit = lambda: self.follower.first_pass and os.kill(os.getpid(), signal.SIGKILL)
        self._link_states: list[State] = []
        self.link = None if slack_app is None else self._slack_link(slack_app)
        # A thread for every job that may run at once (a pass, each sink's round, the plots, the
        # metrics file, spare): APScheduler's pool of 10 would let ten hanging sinks starve the passes.
        self.scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(len(self.dispatchers) + 4)},
                                             job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None})
        self.lock = threading.Lock()
        self._wake_pending = False
        self._dirty: set[str] = set()
        self._tree_changed = False
        self._dirty_lock = threading.Lock()
        self._send_asked: set[str] = set()
        """Sinks asked for a round (news committed) since their round began: APScheduler skips a
        run that comes due while one is running, so the round itself goes again for them."""
        # Held around every modify_job from a job or watchdog thread, and taken by run() before the
        # scheduler shuts down: APScheduler's shutdown(wait=True) holds the lock modify_job needs
        # while it waits for the running pass, so a pass asking for a run then would wait forever.
        self._scheduling = threading.RLock()  # (re-entrant: SIGHUP's handler wakes from the main thread)
        self._closing = False
        self._retry_due: str | None = None
        """A start's or reload's retry of what failed permanently, which met a locked state."""
        self._events = 0
        self._last_start = 0.0
        self._last_walk = 0.0
        self._busy = False
        self._last_cpu = 0.0
        self._slow_said = -1e9
        self.every = poll_interval

    def _slack_link(self, slack_app: dict):  # noqa: ANN202
        """The Socket Mode link taking the clicks on alerts: they are applied on a connection of
        their own, the link's status written on another."""
        self._link_states = [self.state.secondary(lock_wait=5.0), self.state.secondary(lock_wait=2.0)]
        return slack_link(
            **slack_app, state=self._link_states[0], status_state=self._link_states[1],
            rules=lambda: [(r.name, r.metric) for r in (*self.follower.rules.rules, *self.follower.rules.crashes)],
        )

    def _pass(self) -> None:
        """The follow job: a pass, then at once another over the files it read only in part (a long
        history is read a block per pass). APScheduler runs one instance at a time and *skips* a
        run that comes due while one is running, so a wake during the pass is asked for again as
        the pass ends: before, it was lost until the next poll interval (10 s), which a pass longer
        than DEBOUNCE (many busy runs) made the rule rather than the exception."""
        unfinished = self._one_pass()
        while unfinished and not self.stop.is_set():
            with self._dirty_lock:
                self._dirty.update(unfinished)
            unfinished = self._one_pass()
        with self._dirty_lock:
            again, self._wake_pending = self._wake_pending, False
        if again:
            self.wake()

    def _one_pass(self) -> list[str]:
        with self._dirty_lock:
            changed, self._dirty = self._dirty, set()
            tree_changed, self._tree_changed = self._tree_changed, False
            self._wake_pending = False
            events, self._events = self._events, 0
        started, cpu, spent = time.monotonic(), time.thread_time(), time.process_time()
        self._last_start = started
        # A walk when the tree changed (or on reload) and every `self.every` seconds; otherwise only
        # the files inotify named. A timer pass with nothing named still looks for stalled runs.
        walk = tree_changed or started - self._last_walk >= self.every * 0.95
        if self.reload.is_set():
            self.reload.clear()
            try:
                self.follower.rules = self.rules_loader()
                log.info("rules reloaded (%d rules)", len(self.follower.rules.rules) + len(self.follower.rules.crashes))
            except LossguardError as exc:
                log.error("new rules rejected, the old ones stay in force: %s", exc)
            self._retry_failed("reload")
        elif self._retry_due is not None:
            self._retry_failed(self._retry_due)
        if walk and self.mirrors is not None:
            self.mirrors.sync(time.monotonic())  # (outside the lock: a slow store holds up no delivery record)
        with self.lock:
            try:
                report = self.follower.run_pass(time.time(), None if walk else changed)
            except StateBusy as exc:  # (the walk and the reads were done: they are read again)
                log.warning("%s; this pass's findings wait for the next pass", exc)
                with self._dirty_lock:
                    self._tree_changed = True
                return []
            except Exception:  # noqa: BLE001 - input must never kill the daemon
                log.exception("pass failed; will try again")
                with self._dirty_lock:
                    self._tree_changed = True  # what this pass was told is lost with it: walk next time
                return []
        log.debug(
            "pass: %d inotify events, %s, %d files read, %d rows, %d notices, %.1f ms (%.1f ms CPU)",
            events, "walked" if report.walked else f"{len(changed)} named", report.files, report.rows, len(report.notices),
            (time.monotonic() - started) * 1e3, (time.thread_time() - cpu) * 1e3,
        )
        if self.metrics is not None:
            self.metrics.health.passed(time.monotonic() - started, problems=report.problems)
        self._busy = report.rows >= BUSY_ROWS
        if not report.walked:  # (a walk is rare, and the first one reads whatever history there is)
            took = time.monotonic() - started
            # The duty is a share of a core: the CPU the pass used (its polars threads too), not the
            # time it took, which a busy box stretches (waiting for a core is no cost of ours).
            self._last_cpu = time.process_time() - spent
            if took > SLOW_PASS and started - self._slow_said > 600:
                self._slow_said = started
                log.warning(
                    "a pass over %d files took %.1f s (%.1f s of CPU): passes now come every %.1f s, so alerts can be that late (said at most every 10 minutes)",
                    report.files, took, self._last_cpu, max(BUSY_SPACING, self._last_cpu / DUTY),
                )
        if report.walked:
            self._last_walk = started
        if report.notices:
            self._send_now()
        return report.unfinished

    def _retry_failed(self, why: str) -> None:
        """A permanent failure (a revoked token, a missing channel) is fixed in the config, which a
        start or reload is the sign of: its notifications go back in line rather than wait forever."""
        self._retry_due = None
        try:
            with self.lock:
                n = self.state.retry()
        except StateBusy as exc:  # (an outside writer: asked again by the next pass, not forgotten)
            log.warning("%s; what failed permanently is put back in line at the next pass", exc)
            self._retry_due = why
            return
        if n:
            log.warning("%d notification(s) that failed permanently before are tried again (%s)", n, why)
        if why == "reload":
            self._send_now()

    def _send(self, name: str) -> None:
        """A sink's delivery round, and at once another while news was committed during it: an
        alert recorded while Slack was answering the round before goes out as that round ends, not
        a round interval (10 s) later."""
        while True:
            with self._dirty_lock:
                self._send_asked.discard(name)
            self._round(name)
            with self._dirty_lock:
                if name not in self._send_asked or self.stop.is_set():
                    return

    def _round(self, name: str) -> None:
        # Its own connection and no shared lock: a slow Slack never holds up reading the logs, nor
        # another sink's delivery.
        dispatcher = self.dispatchers[name]
        try:
            if dispatcher.round() and self.plotter is not None:
                self._schedule("plots", 0.0)
            # After the round, on this thread: a resolution delivered just now is not followed by
            # a firing post read before it was committed (AlertmanagerSink.resend).
            sink = dispatcher.sinks[name]
            if hasattr(sink, "resend"):
                sink.resend(dispatcher.state)
        except Exception:  # noqa: BLE001
            log.exception("delivery round to %s failed; will try again", name)

    def _plots(self) -> None:
        try:
            while self.plotter.round() and not self.stop.is_set():
                pass
        except Exception:  # noqa: BLE001
            log.exception("sending plots failed; will try again")

    def note(self, path: str | None) -> None:
        """inotify saw `path` change (None: files or folders came or went)."""
        with self._dirty_lock:
            self._events += 1
            if path is None or len(self._dirty) >= MAX_DIRTY:
                self._tree_changed = True
            else:
                self._dirty.add(path)
        self.wake()

    def wake(self) -> None:
        """Pass soon. Wakes coalesce until the pass starts; after a busy pass, passes keep
        BUSY_SPACING apart, so a run writing 1,000 lines a second costs two passes a second, not
        one per write."""
        with self._dirty_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        spacing = max(BUSY_SPACING if self._busy else 0.0, self._last_cpu / DUTY)
        delay = max(DEBOUNCE, self._last_start + spacing - time.monotonic())
        self._schedule("follow", delay)

    def _send_now(self) -> None:
        with self._dirty_lock:
            self._send_asked.update(self.dispatchers)
        for name in self.dispatchers:
            self._schedule(f"send:{name}", 0.0)

    def _schedule(self, job: str, delay: float) -> None:
        with self._scheduling:
            if self._closing:
                return
            try:
                self.scheduler.modify_job(job, next_run_time=datetime.now() + timedelta(seconds=delay))
            except Exception:  # noqa: BLE001 - the scheduler is not running (yet, or any more)
                pass

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, lambda *_: (self.reload.set(), self.note(None)))
        remote = {} if self.polling else remote_roots(self.watched)
        for root, fstype in remote.items():
            log.warning("%s is on %s: inotify cannot see other machines' writes there; rescanning every %.1fs", root, fstype, self.poll_interval)
        if self.mirrors is not None:
            self.mirrors.show_in(logging.getLogger("lossguard"))
        # Polling (asked for, a remote root, an object store) walks every poll interval; with inotify
        # alone the walk is a rare safety net, and the passes inotify starts read only the files it named.
        polled = self.polling or remote or self.mirrors is not None
        self.every = self.poll_interval if polled else max(self.poll_interval, self.rescan_interval)
        self._retry_failed("start")
        if stale := sqlite_db.remove_stale_copies():
            log.info("removed %d private copy folder(s) of tracker databases that a process killed while reading left in %s", stale, tempfile.gettempdir())
        self.scheduler.add_job(self._pass, "interval", seconds=self.poll_interval, id="follow", next_run_time=datetime.now())
        # The first round at once: what waits in the outbox, and (Alertmanager) what still fires,
        # goes out as the daemon starts, not an interval later.
        for name in self.dispatchers:
            self.scheduler.add_job(self._send, "interval", args=(name,), seconds=max(1.0, min(self.poll_interval, 10.0)), id=f"send:{name}",
                                   next_run_time=datetime.now())
        if self.plotter is not None:
            self.scheduler.add_job(self._plots, "interval", seconds=max(1.0, min(self.poll_interval, 10.0)), id="plots", next_run_time=datetime.now())
        if self.metrics is not None:
            self.metrics.start()  # (a port already taken stops the start here, exit 2)
            if self.metrics.textfile is not None:
                self.scheduler.add_job(self.metrics.write_textfile, "interval", seconds=TEXTFILE_EVERY, id="textfile", next_run_time=datetime.now())
        observer = None if self.polling or not self.watched else watch(self.watched, self.note)
        self.scheduler.start()
        if self.link is not None:
            self.link.start()
        mode = "polling" if self.polling or not self.watched else "inotify + polling" if polled else "inotify"
        log.info("following %s (%s; full rescan every %.1fs)", ", ".join(self.given), mode, self.every)
        self.notifier.send("READY=1")
        ping = self.notifier.watchdog_interval or 1.0
        while not self.stop.wait(timeout=min(ping, 1.0)):
            if self.notifier.watchdog_interval:
                self.notifier.send("WATCHDOG=1")
        self.notifier.send("STOPPING=1")
        log.info("stopping: finishing the current pass")
        if observer is not None:
            observer.stop()
        with self._scheduling:
            self._closing = True
        self.scheduler.shutdown(wait=True)
        if self.link is not None:
            self.link.close()
        for state in self._link_states:
            state.close()
        with self.lock:
            self.state.close()
        for dispatcher in self.dispatchers.values():
            dispatcher.state.close()
        if self.plotter is not None:
            self.plotter.state.close()
        if self.metrics is not None:
            self.metrics.write_textfile()  # the last counts, as the daemon stops
            self.metrics.stop()
        if observer is not None:
            observer.join(timeout=5)
        return 0


SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
"""journald reads a `<N>` at the start of a line of a service's stderr as its priority
(SyslogLevelPrefix=, on by default): without it, every line is "info"."""


class SafeFormatter(logging.Formatter):
    """One record, one line, no secret: the message (with the run names, paths and Slack errors
    formatted into it) has its control characters made visible and its secrets scrubbed here, where
    every log call passes, rather than at each call site, where one would be forgotten. A
    traceback keeps its own line breaks; only its other control characters are escaped."""

    def __init__(self, fmt: str, datefmt: str | None = None, *, journal: bool = False) -> None:
        super().__init__(fmt, datefmt=datefmt)
        self.journal = journal

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = scrub(printable(record.message))
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self.journal:
            return text
        # journald reads each line of the stream apart: a traceback's lines carry the priority too.
        mark = f"<{SYSLOG_PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(mark + line for line in text.split("\n"))

    def formatException(self, ei) -> str:  # noqa: ANN001, N802
        return scrub(printable_lines(super().formatException(ei)))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return scrub(printable_lines(super().formatStack(stack_info)))


def _to_journal(stream) -> bool:  # noqa: ANN001 - (a text stream)
    """Whether `stream` is the journal's: systemd sets JOURNAL_STREAM to `device:inode` of the
    stream it connected to the journal, which is stdout's alone when stderr goes to a file."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        return False


def setup_logging(level: str) -> None:
    """Log lines on stderr, with a timestamp unless journald takes them (it stamps each line itself:
    systemd sets JOURNAL_STREAM for a service whose stderr goes to the journal), where each line
    carries its priority instead."""
    handler = logging.StreamHandler(sys.stderr)
    journal = _to_journal(sys.stderr)
    stamp = "" if journal else "%(asctime)s "
    handler.setFormatter(SafeFormatter(f"{stamp}%(levelname)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%S%z", journal=journal))
    root = logging.getLogger("lossguard")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: already running" is by design
