"""`lossguard watch` as a real process: start it, write to the runs it follows, kill it, restart it,
and count what a JSON-lines sink received."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .images import png_size

POLL = "0.2"
PATIENCE = 60.0
"""How long a wait for the daemon gives it before failing. Each wait returns as soon as what it waits
for is there, so this costs nothing when all is well; 20 s was too short on a 2-core machine running
the suite on both cores (pytest -n) beside other work."""
NO_PLOTS = {"LOSSGUARD_PLOTS": "false"}
"""The environment of a daemon whose test is not about its pictures. Each alert's picture is a
child process drawing for 1-2 s of CPU (with matplotlib's import), the daemon's largest cost in
these tests, beside the other worker's; and a stop finishes the round of plots it is drawing (a
30 s SIGTERM ran out on a box at load 14). Pictures have tests of their own (here, in
test_watch_slack and test_plot), and the kill -9 tests keep them: a plot's id must not repeat
either."""


def _line(step: int, loss: float, gn: float = 1.0) -> str:
    return json.dumps({"step": step, "loss": loss, "lr": 1e-4, "grad_norm": gn}) + "\n"


def _calm(steps) -> str:
    return "".join(_line(s, 2.0 + (s % 5) * 0.01) for s in steps)


def _whole(line: str) -> bool:
    """Not a line a kill cut short while the sink wrote it (the sink starts the next on a line of its own)."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


class Watch:
    def __init__(self, tmp: Path, *extra: str, env: dict | None = None) -> None:
        self.tmp = tmp
        self.out = tmp / "deliveries.jsonl"
        self.args = [sys.executable, "-m", "lossguard.cli", "watch", str(tmp / "runs"), "--state-dir", str(tmp / "state"),
                     "--jsonl", str(self.out), "--poll-interval", POLL, "--stall-after", "0", *extra]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "daemon.log"
        """What the daemon writes (each start appends): a file the test can read while it runs, never
        a pipe left unread that a talkative daemon would block on."""
        self._since = 0

    def start(self, *, preexec_fn=None) -> Watch:  # noqa: ANN001 - (run in the child before exec)
        self._since = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=out, env=self.env, preexec_fn=preexec_fn)  # noqa: PLW1509
        return self

    def output(self) -> str:
        """What this start of the daemon has written so far."""
        with open(self.log, "rb") as fh:
            fh.seek(self._since)
            return fh.read().decode(errors="replace")

    def wait_logged(self, text: str, timeout: float = PATIENCE, *, times: int = 1) -> str:
        """Until this start of the daemon has written `text` (a step it logs, such as a reload), `times` times."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (out := self.output()).count(text) >= times:
                return out
            assert self.proc.poll() is None, out
            time.sleep(0.05)
        raise AssertionError(f"the daemon never wrote {text!r}: {self.output()}")

    def wait_ready(self, timeout: float = PATIENCE, *, files: int = 1) -> None:
        """Until the daemon has made its first pass (its state lists `files` files it has read)."""
        read = "SELECT count(*) FROM files WHERE cursor LIKE '%\"offset\": %' AND cursor NOT LIKE '%\"offset\": 0,%'"
        self._wait_state(read, files, timeout, "daemon never made a pass")

    def wait_settled(self, timeout: float = PATIENCE) -> None:
        """Until the first pass has committed (from then on, what is written to the logs is news)."""
        self._wait_state("SELECT count(*) FROM meta WHERE key='settled'", 1, timeout, "the first pass never committed")

    def _wait_state(self, query: str, at_least: int, timeout: float, why: str) -> None:
        import sqlite3

        deadline = time.monotonic() + timeout
        db = self.tmp / "state" / "state.db"
        while time.monotonic() < deadline:
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                    if conn.execute(query).fetchone()[0] >= at_least:
                        return
            except sqlite3.Error:
                pass
            assert self.proc.poll() is None, self.output()
            time.sleep(0.05)
        raise AssertionError(why)

    def events(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip() and _whole(line)]

    def wait_for(self, predicate, timeout: float = PATIENCE) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = self.events()
            if predicate(ev):
                return ev
            time.sleep(0.05)
        raise AssertionError(f"timed out; deliveries: {self.events()}; stderr: {self.stop_and_read()}")

    def settle(self, timeout: float = PATIENCE) -> list[dict]:
        """Until everything written so far has been judged and delivered: a spike in a run of its
        own, written now, is alerted after whatever came before it (passes and deliveries keep
        order). What a test asserts did not happen then had its chance to. Returns the deliveries
        without the sentinel's."""
        self._settles = getattr(self, "_settles", 0) + 1
        run = f"zz-settle-{self._settles}"
        log = self.tmp / "runs" / run / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text(_calm(range(1, 16)) + _line(16, 9.0))
        ev = self.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == run for e in ev), timeout=timeout)
        return [e for e in ev if not e["run"].startswith("zz-settle-")]

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop_and_read(self) -> str:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.output() if self.proc else ""


def alerted_once_across_a_kill(tmp: Path, write, step: int, *, rule: str = "loss-spike") -> list[tuple[str, str, int]]:  # noqa: ANN001
    """A daemon following tmp/runs while `write()` (a tracker's real process) writes an incident of
    `rule` at `step`, killed -9 once it is alerted and started again: the (run, rule, step) of every
    opened incident its sink holds once everything is said."""
    w = Watch(tmp, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        write()
        w.wait_for(lambda ev: (rule, step) in opened(ev))
        w.kill9()
        w = Watch(tmp, env=NO_PLOTS).start()
        ev = w.settle()
    finally:
        w.kill9()
    return [(e["run"], e["rule"], e["step"]) for e in ev if e["event"] == "opened"]


@pytest.fixture
def runs(tmp_path):
    (tmp_path / "runs" / "exp").mkdir(parents=True)
    return tmp_path


def opened(ev):
    return [(e["rule"], e["step"]) for e in ev if e["event"] == "opened"]


def test_history_is_read_but_not_alerted_and_a_new_spike_is_alerted_once(runs):
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 30)) + _line(30, 9.0) + _calm(range(31, 60)))  # an old spike
    w = Watch(runs, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_calm(range(60, 70)) + _line(70, 8.0, gn=40.0) + _calm(range(71, 80)))
        # (Until both incidents' lines are in: the sink writes them one by one, fsync'ed.)
        ev = w.wait_for(lambda ev: sum(e["event"] == "resolved" for e in ev) >= 2)
        said = sorted((e["event"], e["rule"], e["step"]) for e in ev if e["event"] in ("opened", "escalated"))
        assert said == [("escalated", "loss-spike", 70), ("opened", "grad-norm-spike", 70)]  # one trouble
        first = next(e for e in ev if e["event"] == "opened")
        assert first["causes"][0]["cause"] == "gradient_explosion"
    finally:
        err = w.stop_and_read()
    assert w.proc.returncode == 0, err


KILLED_DEADLINE = 120.0
"""How long the daemon left after the kills may take to say everything: a deadline, not a wait (it
is met in seconds). Each kill -9 leaves its picture's drawing child running, so a loaded 2-core box
starts the last daemon beside a few matplotlib processes."""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_random_moments_loses_and_repeats_nothing(runs, seed):
    rng = random.Random(seed)
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    spikes = []
    step = 20
    w = Watch(runs).start()
    try:
        w.wait_ready(timeout=KILLED_DEADLINE)
        for _ in range(6):
            chunk = _calm(range(step, step + 15))
            spike = step + 15
            spikes.append(spike)
            chunk += _line(spike, 9.0) + _calm(range(spike + 1, spike + 5))
            step = spike + 5
            cut = rng.randrange(len(chunk))
            with open(log, "a") as fh:
                fh.write(chunk[:cut])
            time.sleep(rng.uniform(0.05, 0.6))
            with open(log, "a") as fh:
                fh.write(chunk[cut:])
            time.sleep(rng.uniform(0.0, 0.8))
            w.kill9()
            w = Watch(runs).start()
        # Until every spike was said at least once (a repeat is then reported as one, not as a
        # timeout), and everything before the sentinel delivered.
        w.wait_for(lambda ev: set(spikes) <= {s for _, s in opened(ev)}, timeout=KILLED_DEADLINE)
        ev = w.settle(timeout=KILLED_DEADLINE)
    finally:
        w.kill9()  # (a last one: a SIGTERM waited for the round of plots it was drawing, 3-20 s)
    said = sorted((e["rule"], e["step"], e["id"]) for e in ev if e["event"] == "opened")
    assert [(rule, s) for rule, s, _ in said] == [("loss-spike", s) for s in spikes], said  # (the ids: one entry twice, or two)
    ids = [e["id"] for e in ev]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_rotation_truncation_and_resume(runs):
    log = runs / "runs" / "exp" / "train.log"
    log.write_text("".join(f"step {s} | loss: 2.0 | lr 1e-4 | norm: 1.0\n" for s in range(1, 30)))
    w = Watch(runs, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        # Rename rotation: the old file gets its last lines, the new one starts fresh.
        with open(log, "a") as fh:
            fh.write("step 30 | loss: 2.0 | lr 1e-4 | norm: 1.0\n")
        os.rename(log, log.with_suffix(".log.1"))
        log.write_text("".join(f"step {s} | loss: 2.0 | lr 1e-4 | norm: 1.0\n" for s in range(31, 45)) + "step 45 | loss: 7.0 | lr 1e-4 | norm: 1.0\n")
        w.wait_for(lambda ev: ("loss-spike", 45) in opened(ev))
        # copytruncate: the file is emptied in place and written again.
        with open(log, "r+") as fh:
            fh.truncate(0)
        with open(log, "a") as fh:
            fh.write("".join(f"step {s} | loss: 2.0 | lr 1e-4 | norm: 1.0\n" for s in range(46, 60)) + "step 60 | loss: 8.0 | lr 1e-4 | norm: 1.0\n")
        w.wait_for(lambda ev: ("loss-spike", 60) in opened(ev))
        # A resume from a checkpoint: steps go back to 50 and replay calmly; then a new spike.
        with open(log, "a") as fh:
            fh.write("".join(f"step {s} | loss: 2.0 | lr 1e-4 | norm: 1.0\n" for s in range(50, 70)) + "step 70 | loss: 9.0 | lr 1e-4 | norm: 1.0\n")
        w.wait_for(lambda ev: ("loss-spike", 70) in opened(ev))
        ev = w.settle()
        assert opened(ev) == [("loss-spike", 45), ("loss-spike", 60), ("loss-spike", 70)]
    finally:
        w.stop_and_read()


def test_polling_mode_alone_finds_new_runs(runs):
    (runs / "runs" / "exp" / "metrics.jsonl").write_text(_calm(range(1, 5)))
    w = Watch(runs, "--polling", env=NO_PLOTS).start()
    try:
        w.wait_ready()  # its first pass is over: what comes now is not history
        new = runs / "runs" / "later" / "metrics.jsonl"
        new.parent.mkdir()
        new.write_text(_calm(range(1, 20)) + _line(20, 9.0))
        ev = w.wait_for(lambda ev: ("loss-spike", 20) in opened(ev))
        assert ev[0]["run"] == "later"
    finally:
        w.stop_and_read()


def test_second_daemon_on_the_same_state_refuses(runs):
    (runs / "runs" / "exp" / "metrics.jsonl").write_text(_calm(range(1, 5)))
    w = Watch(runs).start()
    try:
        w.wait_ready()
        second = subprocess.run(w.args, capture_output=True, text=True, timeout=30)
        assert second.returncode == 2
        assert "another lossguard daemon is using this state directory" in second.stderr
    finally:
        w.stop_and_read()


def test_sd_notify_ready_and_sigterm_exit(runs):
    (runs / "runs" / "exp" / "metrics.jsonl").write_text(_calm(range(1, 5)))
    sock_path = runs / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(30)
    w = Watch(runs, env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "1000000"}).start()
    try:
        got = set()
        while not {"READY=1", "WATCHDOG=1"} <= got:
            got.add(sock.recv(256).decode())
        start = time.monotonic()
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=10) == 0
        assert time.monotonic() - start < 5
        sock.settimeout(10)  # (until it comes, where this waited 2 s for whatever else came)
        rest = set()
        try:
            while "STOPPING=1" not in rest:
                rest.add(sock.recv(256).decode())
        except TimeoutError:
            pass
        assert "STOPPING=1" in rest, rest
    finally:
        sock.close()
        w.stop_and_read()


def test_damaged_state_file_is_moved_aside_and_the_daemon_starts(runs):
    (runs / "runs" / "exp" / "metrics.jsonl").write_text(_calm(range(1, 5)))
    (runs / "state").mkdir()
    (runs / "state" / "state.db").write_bytes(b"this is not a database" * 100)
    w = Watch(runs).start()
    try:
        w.wait_ready()
    finally:
        err = w.stop_and_read()
    assert "is damaged" in err and list((runs / "state").glob("state.db.corrupt-*"))


def test_state_from_a_newer_lossguard_is_refused_not_overwritten(runs):
    import sqlite3

    from lossguard.state import VERSION, State

    state = State(runs / "state")
    assert state.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    state.close()
    db = sqlite3.connect(runs / "state" / "state.db")
    db.execute(f"PRAGMA user_version={VERSION + 1}")
    db.close()  # (a `with` block would commit but leave it open, and its close would write later)
    before = (runs / "state" / "state.db").read_bytes()
    w = Watch(runs).start()
    code = w.proc.wait(timeout=30)
    err = w.output()
    assert code == 2 and "written by a newer lossguard" in err and "Traceback" not in err
    assert (runs / "state" / "state.db").read_bytes() == before and not list((runs / "state").glob("state.db.corrupt-*"))


def test_watch_raises_the_incidents_scan_reports(runs):
    from tests.fixtures.make_runs import megatron_fp16_overflow

    src_dir = runs / "src"
    src_dir.mkdir()
    megatron_fp16_overflow(src_dir)
    data = (src_dir / "megatron-fp16-overflow" / "train.log").read_bytes()
    target = runs / "runs" / "exp" / "train.log"
    # The first five iterations (no spike can be judged that early) are there before the daemon
    # starts, so that its first pass has surely happened (it reads them as quiet history) before the
    # rest is written: a slow start under load used to take the whole log for history.
    pos = data.index(b"\n", data.index(b"iteration        5/")) + 1
    target.write_bytes(data[:pos])
    w = Watch(runs, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        rng = random.Random(7)
        while pos < len(data):
            n = rng.randrange(1, 40_000)
            with open(target, "ab") as fh:
                fh.write(data[pos : pos + n])
            pos += n
            time.sleep(0.05)
        scan = subprocess.run([sys.executable, "-m", "lossguard.cli", "scan", str(target), "--format", "json", "--quiet"], capture_output=True, text=True)
        expected = sorted((s["rule"], s["step"]) for r in json.loads(scan.stdout)["runs"] for s in r["spikes"])
        assert expected
        w.wait_for(lambda ev: sorted(opened(ev)) == expected)
    finally:
        w.stop_and_read()


def test_sighup_with_a_bad_rules_file_keeps_the_old_rules(runs):
    rules = runs / "rules.toml"
    rules.write_text('[[rule]]\nname = "spike"\nmetric = "loss"\nkind = "ratio"\nfactor = 2.0\nwindow = 9\n')
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    w = Watch(runs, "--rules", str(rules), env=NO_PLOTS).start()
    try:
        w.wait_ready()
        rules.write_text('[[rule]]\nname = "spike"\nmetric = "loss"\nkind = "ratoi"\n')
        w.proc.send_signal(signal.SIGHUP)
        w.wait_logged("new rules rejected")
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0) + _calm(range(21, 25)))
        w.wait_for(lambda ev: ("spike", 20) in opened(ev))
    finally:
        err = w.stop_and_read()
    assert "new rules rejected, the old ones stay in force" in err and "unknown kind 'ratoi'" in err


def test_status_shows_files_open_incidents_and_undelivered_with_their_error(runs):
    from lossguard.cli import main

    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    # A sink that cannot be written: notifications stay in the outbox with the reason.
    w = Watch(runs, env=NO_PLOTS)
    w.args[w.args.index("--jsonl") + 1] = str(runs / "no-such-dir" / "out.jsonl")
    w.start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            import sqlite3

            with sqlite3.connect(f"file:{runs / 'state' / 'state.db'}?mode=ro", uri=True) as conn:
                if conn.execute("SELECT count(*) FROM outbox WHERE last_error IS NOT NULL").fetchone()[0]:
                    break
            time.sleep(0.1)
    finally:
        w.stop_and_read()
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["status", "--state-dir", str(runs / "state"), "--format", "json"]) == 0
    status = json.loads(out.getvalue())
    assert status["files"][0]["run"] == "exp" and status["files"][0]["offset"] == log.stat().st_size
    assert status["open_incidents"] == [{"run": "exp", "rule": "loss-spike", "step": 20, "acked_by": None}]
    assert status["undelivered"] and "No such file or directory" in status["undelivered"][0]["error"]


def test_with_inotify_alone_new_runs_and_appends_are_followed_without_a_rescan(runs):
    # Rescans every 10 minutes: everything below can only have come through inotify.
    w = Watch(runs, env={**NO_PLOTS, "LOSSGUARD_RESCAN_INTERVAL": "600"})
    w.args[w.args.index("--poll-interval") + 1] = "600"
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    w.start()
    try:
        w.wait_ready()
        new = runs / "runs" / "later" / "metrics.jsonl"
        new.parent.mkdir()
        new.write_text(_calm(range(1, 20)))
        with open(new, "a") as fh:
            fh.write(_line(20, 9.0))
        with open(log, "a") as fh:
            fh.write(_line(20, 9.5))
        ev = w.wait_for(lambda ev: len(opened(ev)) == 2)
        assert sorted(e["run"] for e in ev if e["event"] == "opened") == ["exp", "later"]
    finally:
        err = w.stop_and_read()
    assert "(inotify; full rescan every 600.0s)" in err


def test_a_fresh_daemon_reads_rotated_segments_first_and_alerts_only_what_is_new(runs):
    exp = runs / "runs" / "exp"
    kv = "step {} | loss: {} | lr 1e-4 | norm: 1.0\n"
    (exp / "train.log.1").write_text("".join(kv.format(s, 9.0 if s == 20 else 2.0) for s in range(1, 30)))  # an old spike
    (exp / "train.log").write_text("".join(kv.format(s, 2.0) for s in range(30, 45)))
    w = Watch(runs, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(exp / "train.log", "a") as fh:
            fh.write(kv.format(45, 9.5) + "".join(kv.format(s, 2.0) for s in range(46, 50)))
        w.wait_for(lambda ev: ("loss-spike", 45) in opened(ev))
        ev = w.settle()
    finally:
        w.stop_and_read()
    # One run; the history (spike at 20 in the older segment) is not alerted, and the windows the
    # new spike is judged on continue from the segments read in order (no false resume).
    assert opened(ev) == [("loss-spike", 45)] and {e["run"] for e in ev} == {"exp"}


def test_changes_during_long_passes_get_their_pass_and_sigterm_then_still_exits(tmp_path):
    # 200 runs written to every 0.3 s make passes of a second or more, back to back. The scheduler
    # skips a run that comes due while a pass runs: before the fix the first such skip left every
    # later change waiting for the next poll (600 s here: a delay the 45 s bound below tells from
    # a loaded machine's slow passes), and a pass asking for a run while the scheduler shut down
    # hung the daemon on SIGTERM.
    n = 200
    logs = [tmp_path / "runs" / f"r{i:03d}" / "metrics.jsonl" for i in range(n)]
    for log in logs:
        log.parent.mkdir(parents=True)
        log.write_text(_calm(range(1, 20)))
    w = Watch(tmp_path, env=NO_PLOTS)
    w.args[w.args.index("--poll-interval") + 1] = "600"
    w.start()
    step, spike_at = 20, None
    try:
        w.wait_ready(files=n, timeout=60)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 6:
            for log in logs:
                with open(log, "a") as fh:
                    fh.write(_line(step, 9.0) if log == logs[0] and spike_at is None and time.monotonic() - t0 > 1 else _calm([step]))
            if spike_at is None and time.monotonic() - t0 > 1:
                spike_at = (step, time.monotonic())
            step += 1
            time.sleep(0.3)
        w.wait_for(lambda ev: ("loss-spike", spike_at[0]) in opened(ev))
        took = time.monotonic() - spike_at[1]
        for _ in range(2):  # a long pass, and a change while it runs: it will ask for another
            for log in logs:
                with open(log, "a") as fh:
                    fh.write(_calm([step]))
            step += 1
            time.sleep(0.4)
        w.proc.send_signal(signal.SIGTERM)
        code = w.proc.wait(timeout=30)
    finally:
        err = w.stop_and_read()
    assert took < 45, f"spike alerted {took:.1f} s after it was written"
    assert code == 0, err


def test_a_spike_plot_is_written_next_to_the_state_after_its_alert(runs):
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    w = Watch(runs).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        ev = w.wait_for(lambda ev: any(e["event"] == "plot" for e in ev))
    finally:
        err = w.stop_and_read()
    alert, plot = ev
    assert alert["event"] == "opened" and plot["alert"] == alert["id"] and (plot["run"], plot["step"]) == ("exp", 20)
    path = Path(plot["path"])
    assert path.parent == runs / "state" / "plots" and path.stat().st_mode & 0o777 == 0o600
    assert png_size(path) == (1000, 100 + 3 * 200)
    assert "Traceback" not in err


def test_a_plot_that_cannot_be_drawn_costs_neither_this_alert_nor_the_next(runs):
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    (runs / "state").mkdir(mode=0o700)
    (runs / "state" / "plots").write_text("a file where the plots folder goes")
    w = Watch(runs).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        w.wait_for(lambda ev: opened(ev) == [("loss-spike", 20)])
        ev = w.settle()  # a later spike of another run: alerted all the same
    finally:
        err = w.stop_and_read()
    assert opened(ev) == [("loss-spike", 20)] and not [e for e in ev if e["event"] == "plot"]
    lines = [line for line in err.splitlines() if "no plot for" in line and "run exp," in line]
    assert len(lines) == 1 and "went without it" in lines[0], err


def test_plots_false_draws_nothing(runs):
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    w = Watch(runs, env={"LOSSGUARD_PLOTS": "false"}).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        ev = w.settle()
    finally:
        w.stop_and_read()
    import sqlite3

    assert opened(ev) == [("loss-spike", 20)] and not [e for e in w.events() if e["event"] == "plot"]
    with sqlite3.connect(runs / "state" / "state.db") as db:  # (a picture is kept in the alert's own commit)
        assert db.execute("SELECT count(*) FROM plots").fetchone()[0] == 0
    assert not (runs / "state" / "plots").exists()


def test_the_daemons_own_log_and_alerts_under_the_folder_it_follows_are_not_read_as_training_logs(runs):
    # `lossguard watch runs/ --jsonl runs/alerts.jsonl > runs/watch.log` followed its
    # own files (each line it wrote a change to sniff again); its state there too.
    log = runs / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 30)))
    (runs / "runs" / "state").mkdir()
    (runs / "state").symlink_to(runs / "runs" / "state")  # (where the helpers look; the daemon writes under runs/)
    w = Watch(runs, "--state-dir", str(runs / "runs" / "state"))  # (the later --state-dir wins)
    w.out = runs / "runs" / "alerts.jsonl"
    w.args[w.args.index("--jsonl") + 1] = str(w.out)
    w.log = runs / "runs" / "watch.log"
    w.start()
    try:
        w.wait_settled()
        with open(log, "a") as fh:
            fh.write(_line(30, 9.0) + _calm(range(31, 40)))
        w.settle()
        w.proc.send_signal(signal.SIGHUP)  # (a reload: the next pass walks the tree)
        ev = w.settle()
    finally:
        err = w.stop_and_read()
    assert w.proc.returncode == 0, err
    assert [(e["event"], e["run"]) for e in ev if e["event"] in ("opened", "resolved")] == [("opened", "exp"), ("resolved", "exp")]
    import sqlite3

    with sqlite3.connect(runs / "runs" / "state" / "state.db") as db:
        followed = sorted(Path(p).name for (p,) in db.execute("SELECT path FROM files"))
    assert followed == ["metrics.jsonl"] * 3, followed  # exp's and the two settling runs'
