"""The daemon on a run written per rank: each rank's files are a stream of their own (`job [rank 1]`),
judged on its own, but one event seen on several ranks (the same bad batch's spike on every data
parallel replica, a failing rank taking the others down) is one alert naming the ranks: at once
when the ranks' files show it in the same pass, as an update of the open alert when a rank's file
shows it later; never a second alert, and nothing again after a restart on the same state. The
passes run in-process with the clock given (test_watch_crash.follower)."""

from __future__ import annotations

import math
from pathlib import Path

from lossguard.alerts.message import describe, for_notice
from lossguard.alerts.notify_text import headline
from lossguard.cli import main

from .test_crash import NCCL, OOM
from .test_ranks import torchrun_log
from .test_watch_crash import follower


def lines(steps: range, *, spike_at: int | None = None, nan: range = range(0)) -> str:
    """transformers' Trainer console (trainer.py, `self.log`), a small wobble on a falling loss."""
    def loss(s: int) -> str:
        return "9.0" if s == spike_at else "nan" if s in nan else f"{2.5 - s * 0.002 + 0.01 * math.sin(s):.4f}"
    return "".join(f"{{'loss': {loss(s)}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': {s / 100:.2f}}}\n" for s in steps)


def append(log_dir: Path, rank: int, text: str) -> None:
    with open(log_dir / "none_k3j2x9ab" / "attempt_0" / str(rank) / "stdout.log", "a") as fh:
        fh.write(text)


def started(tmp_path: Path, ranks: int, *, history: str | None = None, **options):  # noqa: ANN003, ANN201
    """A job's ranks with `history` each (60 steps of the Trainer's console), and a daemon that read
    them at its first start."""
    runs = tmp_path / "runs"
    for rank in range(ranks):
        torchrun_log(runs, rank, history or lines(range(1, 61)))
    state, f = follower(tmp_path, **options)
    f.run_pass(1.0)
    return runs, state, f


ILLEGAL_ACCESS = (
    "Traceback (most recent call last):\n"
    '  File "/home/u/train.py", line 88, in <module>\n'
    "    loss.backward()\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
)


def said(report) -> list[tuple]:  # noqa: ANN001
    return [(n.kind, n.run, n.incident.rule if n.incident else None, n.incident.rank_list if n.incident else None, n.also)
            for n in report.notices]


def test_the_same_spike_on_every_data_parallel_rank_is_one_alert_naming_them_and_nothing_again_after_a_restart(tmp_path):
    runs, state, f = started(tmp_path, 4)
    for rank in range(4):
        append(runs, rank, lines(range(61, 91), spike_at=80))
    report = f.run_pass(2.0)
    assert said(report) == [("opened", "none_k3j2x9ab [rank 0]", "loss-spike", ("0", "1", "2", "3"), None),
                            ("resolved", "none_k3j2x9ab [rank 0]", "loss-spike", ("0", "1", "2", "3"), None)]
    opened = report.notices[0]
    assert describe(opened).startswith("OPENED [warning] run none_k3j2x9ab [ranks 0, 1, 2, 3]: loss spike at step 80")
    assert "none_k3j2x9ab [ranks 0, 1, 2, 3]" in for_notice(opened, host="h").blocks[0]["text"]["text"]
    # Every rank's incident is recorded (its stream's state is its own), the others as joined.
    joined = state.db.execute("SELECT run, joined FROM incidents ORDER BY run").fetchall()
    lead = state.db.execute("SELECT id FROM incidents WHERE run='none_k3j2x9ab [rank 0]'").fetchone()[0]
    assert joined == [("none_k3j2x9ab [rank 0]", None)] + [(f"none_k3j2x9ab [rank {r}]", lead) for r in (1, 2, 3)]
    assert state.firing()[0] == []  # (resolved: nothing for Alertmanager to repeat, the joined ones neither)
    state.close()
    state, f = follower(tmp_path)  # restarted on the same state, as after kill -9
    for rank in range(4):
        append(runs, rank, lines(range(91, 101)))
    assert said(f.run_pass(3.0)) == [] and said(f.run_pass(4.0)) == []
    state.close()


def test_a_rank_whose_file_shows_the_spike_a_pass_later_updates_the_open_alert_and_its_recovery_is_said_once(tmp_path):
    runs, state, f = started(tmp_path, 2)
    append(runs, 0, lines(range(61, 82), spike_at=80))
    assert said(f.run_pass(2.0)) == [("opened", "none_k3j2x9ab [rank 0]", "loss-spike", ("0",), None)]
    append(runs, 1, lines(range(61, 82), spike_at=80))
    report = f.run_pass(3.0)
    assert said(report) == [("updated", "none_k3j2x9ab [rank 0]", "loss-spike", ("0", "1"), "1")]
    assert describe(report.notices[0]).startswith("UPDATED [warning] run none_k3j2x9ab [ranks 0, 1]: loss spike at step 80 also on rank 1")
    assert headline(report.notices[0]) == "WARNING: loss spike, also on rank 1 in run none_k3j2x9ab [ranks 0, 1]"
    # Both recover: one resolution, the alert's, naming both ranks.
    for rank in range(2):
        append(runs, rank, lines(range(82, 100)))
    assert said(f.run_pass(4.0)) == [("resolved", "none_k3j2x9ab [rank 0]", "loss-spike", ("0", "1"), None)]
    state.close()


def test_a_spike_on_one_rank_alone_is_that_ranks_alert(tmp_path):
    runs, state, f = started(tmp_path, 2)
    append(runs, 0, lines(range(61, 91)))
    append(runs, 1, lines(range(61, 91), spike_at=70))
    report = f.run_pass(2.0)
    assert [n[:4] for n in said(report)] == [("opened", "none_k3j2x9ab [rank 1]", "loss-spike", ("1",)),
                                             ("resolved", "none_k3j2x9ab [rank 1]", "loss-spike", ("1",))]
    assert describe(report.notices[0]).startswith("OPENED [warning] run none_k3j2x9ab [rank 1]: loss spike at step 70")
    state.close()


def test_ranks_that_crash_together_are_one_crash_naming_them(tmp_path):
    # Rank 1 runs out of memory; rank 0, waiting on it in an all-reduce, dies of the NCCL watchdog.
    runs = tmp_path / "runs"
    for rank in range(2):
        torchrun_log(runs, rank, lines(range(1, 41)))
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    f.run_pass(1000.0)
    append(runs, 0, lines(range(41, 51)) + NCCL)
    append(runs, 1, lines(range(41, 50)) + OOM)
    assert said(f.run_pass(1010.0)) == []
    report = f.run_pass(1100.0)
    # One alert, naming both ranks, and the error of the rank that failed, not its aftermath.
    assert [(n.kind, n.run, n.incident.shown_run, n.incident.error) for n in report.notices] == [
        ("opened", "none_k3j2x9ab [rank 1]", "none_k3j2x9ab [ranks 0, 1]", "CUDA out of memory on rank 1")]
    state.close()
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    assert said(f.run_pass(2000.0)) == [] and said(f.run_pass(2100.0)) == [] and said(f.run_pass(9000.0)) == []
    state.close()


def nanogpt(steps: range, *, slow: range = range(0)) -> str:
    """nanoGPT's train.py console: `iter 10: loss 2.3100, time 151.20ms, mfu 30.00%`; 3x the time in `slow`."""
    return "".join(f"iter {s}: loss {2.5 - s * 0.002:.4f}, time {150.0 * (3 if s in slow else 1) + (s % 3) * 0.5:.2f}ms, mfu 30.00%\n"
                   for s in steps)


def test_a_rank_that_falls_behind_the_others_is_one_straggler_alert_until_it_catches_up(tmp_path):
    runs, state, f = started(tmp_path, 4, history=nanogpt(range(0, 30)))
    slow = range(40, 80)
    # The ranks' files are read in passes of their own (the slow rank's last), as inotify hands them over.
    for rank in (0, 1, 3):
        append(runs, rank, nanogpt(range(30, 60)))
    assert said(f.run_pass(2.0)) == []
    append(runs, 2, nanogpt(range(30, 60), slow=slow))
    report = f.run_pass(3.0)
    assert said(report) == [("opened", "none_k3j2x9ab [rank 2]", "straggler", ("2",), None)]
    assert describe(report.notices[0]).startswith("OPENED [warning] run none_k3j2x9ab [rank 2]: step_time straggler at step 40 (peak 450.5 at 40, the other ranks' median 150.5")
    for rank in range(4):
        append(runs, rank, nanogpt(range(60, 75), slow=slow if rank == 2 else range(0)))
    assert said(f.run_pass(4.0)) == []  # still behind: the same alert, not another
    state.close()
    state, f = follower(tmp_path)  # restarted, as after kill -9
    for rank in range(4):
        append(runs, rank, nanogpt(range(75, 100), slow=slow if rank == 2 else range(0)))
    assert said(f.run_pass(5.0)) == [("resolved", "none_k3j2x9ab [rank 2]", "straggler", ("2",), None)]
    for rank in range(4):
        append(runs, rank, nanogpt(range(100, 130)))
    assert said(f.run_pass(6.0)) == []
    state.close()


def test_two_ranks_of_one_slow_node_are_one_straggler_alert_and_one_slow_step_is_none(tmp_path):
    runs, state, f = started(tmp_path, 4, history=nanogpt(range(0, 30)))
    for rank in range(4):
        append(runs, rank, nanogpt(range(30, 60), slow=range(40, 60) if rank in (2, 3) else range(35, 36) if rank == 0 else range(0)))
    assert said(f.run_pass(2.0)) == [("opened", "none_k3j2x9ab [rank 2]", "straggler", ("2", "3"), None)]
    state.close()


def test_status_lists_the_alerts_open_with_their_ranks_and_the_history_apart(tmp_path, capsys):
    runs = tmp_path / "runs"
    for rank in range(2):
        torchrun_log(runs, rank, lines(range(1, 61)))
    (runs / "old").mkdir()
    (runs / "old" / "train.log").write_text(lines(range(1, 41), spike_at=40))  # (its spike is history: open, never alerted)
    state, f = follower(tmp_path)
    f.run_pass(1.0)
    for rank in range(2):
        append(runs, rank, lines(range(61, 81), spike_at=80))  # (still open: nothing after it yet)
    f.run_pass(2.0)
    state.close()
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "1 open incident(s):\n  none_k3j2x9ab [rank 0]  step 80  loss-spike  (ranks 0, 1)\n" in out
    assert "1 open in the history read at the first start, not alerted:\n  old  loss-spike  1\n" in out


def test_the_alert_of_ranks_resolves_when_the_last_of_them_recovers_and_firing_holds_till_then(tmp_path):
    runs, state, f = started(tmp_path, 2)
    for rank in range(2):
        append(runs, rank, lines(range(61, 83), nan=range(80, 100)))
    assert [n[:4] for n in said(f.run_pass(2.0))] == [("opened", "none_k3j2x9ab [rank 0]", "loss-nonfinite", ("0", "1"))]
    append(runs, 0, lines(range(83, 90)))  # rank 0 is back; rank 1 still logs NaN
    append(runs, 1, lines(range(83, 90), nan=range(80, 100)))
    assert said(f.run_pass(3.0)) == []
    (firing,), _ = state.firing()  # (Alertmanager is still told it fires)
    assert firing.incident.run == "none_k3j2x9ab [rank 0]" and not firing.incident.over
    append(runs, 0, lines(range(90, 105)))
    append(runs, 1, lines(range(90, 105), nan=range(80, 100)))
    assert [n[:4] for n in said(f.run_pass(4.0))] == [("resolved", "none_k3j2x9ab [rank 0]", "loss-nonfinite", ("0", "1"))]
    assert state.firing()[0] == [] and said(f.run_pass(5.0)) == []
    state.close()


def test_a_rank_still_in_trouble_when_the_others_recovered_is_an_alert_of_its_own(tmp_path):
    runs, state, f = started(tmp_path, 2)
    append(runs, 0, lines(range(61, 90), nan=range(80, 81)))
    append(runs, 1, lines(range(61, 90), nan=range(80, 100)))
    assert [n[:4] for n in said(f.run_pass(2.0))] == [
        ("opened", "none_k3j2x9ab [rank 0]", "loss-nonfinite", ("0",)), ("resolved", "none_k3j2x9ab [rank 0]", "loss-nonfinite", ("0",)),
        ("opened", "none_k3j2x9ab [rank 1]", "loss-nonfinite", ("1",))]
    state.close()


def test_a_job_whose_ranks_all_hang_is_one_stalled_notice_and_one_resumed(tmp_path):
    runs, state, f = started(tmp_path, 8, stall_after=600)
    for rank in range(8):
        append(runs, rank, lines(range(61, 70)))
    f.run_pass(1000.0)
    assert [(n.kind, n.run) for n in f.run_pass(1700.0).notices] == [("stalled", "none_k3j2x9ab [rank 7]")]  # (an NCCL hang: said as the last rank goes quiet)
    assert said(f.run_pass(2400.0)) == []
    for rank in range(8):
        append(runs, rank, lines(range(70, 75)))
    assert [(n.kind, n.run) for n in f.run_pass(2500.0).notices] == [("resumed", "none_k3j2x9ab [rank 0]")]
    state.close()


def test_a_job_restarted_after_its_crash_and_crashing_again_is_alerted_again(tmp_path):
    # torchrun restarts the job from a checkpoint (attempt_1) before the first crash's step; it dies again.
    runs, state, f = started(tmp_path, 2, crash_after=60, stall_after=6000)
    for rank in range(2):
        append(runs, rank, lines(range(61, 80)) + (OOM if rank == 1 else NCCL))
    f.run_pass(1000.0)
    assert [(n.kind, n.incident.step) for n in f.run_pass(1100.0).notices] == [("opened", 79)]
    for rank in range(2):
        torchrun_log(runs, rank, lines(range(50, 70)), attempt=1)
    # (The Trainer's console counts its steps from each file's start: the restart's file logs from step 1.)
    assert [(n.kind, n.incident.ending if n.incident else None) for n in f.run_pass(1200.0).notices] == [
        ("resumed", None), ("resolved", "ended when the run resumed from step 1")]
    for rank in range(2):
        with open(runs / "none_k3j2x9ab" / "attempt_1" / str(rank) / "stdout.log", "a") as fh:
            fh.write(lines(range(70, 75)) + (ILLEGAL_ACCESS if rank == 1 else NCCL))
    f.run_pass(1210.0)
    # (Named by the latest attempt's error, not by the first attempt's OOM its files still end in.)
    assert [(n.kind, n.incident.shown_run, n.incident.step, n.incident.error) for n in f.run_pass(1300.0).notices] == [
        ("opened", "none_k3j2x9ab [ranks 0, 1]", 25, "uncaught RuntimeError on rank 1")]
    state.close()


def test_a_clean_ranks_spike_is_alerted_though_a_noisy_rank_folded_its_own_at_that_step(tmp_path):
    def hf(steps: range, value) -> str:  # noqa: ANN001
        return "".join(f"{{'loss': {value(s):.4f}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': {s / 100:.2f}}}\n" for s in steps)

    noisy = lambda s: 3.0 if s == 80 else (1.0 if s % 2 else 1.6) * (1 + 0.05 * math.sin(s))  # noqa: E731 - (a batch-to-batch 1.6x)
    clean = lambda s: 9.0 if s == 80 else 2.5 - s * 0.002 + 0.01 * math.sin(s)  # noqa: E731
    runs = tmp_path / "runs"
    torchrun_log(runs, 0, hf(range(1, 61), noisy))
    torchrun_log(runs, 1, hf(range(1, 61), clean))
    state, f = follower(tmp_path)
    f.run_pass(1.0)
    append(runs, 0, hf(range(61, 100), noisy))
    assert said(f.run_pass(2.0)) == []  # (within rank 0's own noise: folded)
    append(runs, 1, hf(range(61, 100), clean))
    assert [n[:4] for n in said(f.run_pass(3.0))] == [("opened", "none_k3j2x9ab [rank 1]", "loss-spike", ("1",)),
                                                      ("resolved", "none_k3j2x9ab [rank 1]", "loss-spike", ("1",))]
    state.close()


def test_a_straggler_whose_streak_left_the_others_tails_resolves_when_it_is_among_them_again(tmp_path):
    runs, state, f = started(tmp_path, 4, history=nanogpt(range(0, 30)))
    for rank in range(4):
        append(runs, rank, nanogpt(range(30, 60), slow=range(40, 80) if rank == 2 else range(0)))
    assert [n[:3] for n in said(f.run_pass(2.0))] == [("opened", "none_k3j2x9ab [rank 2]", "straggler")]
    for rank in (0, 1, 3):  # (their tails now hold only steps past the slow streak)
        append(runs, rank, nanogpt(range(60, 600)))
    f.run_pass(3.0)
    append(runs, 2, nanogpt(range(60, 600), slow=range(40, 80)))
    assert [n[:3] for n in said(f.run_pass(4.0))] == [("resolved", "none_k3j2x9ab [rank 2]", "straggler")]
    assert state.firing()[0] == []
    state.close()


def test_a_rank_behind_again_after_the_job_restarted_from_a_checkpoint_is_a_straggler_of_the_new_timeline(tmp_path):
    def ng(steps: range, slow: range = range(0)) -> str:  # (2x slower: a straggler, not a slowdown of its own)
        return "".join(f"iter {s}: loss {2.5 - s * 0.002:.4f}, time {150.0 * (2 if s in slow else 1) + (s % 3) * 0.5:.2f}ms, mfu 30.00%\n" for s in steps)

    runs, state, f = started(tmp_path, 4, history=ng(range(0, 30)))
    for rank in range(4):
        append(runs, rank, ng(range(30, 100), slow=range(40, 60) if rank == 2 else range(0)))
    assert [(n.kind, n.incident.step) for n in f.run_pass(2.0).notices] == [("opened", 40), ("resolved", 40)]
    for rank in range(4):  # (restarted from step 20: the steps go back)
        append(runs, rank, ng(range(20, 100), slow=range(30, 50) if rank == 2 else range(0)))
    report = f.run_pass(3.0)
    assert [(n.kind, n.run, n.incident.step, n.incident.timeline) for n in report.notices] == [
        ("opened", "none_k3j2x9ab [rank 2]", 30, 1), ("resolved", "none_k3j2x9ab [rank 2]", 30, 1)]
    state.close()


def test_a_restarted_job_dying_again_at_the_same_step_is_alerted_again(tmp_path):
    # (A crash loop: the same batch, the same OOM, each restart from the checkpoint before it.)
    runs, state, f = started(tmp_path, 2, history=nanogpt(range(0, 30)), crash_after=60, stall_after=6000)
    for rank in range(2):
        append(runs, rank, nanogpt(range(30, 41)) + (OOM if rank == 1 else NCCL))
    f.run_pass(1000.0)
    assert [n.kind for n in f.run_pass(1100.0).notices] == ["opened"]
    for rank in range(2):
        torchrun_log(runs, rank, nanogpt(range(20, 30)), attempt=1)
    f.run_pass(1200.0)
    for rank in range(2):
        with open(runs / "none_k3j2x9ab" / "attempt_1" / str(rank) / "stdout.log", "a") as fh:
            fh.write(nanogpt(range(30, 41)) + (OOM if rank == 1 else NCCL))
    f.run_pass(1210.0)
    assert [(n.kind, n.incident.step) for n in f.run_pass(1300.0).notices] == [("opened", 40)]
    state.close()
    state, f = follower(tmp_path, crash_after=60, stall_after=6000)
    assert said(f.run_pass(1400.0)) == [] and said(f.run_pass(1500.0)) == []
    state.close()


def test_one_rank_quiet_while_the_others_run_is_no_stall_of_the_job_and_its_stalls_and_resumes_pair_up(tmp_path):
    runs, state, f = started(tmp_path, 2, stall_after=600)
    append(runs, 0, lines(range(61, 70)))
    append(runs, 1, lines(range(61, 70)))
    f.run_pass(1000.0)
    append(runs, 1, lines(range(70, 80)))  # (rank 0's output buffered: quiet, rank 1 goes on)
    f.run_pass(1500.0)
    assert said(f.run_pass(1700.0)) == []
    assert [(n.kind, n.run) for n in f.run_pass(2200.0).notices] == [("stalled", "none_k3j2x9ab [rank 1]")]
    append(runs, 0, lines(range(70, 90)))
    assert [n.kind for n in f.run_pass(2300.0).notices] == ["resumed"]
    append(runs, 0, lines(range(90, 95)))
    f.run_pass(2400.0)
    assert [n.kind for n in f.run_pass(3100.0).notices] == ["stalled"]  # (quiet again, rank 1 still quiet: the job stalled again)
    state.close()
