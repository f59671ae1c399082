"""Runs written per rank: each rank's files are a stream of one run, judged on its own; a finding on
one rank is the run's and names the rank; the same spike on data parallel replicas is one finding;
a rank slower than the others is a `straggler`. The layouts are the ones the launchers write."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lossguard.detection.rules import default_rules
from lossguard.ingest.discover import collect
from lossguard.report.audit import scan

from .conftest import run_lossguard


def hf_lines(*, spike_at: int | None = None, nan_at: int | None = None, steps: int = 120) -> str:
    """transformers' Trainer console (trainer.py, `self.log`): its log dicts, one a logging step."""
    out = []
    for s in range(1, steps + 1):
        loss = f"{2.5 - s * 0.002 + 0.01 * math.sin(s):.4f}"
        loss = "9.0" if s == spike_at else "nan" if s == nan_at else loss
        out.append(f"{{'loss': {loss}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': {s / 100:.2f}}}\n")
    return "".join(out)


def nanogpt_lines(*, ms: float, slow_from: int | None = None, loss: bool = True, steps: int = 60) -> str:
    """nanoGPT's train.py console: `iter 10: loss 2.3100, time 151.20ms, mfu 30.00%`."""
    out = []
    for s in range(steps):
        t = ms * (3 if slow_from is not None and s >= slow_from else 1) + (s % 3) * 0.5
        out.append(f"iter {s}: loss {2.5 - s * 0.002:.4f}, time {t:.2f}ms, mfu 30.00%\n" if loss else f"iter {s}: time {t:.2f}ms\n")
    return "".join(out)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def torchrun_log(log_dir: Path, rank: int, text: str, *, attempt: int = 0, stream: str = "stdout") -> Path:
    """torchrun --log-dir as torch lays it out (torch/distributed/elastic/multiprocessing/api.py,
    DefaultLogsSpecs.reify): a folder per run made by mkdtemp(prefix=f"{rdzv_run_id}_"), then
    `attempt_{restart_count}/{local_rank}/{stdout,stderr}.log`."""
    return write(log_dir / "none_k3j2x9ab" / f"attempt_{attempt}" / str(rank) / f"{stream}.log", text)


def findings(result) -> dict[str, list[tuple[str, int, list[int]]]]:
    return {r.run: [(i.rule, i.step, i.to_report().get("ranks", [])) for i in r.incidents] for r in result.runs}


def test_a_spike_and_a_nan_on_one_torchrun_rank_are_the_runs_naming_that_rank(tmp_path):
    torchrun_log(tmp_path, 0, hf_lines())
    torchrun_log(tmp_path, 1, hf_lines(spike_at=80, nan_at=100))
    torchrun_log(tmp_path, 1, "", stream="stderr")
    result = scan([tmp_path], rules=default_rules())
    assert [r.run for r in result.runs] == ["none_k3j2x9ab"]
    (run,) = result.runs
    assert run.files == 3
    got = {(i.rule, i.step): i.to_report() for i in run.incidents}
    assert {k: (v["run"], v["rank"], v["ranks"]) for k, v in got.items()} == {
        ("loss-spike", 80): ("none_k3j2x9ab", 1, [1]), ("loss-nonfinite", 100): ("none_k3j2x9ab", 1, [1]),
    }


def test_data_parallel_replicas_logging_the_same_loss_make_one_incident_per_spike(tmp_path):
    for rank in range(4):
        torchrun_log(tmp_path, rank, hf_lines(spike_at=80))
    torchrun_log(tmp_path, 2, hf_lines(spike_at=80), attempt=1)  # (a restart: the same rank's stream again)
    assert findings(scan([tmp_path], rules=default_rules())) == {"none_k3j2x9ab": [("loss-spike", 80, [0, 1, 2, 3])]}


def test_each_rank_is_judged_on_its_own_stream_not_interleaved_by_step(tmp_path):
    # Replicas whose local losses differ (per-rank batches): interleaved by step, every step a jump.
    for rank, level in enumerate((1.0, 4.0)):
        write(tmp_path / f"train_rank{rank}.log", "".join(f"{{'loss': {level - s * 0.001:.4f}, 'epoch': {s / 100:.2f}}}\n" for s in range(1, 120)))
    assert findings(scan([tmp_path], rules=default_rules())) == {"train": []}


def test_slurm_task_outputs_are_ranks_of_one_job_and_array_tasks_and_numbered_experiments_are_not(tmp_path):
    # sbatch --output=train_%j_%t.log (and %j.%t): the job id, then the task id.
    write(tmp_path / "train_4242_0.log", hf_lines())
    write(tmp_path / "train_4242_1.log", hf_lines(nan_at=60))
    write(tmp_path / "t" / "4243.0.out", hf_lines())
    write(tmp_path / "t" / "4243.1.out", hf_lines())
    # sbatch's default for job arrays (slurm-%A_%a.out): each task is a run of its own.
    write(tmp_path / "slurm-77_0.out", hf_lines())
    write(tmp_path / "slurm-77_1.out", hf_lines())
    # Numbered experiments: no job id, no rank 0.
    write(tmp_path / "exp_1.log", hf_lines())
    write(tmp_path / "exp_2.log", hf_lines())
    # One file of a job id and a number: no siblings to say it is a rank.
    write(tmp_path / "solo" / "eval_99_3.log", hf_lines())
    result = scan([tmp_path], rules=default_rules())
    assert findings(result) == {
        "exp_1": [], "exp_2": [], "slurm-77_0": [], "slurm-77_1": [], "solo/eval_99_3": [], "t/4243": [],
        "train_4242": [("loss-nonfinite", 60, [1])],
    }


def test_only_the_last_pipeline_stage_logging_the_loss_is_judged_and_no_rank_is_said_to_lack_it(tmp_path):
    write(tmp_path / "pp" / "log.rank0.txt", nanogpt_lines(ms=150, loss=False))
    write(tmp_path / "pp" / "log.rank1.txt", nanogpt_lines(ms=150).replace("iter 40: loss 2.4200", "iter 40: loss 9.0000"))
    result = scan([tmp_path], rules=default_rules())
    (run,) = result.runs
    assert (run.run, run.analysis.steps, run.analysis.notes) == ("pp/log", 60, ())
    assert findings(result) == {"pp/log": [("loss-spike", 40, [1])]}


def test_a_rank_slower_than_the_others_is_a_straggler_and_one_slow_step_is_not(tmp_path):
    for rank in range(4):
        write(tmp_path / "job" / f"worker-rank{rank}.log", nanogpt_lines(ms=150, slow_from=30 if rank == 2 else None))
    write(tmp_path / "blip" / "worker-rank0.log", nanogpt_lines(ms=150).replace("time 150.00ms", "time 900.00ms", 1))
    write(tmp_path / "blip" / "worker-rank1.log", nanogpt_lines(ms=150))
    result = scan([tmp_path], rules=default_rules())
    (job,) = [r for r in result.runs if r.run == "job/worker"]
    slow = [i for i in job.incidents if i.kind == "straggler"]
    assert [(i.rule, i.metric, i.step, i.rank_list, i.points) for i in slow] == [("straggler", "step_time", 30, ("2",), 30)]
    assert slow[0].value >= 450 and 150 <= slow[0].baseline <= 152
    assert [i.rule for i in job.incidents] == ["straggler"]  # (its own slowdown too, said once: as the straggler)
    assert [i for r in result.runs if r.run == "blip/worker" for i in r.incidents] == []


def test_two_ranks_of_one_slow_node_are_one_straggler_finding_naming_both(tmp_path):
    for rank in range(4):
        write(tmp_path / "job" / f"worker-rank{rank}.log", nanogpt_lines(ms=150, slow_from=30 if rank in (2, 3) else None))
    (job,) = scan([tmp_path], rules=default_rules()).runs
    assert [(i.rule, i.step, i.rank_list) for i in job.incidents] == [("straggler", 30, ("2", "3"))]


def test_a_replica_whose_loss_leaves_the_others_is_said(tmp_path):
    for rank in range(3):
        text = "".join(f"{{'loss': {(2.5 if rank != 1 or s < 50 else 6.0) - s * 0.001:.4f}, 'epoch': {s / 100:.2f}}}\n" for s in range(1, 100))
        write(tmp_path / f"dp_rank{rank}.log", text)
    (run,) = scan([tmp_path], rules=default_rules()).runs
    assert [(i.rule, i.step, i.rank_list) for i in run.incidents if i.kind == "straggler"] == [("diverging-replica", 50, ("1",))]


def test_torchruns_failure_table_names_the_rank_and_host_of_a_crash(tmp_path):
    # The launcher's own output (one SLURM file), torch/distributed/elastic/multiprocessing/errors/__init__.py's table.
    table = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n------------------------------------------------------------\n"
        "Failures:\n[1]:\n  time      : 2024-05-01_12:00:01\n  host      : node-9\n  rank      : 7 (local_rank: 3)\n"
        "  exitcode  : 1 (pid: 4243)\n------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2024-05-01_12:00:00\n  host      : gpu-node-3\n"
        "  rank      : 5 (local_rank: 1)\n  exitcode  : 1 (pid: 4242)\n  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n"
    )
    write(tmp_path / "slurm-4242.out", hf_lines(steps=30) + "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n" + table)
    res = run_lossguard("scan", str(tmp_path), "--format", "json")
    (crash,) = json.loads(res.stdout)["runs"][0]["spikes"]
    assert (crash["rank"], crash["ranks"], crash["host"], crash["error"]) == (5, [5], "gpu-node-3", "CUDA out of memory on rank 5 (gpu-node-3)")


def test_the_text_report_and_a_rules_file_know_a_run_by_its_name_whatever_its_ranks(tmp_path):
    torchrun_log(tmp_path, 0, hf_lines())
    torchrun_log(tmp_path, 1, hf_lines(spike_at=80))
    rules = write(tmp_path.parent / "rules.toml", '[[rule]]\nname = "mine"\nmetric = "loss"\nkind = "ratio"\nfactor = 2.0\nwindow = 9\nruns = "none_*"\n')
    res = run_lossguard("scan", str(tmp_path), "--rules", str(rules), "--run", "none_k3j2x9ab")
    assert res.returncode == 1, res.stderr
    assert "none_k3j2x9ab step 80 · rule mine" in res.stdout and "rank 1: loss 9 vs baseline" in res.stdout
    assert "[rank" not in res.stdout


def test_a_rank_folder_named_with_a_digit_that_is_no_number_is_no_rank_and_breaks_nothing(tmp_path):
    torchrun_log(tmp_path, 0, hf_lines())
    write(tmp_path / "none_k3j2x9ab" / "attempt_0" / "\u00b2" / "stdout.log", hf_lines())  # (`²`.isdigit(), yet no int)
    found, problems = collect([tmp_path])
    assert sorted(f.run for f in found) == ["none_k3j2x9ab [rank 0]", "none_k3j2x9ab/attempt_0/\u00b2"] and problems == []


def test_discovery_names_each_ranks_files_a_stream_of_the_run(tmp_path):
    # (the daemon follows these streams, its state keyed by them: an alert names `run [rank N]`)
    torchrun_log(tmp_path, 0, "")
    torchrun_log(tmp_path, 1, "", attempt=1)
    write(tmp_path / "logs" / "train_4242_0.log", "")
    write(tmp_path / "logs" / "train_4242_1.log", "")
    found, problems = collect([tmp_path])
    assert (sorted(f.run for f in found), problems) == (
        ["logs/train_4242 [rank 0]", "logs/train_4242 [rank 1]", "none_k3j2x9ab [rank 0]", "none_k3j2x9ab [rank 1]"], [])
