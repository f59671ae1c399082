"""`on_incident`: a command run once per notice, so lossguard can act on a run from outside it (write
the STOP file the trainer's callback reads, `scancel` the job, send it SIGUSR1 for a checkpoint,
page through a script) with no change to the training code.

It is a sink like the others: the notice waits in the outbox, the command runs from the sink's own
thread, and the entry is recorded once the command has exited. A kill -9 between its exit and that
record runs it again after the restart, with the same LOSSGUARD_EVENT_ID (the outbox entry's key,
unique per notice and stable across retries): a command that must not act twice remembers the ids
it has seen. Silences hold it back as they hold back messages.

No shell runs it unless the command names one (`sh -c '...'`): a run name is data, never code. The
notice is in its environment and, as the JSON-lines sink writes it, on its stdin. Its output goes
to a temporary file, so a talkative command can neither block on a full pipe nor fill the daemon's
memory; the last lines are logged with its exit status, scrubbed of secrets. It inherits the
daemon's environment without lossguard's own variables (tokens, URLs), the credentials directory
or systemd's notify socket.

Exit status 0 is done; 75 (EX_TEMPFAIL, sendmail's "try again later") is retried at the next round;
any other status, a timeout or a command that cannot start fails for good: said once, loudly, and
kept in the outbox (`lossguard outbox retry` runs it again).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

from ..escaping import printable
from ..model import Notice
from ..redact import scrub
from .delivery import Delivery, Manners, Post
from .sinks import JsonlSink

log = logging.getLogger("lossguard")
NAME = "on_incident"
TEMPFAIL = 75
GRACE = 5.0
"""Seconds between the SIGTERM a timed-out command gets and the SIGKILL."""
TAIL_BYTES = 4096
TAIL_LINES = 5
HIDDEN = ("CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC")


def wanted(notice: Notice, *, rules: Sequence[str], severities: Sequence[str]) -> bool:
    """Whether the command runs for `notice`: its rule (a run's notice: its kind, `stalled`) among
    `rules` and its severity among `severities` (empty: all; a run's notice has no severity)."""
    rule = notice.incident.rule if notice.incident is not None else notice.kind
    if rules and rule not in rules:
        return False
    return not severities or notice.severity is None or notice.severity in severities


def environment(notice: Notice, key: str, *, base: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: the daemon's without what is lossguard's (see the module's doc), and the notice."""
    env = {k: v for k, v in base.items() if not k.startswith("LOSSGUARD_") and k not in HIDDEN}
    inc = notice.incident
    step = inc.step if inc is not None else notice.step
    cause = inc.causes[0].cause if inc is not None and inc.causes else ""
    env.update({
        "LOSSGUARD_EVENT": notice.kind, "LOSSGUARD_EVENT_ID": key, "LOSSGUARD_RUN": notice.run,
        "LOSSGUARD_RULE": inc.rule if inc is not None else "", "LOSSGUARD_STEP": "" if step is None else str(step),
        "LOSSGUARD_SEVERITY": notice.severity or "", "LOSSGUARD_CAUSE": cause, "LOSSGUARD_SOURCE": notice.source,
    })
    return env


class IncidentAction:
    """The sink that runs `on_incident` (see the module's doc)."""

    name = NAME
    manners = Manners()
    takes_plots = False

    def __init__(self, argv: Sequence[str], *, rules: Sequence[str] = (), severities: Sequence[str] = (), timeout: float = 60.0,
                 grace: float = GRACE, base_env: Callable[[], Mapping[str, str]] = lambda: os.environ) -> None:
        self.argv = list(argv)
        self.rules, self.severities = tuple(rules), tuple(severities)
        self.timeout, self.grace = timeout, grace
        self.base_env = base_env
        self.program = printable(os.path.basename(self.argv[0]))
        """How logs name the command: its program alone (its arguments may hold a secret)."""

    def send(self, post: Post) -> Delivery:
        for entry in post.entries:
            if not wanted(entry.notice, rules=self.rules, severities=self.severities):
                continue
            delivery = self.run(entry.notice, entry.key)
            if not delivery.ok:
                return delivery
        return Delivery(ok=True)

    def run(self, notice: Notice, key: str) -> Delivery:
        """The command, once, for `notice`; how it went."""
        stdin = (json.dumps(JsonlSink.record(key, notice)) + "\n").encode()
        what = f"{self.program} for {notice.kind} of run {printable(notice.run)} ({key})"
        start = time.monotonic()
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                        env=environment(notice, key, base=self.base_env()), start_new_session=True, close_fds=True)
            except OSError as exc:
                return Delivery(ok=False, error=f"on_incident {self.program} cannot start: {exc.strerror or exc}", permanent=True,
                                fix="check on_incident: the program, its permissions, and what the service's sandbox lets it reach")
            timed_out = self._wait(proc, stdin)
            tail = _tail(out)
        took = time.monotonic() - start
        said = f"; last output: {' | '.join(tail)}" if tail else ""
        if timed_out:
            return Delivery(ok=False, error=f"on_incident {what} ran past its {self.timeout:g} s and was stopped{said}", permanent=True,
                            fix="raise on_incident_timeout, or make the command quicker")
        if proc.returncode == 0:
            log.info("on_incident %s exited 0 in %.2f s%s", what, took, said)
            return Delivery(ok=True)
        status = f"exit status {proc.returncode}" if proc.returncode > 0 else f"killed by {_signal_name(-proc.returncode)}"
        return Delivery(ok=False, error=f"on_incident {what}: {status} after {took:.2f} s{said}", permanent=proc.returncode != TEMPFAIL)

    def _wait(self, proc: subprocess.Popen, stdin: bytes) -> bool:
        """Feeds the notice to the command and waits for it; True when it ran out of time (then it
        and what it started are stopped: it leads a process group of its own)."""
        try:
            proc.communicate(stdin, timeout=self.timeout)
            return False
        except subprocess.TimeoutExpired:
            pass
        for sig, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.stdin is not None:
            proc.stdin.close()
        return True


def _tail(out) -> list[str]:  # noqa: ANN001 - the command's output file
    """The last lines of the command's output, each cut short, made printable and scrubbed."""
    size = out.seek(0, os.SEEK_END)
    out.seek(max(0, size - TAIL_BYTES))
    lines = out.read().decode("utf-8", "replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # (the first may be cut)
    return [scrub(printable(line.strip()[:200])) for line in lines if line.strip()][-TAIL_LINES:]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def action_sink(settings) -> IncidentAction:  # noqa: ANN001
    """The sink the settings' on_incident describes (not empty)."""
    return IncidentAction(settings.on_incident, rules=settings.on_incident_rules, severities=settings.on_incident_severities,
                          timeout=settings.on_incident_timeout)
