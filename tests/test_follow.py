"""The daemon's pass in-process (lossguard.watch.follow.Follower over a real SQLite state and real files),
with the clock passed in: what a pass reads, judges and announces. The daemon as a process is
tests/test_watch.py."""

from __future__ import annotations

import pytest

import json
import time

from lossguard.watch.budget import MIN_BLOCK
from lossguard.watch.follow import Follower
from lossguard.detection.rules import default_rules
from lossguard.watch.followed import offset_of
from lossguard.state import State

from .conftest import WAIT_FOR_EVERY_READ

from .test_watch import _calm, _line


def one_run(tmp_path, text: str, **options) -> tuple:  # noqa: ANN003
    """runs/exp/metrics.jsonl holding `text`, a fresh state, and a Follower over runs/."""
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(text)
    state = State(tmp_path / "state")
    return log, state, Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, **{"pass_budget": WAIT_FOR_EVERY_READ, **options})


def test_inotify_passes_read_the_named_files_and_walk_only_when_the_tree_changed(tmp_path):
    root = tmp_path / "runs"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        (root / name / "metrics.jsonl").write_text(_calm(range(1, 20)))
    state = State(tmp_path / "state")
    follower = Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    assert follower.run_pass(1.0).walked
    a = root / "a" / "metrics.jsonl"
    with open(a, "a") as fh:
        fh.write(_calm(range(20, 25)))
    report = follower.run_pass(2.0, {str(a)})
    assert (report.walked, report.files, report.rows) == (False, 1, 15)  # 5 lines of loss, lr, grad_norm
    (root / "b" / "model.pt").write_bytes(b"\0" * 100)
    assert follower.run_pass(3.0, {str(root / "b" / "model.pt")}).walked is False  # not a log: nothing to do
    c = root / "c" / "metrics.jsonl"
    c.parent.mkdir()
    c.write_text(_calm(range(1, 5)))
    report = follower.run_pass(4.0, {str(c)})
    assert report.walked and str(c) in state.files()
    a.unlink()
    assert follower.run_pass(5.0, {str(a)}).walked and str(a) not in state.files()
    state.close()



def test_a_long_history_is_read_a_block_per_pass_quietly_and_what_follows_is_alerted(tmp_path):
    history = _calm(range(1, 300)) + _line(300, 9.0) + _calm(range(301, 600))  # an old spike at 300
    log, state, follower = one_run(tmp_path, history, read_limit=4096)
    passes, notices = [], []
    report = follower.run_pass(1.0)
    while True:
        passes.append(report)
        notices += report.notices
        if not report.unfinished:
            break
        report = follower.run_pass(2.0, set(report.unfinished))
    line_bytes = len(_line(1, 2.0))
    assert len(passes) >= 4 and max(p.rows for p in passes) <= 3 * (2 * 4096 // line_bytes + 1)  # <= 2 blocks a pass
    assert sum(p.rows for p in passes) == 599 * 3 and notices == []  # every value read; history is quiet
    recorded = state.db.execute("SELECT step, quiet FROM incidents").fetchall()
    assert recorded == [(300, 1)]  # the old spike is known (never raised again), as history
    with open(log, "a") as fh:
        fh.write(_line(600, 9.0))
    report = follower.run_pass(3.0, {str(log)})
    assert [(n.kind, n.incident.step) for n in report.notices] == [("opened", 600)]
    state.close()


def test_a_spike_written_while_the_history_is_still_being_read_is_news_not_history(tmp_path):
    """The first start reads a long history a block per pass and settles after its first pass; a
    spike appended before the history was all read must not be read with its last block (and taken
    for history with it): a read stops where the file ended at the first start."""
    history = _calm(range(1, 300)) + _line(300, 9.0) + _calm(range(301, 600))  # an old spike at 300
    log, state, follower = one_run(tmp_path, history, read_limit=4096)
    report = follower.run_pass(1.0)
    assert report.unfinished and not state.fresh  # settled; the history is not all read yet
    with open(log, "a") as fh:
        fh.write(_calm(range(600, 610)) + _line(610, 9.0))
    notices = list(report.notices)
    while report.unfinished:
        report = follower.run_pass(2.0, set(report.unfinished))
        notices += report.notices
    assert [(n.kind, n.incident.step) for n in notices] == [("opened", 610)]
    assert state.db.execute("SELECT step, quiet FROM incidents ORDER BY step").fetchall() == [(300, 1), (610, 0)]
    state.close()



def calm_runs(tmp_path, *names: str) -> tuple:
    """runs/NAME/metrics.jsonl of 19 calm steps each, a fresh state, a Follower over runs/ that has
    made its first pass, and the lines it logged."""
    root = tmp_path / "runs"
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "metrics.jsonl").write_text(_calm(range(1, 20)))
    logged: list[str] = []
    state = State(tmp_path / "state")
    follower = Follower([root], rules=default_rules(), state=state, log=logged.append, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)
    return root, state, follower, logged


def test_a_file_its_reader_fails_on_stops_alone_and_the_other_runs_are_still_judged(tmp_path, monkeypatch):
    root, state, follower, logged = calm_runs(tmp_path, "good", "bad")
    from lossguard.ingest.formats import dictlines

    real_json_wide = dictlines.json_wide
    bad = root / "bad" / "metrics.jsonl"

    def json_wide(lines, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - a reader bug nobody foresaw
        if lines.get_column("text").str.contains("poison").any():
            raise ValueError("unforeseen")
        return real_json_wide(lines, *args, **kwargs)

    monkeypatch.setattr(dictlines, "json_wide", json_wide)
    with open(root / "good" / "metrics.jsonl", "a") as fh:
        fh.write(_line(20, 9.0))
    with open(bad, "a") as fh:
        fh.write(json.dumps({"step": 20, "loss": 9.0, "poison": 1}) + "\n")
    report = follower.run_pass(2.0)
    assert [(n.kind, n.run) for n in report.notices] == [("opened", "good")]
    assert any(str(bad) in line and "unforeseen" in line and "no longer read" in line for line in logged)
    assert state.files()[str(bad)].dead
    with open(bad, "a") as fh:
        fh.write(_line(21, 9.0))
    assert follower.run_pass(3.0).notices == [] and sum("unforeseen" in line for line in logged) == 1  # said once
    state.close()



def test_a_quiet_run_is_said_stalled_once_and_resumed_when_it_logs_again(tmp_path):
    log, state, follower = one_run(tmp_path, _calm(range(1, 5)), stall_after=60)
    assert follower.run_pass(1000.0).notices == []
    assert follower.run_pass(1059.0).notices == []  # not yet a minute
    (stalled,) = follower.run_pass(1060.0).notices
    assert (stalled.kind, stalled.run, stalled.step, stalled.minutes) == ("stalled", "exp", 4, 1.0)
    assert follower.run_pass(2000.0).notices == []  # said once
    with open(log, "a") as fh:
        fh.write(_calm(range(5, 7)))
    (resumed,) = follower.run_pass(2001.0).notices
    assert (resumed.kind, resumed.run, resumed.step) == ("resumed", "exp", 6)
    state.close()


@pytest.mark.parametrize("step", [pytest.param(7200.0, id="stepped forward 2 h"), pytest.param(-3600.0, id="stepped back 1 h")])
def test_a_wall_clock_step_neither_stalls_a_writing_run_nor_delays_a_stall(tmp_path, step):
    mono = [0.0]
    log, state, follower = one_run(tmp_path, _calm(range(1, 5)), stall_after=60, clock=lambda: mono[0])
    assert follower.run_pass(1000.0).notices == []
    mono[0] = 1.0
    assert follower.run_pass(1001.0 + step).notices == []  # (the step: a second went by)
    mono[0] = 60.0
    (stalled,) = follower.run_pass(1060.0 + step).notices  # a minute of quiet, whatever the wall clock says
    assert (stalled.kind, stalled.minutes) == ("stalled", 1.0)
    state.close()


def test_a_spike_that_grows_is_announced_again_and_its_recovery_once(tmp_path):
    log, state, follower = one_run(tmp_path, _calm(range(1, 20)), update_every=60)
    follower.run_pass(0.0)

    def append(now: float, text: str) -> list[tuple[str, int, float]]:
        with open(log, "a") as fh:
            fh.write(text)
        return [(n.kind, n.incident.step, n.incident.value) for n in follower.run_pass(now, {str(log)}).notices]

    assert append(10.0, _line(20, 5.0)) == [("opened", 20, 5.0)]
    assert append(20.0, _line(21, 9.0)) == []  # grew, but announced 10 s ago
    assert append(100.0, _line(22, 9.5)) == [("updated", 20, 9.5)]
    assert append(110.0, _calm(range(23, 26))) == [("resolved", 20, 9.5)]
    assert append(120.0, _calm(range(26, 30))) == []
    (row,) = [state.incident("exp", "loss-spike", 20)]
    assert row.status == "resolved" and row.incident.end_step == 23 and row.notified_value == 9.5
    state.close()


def test_a_tail_holds_enough_finite_points_for_the_windows_however_many_nans_came_last(tmp_path):
    log, state, follower = one_run(tmp_path, "")
    follower.run_pass(0.0)
    nans = "".join(json.dumps({"step": s, "loss": float("nan")}) + "\n" for s in range(21, 51))
    with open(log, "a") as fh:
        fh.write(_calm(range(1, 21)) + nans + _calm(range(51, 54)))
    assert [n.incident.rule for n in follower.run_pass(1.0, {str(log)}).notices if n.kind == "opened"] == ["loss-nonfinite"]
    with open(log, "a") as fh:
        fh.write(_line(54, 9.0))
    # The 9 finite losses before step 54 are the 3 after the NaNs and 6 before them: a scan flags it.
    assert [(n.kind, n.incident.rule, n.incident.step) for n in follower.run_pass(2.0, {str(log)}).notices] == [("opened", "loss-spike", 54)]
    state.close()


def test_a_file_slow_to_read_does_not_hold_up_another_runs_alert(tmp_path):
    """A pass waits for one file only as long as its budget: a run whose read outlasts it is left to
    a later pass (the read goes on beside, and asks for that pass), and the other runs' spikes are
    committed now. The slow file is then read in smaller blocks."""
    root = tmp_path / "runs"
    big, spiky = root / "a-big" / "metrics.jsonl", root / "z-spike" / "metrics.jsonl"
    for log in (big, spiky):
        log.parent.mkdir(parents=True)
        log.write_text(_calm(range(1, 20)))
    state = State(tmp_path / "state")
    woken: list[str] = []
    follower = Follower([root], rules=default_rules(), state=state, log=lambda _: None)
    follower.budget.wake = woken.append
    follower.run_pass(1.0)  # history
    # 50 ms: the small run's read (7 ms here) is done within it on a loaded machine too, where
    # 10 ms was missed; the big one's (150 ms here, more when loaded) never is.
    follower.budget.budget = 0.05
    with open(big, "a") as fh:  # ~12 MB at once: far more than 50 ms of parsing
        fh.write(_calm(range(20, 200_000)))
    with open(spiky, "a") as fh:
        fh.write(_calm(range(20, 40)) + _line(40, 9.0))
    report = follower.run_pass(2.0)
    assert [(n.kind, n.run, n.incident.step) for n in report.notices] == [("opened", "z-spike", 40)]
    assert offset_of(state.files()[str(big)]).offset == len(_calm(range(1, 20)))  # the big run waits
    deadline, now = time.monotonic() + 60, 3.0
    while offset_of(state.files()[str(big)]).offset < big.stat().st_size and time.monotonic() < deadline:
        todo = set(report.unfinished) | set(woken)
        woken.clear()
        report = follower.run_pass(now, todo) if todo else report
        now += 1
        time.sleep(0.01)
    assert offset_of(state.files()[str(big)]).offset == big.stat().st_size  # all of it, in the end
    assert MIN_BLOCK <= follower.budget.block(str(big)) < follower.budget.limit  # in smaller blocks
    state.close()


def _hf_dict(step: int, loss: float, total: int = 400) -> str:
    """A training bar redrawn at `step` (tqdm's \r turned into a line break, as log collectors do),
    then the dict HF's ProgressCallback writes (transformers/trainer_callback.py)."""
    bar = f" {100 * step // total:3d}%|█         | {step}/{total} [00:10<01:30,  3.20it/s]\n"
    return bar + str({"loss": loss, "grad_norm": 1.0, "learning_rate": 4.9e-05, "epoch": round(step / 100, 2)}) + "\n"


def test_an_hf_console_dict_read_a_pass_after_its_bar_is_alerted_at_the_bars_step(tmp_path):
    calm = "".join(_hf_dict(s, 2.0 + (s % 3) * 0.01) for s in range(10, 210, 10))
    log = tmp_path / "runs" / "exp" / "train_stdout.txt"
    log.parent.mkdir(parents=True)
    log.write_text(calm)
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    assert follower.run_pass(1.0).notices == []
    bar, spike = _hf_dict(210, 9.0).splitlines(keepends=True)
    for now, text in ((2.0, bar), (3.0, spike)):  # the daemon's passes see the bar, then the dict
        with open(log, "a") as fh:
            fh.write(text)
        notices = follower.run_pass(now, {str(log)}).notices
    assert [(n.kind, n.incident.step) for n in notices] == [("opened", 210)]
    state.close()


def test_a_pass_holding_only_an_epoch_mean_does_not_splice_it_into_the_per_step_loss(tmp_path):
    """`scan` reads the loss from the run's best tag (train_loss_step outranks train_loss_epoch);
    the daemon must not judge an epoch mean that arrived alone in a pass as a per-step loss."""
    steps = "".join(json.dumps({"step": s, "train_loss_step": 2.0 + (s % 3) * 0.01}) + "\n" for s in range(1, 31))
    log, state, follower = one_run(tmp_path, "")
    follower.run_pass(1.0)
    log.write_text(steps)
    assert follower.run_pass(2.0).notices == []
    with open(log, "a") as fh:  # the first epoch's mean, high from the warmup
        fh.write(json.dumps({"step": 30, "train_loss_epoch": 9.0}) + "\n")
    assert follower.run_pass(3.0).notices == []
    with open(log, "a") as fh:  # a real spike is still found
        fh.write(json.dumps({"step": 31, "train_loss_step": 9.5}) + "\n")
    assert [(n.kind, n.incident.step) for n in follower.run_pass(4.0).notices] == [("opened", 31)]
    state.close()


def test_an_alert_carries_the_curve_around_its_spike_for_the_messages_sparkline(tmp_path):
    """Webhook-only Slack cannot take the picture: the message's sparkline is drawn from the points
    the daemon saw, committed with the notice (and survives the outbox's JSON)."""
    from lossguard.alerts.message import for_notice
    from lossguard.display import sparkline
    from lossguard.model import Notice

    log, state, follower = one_run(tmp_path, _calm(range(1, 60)))
    follower.run_pass(1.0)
    with open(log, "a") as fh:
        fh.write(_line(60, 9.0) + _calm(range(61, 64)))
    (opened,) = [n for n in follower.run_pass(2.0, {str(log)}).notices if n.kind == "opened"]
    assert len(opened.spark) == 31 + 3 and max(opened.spark) == 9.0 and opened.spark[30] == 9.0  # 30 before, the spike, what followed
    (entry,) = [e for e in state.pending() if e.notice.kind == "opened"]
    assert entry.notice.spark == opened.spark
    blocks = json.dumps(for_notice(entry.notice, host="h").blocks, ensure_ascii=False)
    assert sparkline(opened.spark) in blocks
    back = Notice.from_json("opened", json.loads(json.dumps(Notice("opened", "r", opened.incident, spark=(1.0, float("nan"))).to_json())))
    assert back.spark[0] == 1.0 and back.spark[1] != back.spark[1]  # NaN survives as NaN
    state.close()


def _megatron(steps, spike_at=(), overflow_first=False) -> str:  # noqa: ANN001
    lines = ["[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8192, reducing to 4096\n"] if overflow_first else []
    for s in steps:
        loss = 9.0 if s in spike_at else 2.0 + (s % 5) * 0.01
        lines.append(f" iteration {s:8d}/    1200 | learning rate: 3.0E-04 | lm loss: {loss:.6E} | loss scale: 4096.0 | grad norm: {0.4 + (s % 3) * 0.01:.3f} |\n")
        if s in spike_at:
            lines.append("[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096, reducing to 2048\n")
    return "".join(lines)


def _said(inc) -> tuple:  # noqa: ANN001
    """An incident's place and causes, with what the OVERFLOW lines around it told (a scan also knows
    the spikes that came later, which an alert can not)."""
    return inc.run, inc.rule, inc.step, tuple((c.cause, c.evidence if c.cause == "numerical_instability" else "") for c in inc.causes)


def test_megatron_runs_read_together_pass_by_pass_alert_what_a_scan_of_their_logs_reports(tmp_path, monkeypatch):
    """A pass reads the new lines of many runs' Megatron logs in one parse (readmany); OVERFLOW
    lines that open a pass's piece take their step from the iteration before them, which the batch
    must not take from another run's file."""
    from lossguard.report import audit
    from lossguard.ingest import readmany
    from lossguard.ingest.reader import ReadOptions

    root = tmp_path / "runs"
    logs = []
    for k in range(6):
        log = root / f"run{k}" / "train.log"
        log.parent.mkdir(parents=True)
        log.write_text(_megatron(range(1000 * k + 1, 1000 * k + 30)))  # each run at steps of its own
        logs.append(log)
    together = []
    real = readmany.read_many

    def counted(jobs, **kw):  # noqa: ANN001, ANN003
        got = real(jobs, **kw)
        together.extend(job.fmt for job, res in zip(jobs, got) if res is not None)
        return got

    monkeypatch.setattr(readmany, "read_many", counted)
    state = State(tmp_path / "state")
    follower = Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)  # history
    opened = set()
    for p, (lo, hi) in enumerate([(30, 45), (45, 61), (61, 80)]):
        for k, log in enumerate(logs):
            with open(log, "a") as fh:
                at = 1000 * k
                fh.write(_megatron(range(at + lo, at + hi), spike_at={at + lo + 3} if (k + p) % 2 or k % 3 == 0 else (), overflow_first=k % 3 == 0))
        report = follower.run_pass(2.0 + p, {str(log) for log in logs})
        opened |= {_said(n.incident) for n in report.notices if n.kind == "opened"}
    state.close()
    assert together.count("megatron") >= 12  # most files' pieces were read together
    scanned = audit.scan([root], rules=default_rules(), options=ReadOptions())
    reported = {_said(i) for i in scanned.incidents if i.step % 1000 >= 30}
    assert opened == reported and len({step for _, _, step, _ in reported}) >= 6


def test_files_under_a_folder_that_cannot_be_listed_for_now_are_kept_not_dropped_as_gone(tmp_path, monkeypatch):
    import errno
    import os

    root, state, follower, logged = calm_runs(tmp_path, "a", "b")
    real_scandir = os.scandir

    def scandir(path):  # noqa: ANN001, ANN202 - the process is out of descriptors (idle sockets took them all)
        if os.fspath(path) == str(root / "b"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    follower.run_pass(2.0)
    assert sorted(state.files()) == [str(root / "a/metrics.jsonl"), str(root / "b/metrics.jsonl")]  # before: b's dropped as gone
    assert not any("no longer followed" in line for line in logged), logged
    monkeypatch.setattr(os, "scandir", real_scandir)
    with open(root / "b" / "metrics.jsonl", "a") as fh:
        fh.write(_line(20, 9.0))
    report = follower.run_pass(3.0)
    assert [(n.kind, n.run) for n in report.notices] == [("opened", "b")]  # read on from where it was, not from the start
    state.close()


def test_a_root_not_read_whole_at_the_first_start_owes_its_history_through_a_restart(tmp_path):
    """An object store down at a fresh daemon's first start (here a folder `answered` says was not
    read whole): its files are not followed until it is, then read as history, the debt kept in
    the state across a restart; the other root is followed meanwhile, and what comes later is news."""
    store, local = tmp_path / "store", tmp_path / "local"
    (store / "exp").mkdir(parents=True)
    (store / "exp" / "metrics.jsonl").write_text(_calm(range(1, 50)) + _line(50, 9.0) + _calm(range(51, 100)))
    (local / "mine").mkdir(parents=True)
    (local / "mine" / "metrics.jsonl").write_text(_calm(range(1, 40)))
    up, said = {"yes": False}, []

    def follower(state: State) -> Follower:
        return Follower([store, local], rules=default_rules(), state=state, answered=lambda root: root != store or up["yes"], log=said.append)

    def opened(report) -> list[tuple[str, int]]:  # noqa: ANN001
        return [(n.run, n.incident.step) for n in report.notices if n.kind == "opened"]

    state = State(tmp_path / "state")
    assert opened(follower(state).run_pass(1.0)) == []
    assert state.history_owed() == {str(store)} and not any(p.startswith(str(store)) for p in state.files())
    state.close()

    state = State(tmp_path / "state")  # (a restart: the state is no longer fresh; the debt is its)
    again = follower(state)
    (local / "mine" / "metrics.jsonl").write_text(_calm(range(1, 40)) + _line(40, 9.0))
    assert opened(again.run_pass(2.0)) == [("local/mine", 40)]  # (the other root is followed meanwhile)
    assert state.history_owed() == {str(store)}
    up["yes"] = True
    assert opened(again.run_pass(3.0)) == []  # the store's past spike (step 50): history
    assert state.history_owed() == set() and f"{store}/exp/metrics.jsonl" in state.files()
    assert any("read as history, not alerted" in text for text in said), said
    with open(store / "exp" / "metrics.jsonl", "a") as fh:
        fh.write(_calm(range(100, 130)) + _line(130, 9.0))
    assert opened(again.run_pass(4.0)) == [("store/exp", 130)]
    state.close()
