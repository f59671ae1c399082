"""Crash findings: a run whose output ends in the error that ended it is a `crash` finding at the
last step it reached, naming the error; a traceback the run lived through, an OOM a framework
skipped and a clean finish are none. The samples are the messages as their programs print them;
each names the source file that prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lossguard.detection.crash import find_crash, tail_says
from lossguard.detection.rules import default_rules, load_rules
from lossguard.errors import ConfigError
from lossguard.ingest.sources.texttail import TAIL_BYTES, Tail, tail_lines, tails_of
from lossguard.report.audit import scan

from .conftest import CORPUS, run_lossguard


def hf_lines(steps: range, *, batch: bool = False) -> str:
    """transformers' Trainer console: its log dicts, one a logging step (trainer.py, `self.log`)."""
    head = "***** Running training *****\n  Num examples = 6400\n  Instantaneous batch size per device = 32\n" if batch else ""
    return head + "".join(f"{{'loss': {2.5 - s * 0.01:.4f}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': {s / 100:.2f}}}\n" for s in steps)


FRAMES = (
    "Traceback (most recent call last):\n"
    '  File "/home/u/train.py", line 88, in <module>\n'
    "    trainer.train()\n"
    '  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1553, in _wrapped_call_impl\n'
    "    return self._call_impl(*args, **kwargs)\n"
)
# c10/cuda/CUDACachingAllocator.cpp (torch >= 2.1), raised as torch.OutOfMemoryError.
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated "
    "memory 71.30 GiB is allocated by PyTorch, and 6.12 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
    "See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
)
# c10/cuda/CUDACachingAllocator.cpp before torch 2.1, raised as a RuntimeError.
OLD_OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 23.69 GiB total capacity; 21.80 GiB already "
    "allocated; 1.02 GiB free; 21.95 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try "
    "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n"
)
# XLA's status as jaxlib raises it (xla/python/xla_extension: XlaRuntimeError, absl's RESOURCE_EXHAUSTED).
XLA = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.\n"
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, the watchdog's LOG(ERROR) with glog's prefix and torchrun's rank.
NCCL = (
    "[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 "
    "milliseconds before timing out.\n"
)


def child_failed(exitcode: int, traceback: str) -> str:
    """torch/distributed/elastic/multiprocessing/errors/__init__.py: ChildFailedError.format_msg's table."""
    return (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n  <NO_OTHER_FAILURES>\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-06-08_19:04:45\n"
        "  host      : gpu-node-007.cluster\n"
        f"  rank      : 1 (local_rank: 1)\n"
        f"  exitcode  : {exitcode} (pid: 102931)\n"
        "  error_file: <N/A>\n"
        f"  traceback : {traceback}\n"
        "============================================================\n"
    )


# slurmstepd (src/plugins/task/cgroup, the cgroup OOM count at the step's end).
SLURM_OOM = "slurmstepd: error: Detected 1 oom_kill event in StepId=4242.batch. Some of the step tasks have been OOM Killed.\n"
# slurmstepd (src/slurmd/slurmstepd/req.c, the job cancelled at its time limit).
SLURM_TIME = "slurmstepd: error: *** JOB 4242 ON gpu-node-007 CANCELLED AT 2026-03-01T03:12:44 DUE TO TIME LIMIT ***\n"
# bash's jobs.c: a job's death by a signal, its strsignal text ("Killed", "Segmentation fault").
BASH_KILLED = "/var/spool/slurmd/job4242/slurm_script: line 12: 31337 Killed                  python train.py\n"
BASH_SEGV = "/var/spool/slurmd/job4242/slurm_script: line 12: 31337 Segmentation fault      (core dumped) python train.py\n"
# torch/utils/data/_utils/__init__.py (ExceptionWrapper.reraise): a data loader worker's exception.
LOADER = (
    "Traceback (most recent call last):\n"
    '  File "/home/u/train.py", line 120, in <module>\n'
    "    for batch in loader:\n"
    '  File "/opt/conda/lib/python3.11/site-packages/torch/_utils.py", line 706, in reraise\n'
    "    raise exception\n"
    "KeyError: Caught KeyError in DataLoader worker process 0.\n"
)


CRASHES = [
    pytest.param(hf_lines(range(1, 41)) + FRAMES + OOM, "crash-cuda-oom", "CUDA out of memory", id="torch.OutOfMemoryError"),
    pytest.param(hf_lines(range(1, 41)) + FRAMES + OLD_OOM, "crash-cuda-oom", "CUDA out of memory", id="RuntimeError: CUDA out of memory"),
    pytest.param(hf_lines(range(1, 41)) + "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n" + XLA, "crash-xla-oom",
                 "XLA resource exhausted (out of device memory)", id="XLA RESOURCE_EXHAUSTED"),
    pytest.param(hf_lines(range(1, 41)) + NCCL, "crash-nccl-timeout", "NCCL watchdog timeout", id="NCCL watchdog"),
    pytest.param(hf_lines(range(1, 41)) + child_failed(1, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
                 "crash-worker-failed", "torchrun worker failed (ChildFailedError) on rank 1 (gpu-node-007.cluster)", id="ChildFailedError"),
    pytest.param(hf_lines(range(1, 41)) + child_failed(-11, "Signal 11 (SIGSEGV) received by PID 102931"), "crash-segfault",
                 "Segmentation fault on rank 1 (gpu-node-007.cluster)", id="ChildFailedError exitcode -11"),
    pytest.param(hf_lines(range(1, 41)) + child_failed(-9, "Signal 9 (SIGKILL) received by PID 102931"), "crash-killed",
                 "Killed (SIGKILL) on rank 1 (gpu-node-007.cluster)", id="ChildFailedError exitcode -9"),
    pytest.param(hf_lines(range(1, 41)) + SLURM_OOM, "crash-slurm-oom", "killed by SLURM for host memory (oom_kill)", id="SLURM oom_kill"),
    pytest.param(hf_lines(range(1, 41)) + SLURM_TIME, "crash-slurm-time-limit", "SLURM time limit", id="SLURM time limit"),
    pytest.param(hf_lines(range(1, 41)) + BASH_KILLED, "crash-killed", "Killed (SIGKILL)", id="the shell's Killed"),
    pytest.param(hf_lines(range(1, 41)) + BASH_SEGV, "crash-segfault", "Segmentation fault", id="the shell's Segmentation fault"),
    pytest.param(hf_lines(range(1, 41)) + LOADER, "crash-exception", "uncaught KeyError", id="a data loader's traceback"),
    # An error line carrying a step is an error, not progress: a logger's `[step N]` prefix, a job step's id.
    pytest.param(hf_lines(range(1, 41)) + "[step 1200] " + OOM, "crash-cuda-oom", "CUDA out of memory", id="an OOM line prefixed by its step"),
    pytest.param(hf_lines(range(1, 41)) + FRAMES + "[step 1200] " + OOM, "crash-cuda-oom", "CUDA out of memory",
                 id="a traceback closed by an OOM prefixed by its step"),
    pytest.param(hf_lines(range(1, 41)) + LOADER.replace("KeyError: Caught", "[step 1200] KeyError: Caught"), "crash-exception",
                 "uncaught KeyError", id="a traceback closed by an exception prefixed by its step"),
    pytest.param(hf_lines(range(1, 41)) + SLURM_TIME.replace("*** JOB 4242 ON", "*** STEP 4242.0 ON"), "crash-slurm-time-limit",
                 "SLURM time limit", id="SLURM time limit of a job step"),
]


def crash_of(text: str, *, run: str = "exp", last_step: int | None = 40):
    return find_crash([Tail("train.log", tuple(text.splitlines()))], default_rules().crashes, run=run, last_step=last_step)


@pytest.mark.parametrize(("text", "rule", "error"), CRASHES)
def test_an_output_that_ends_in_an_error_is_a_crash_at_the_last_step_naming_it(text, rule, error):
    found = crash_of(text)
    assert found is not None
    inc = found.incident
    assert (inc.rule, inc.kind, inc.error, inc.step, found.source) == (rule, "crash", error, 40, "train.log")
    assert inc.lines and all(len(line) <= 300 for line in inc.lines) and len(inc.lines) <= 6
    assert inc.causes and all(c.evidence and c.suggestion for c in inc.causes)


def test_torchruns_table_names_the_failing_rank_and_host():
    inc = crash_of(hf_lines(range(1, 41)) + child_failed(1, "To enable traceback see: ...")).incident
    assert "  host      : gpu-node-007.cluster" in inc.lines and "  rank      : 1 (local_rank: 1)" in inc.lines
    assert any(line.startswith("  exitcode  : 1") for line in inc.lines)
    assert (inc.ranks, inc.host, inc.where) == (("1",), "gpu-node-007.cluster", "rank 1 on gpu-node-007.cluster")


def test_the_root_cause_names_the_crash_rather_than_what_followed_it():
    # Rank 0's OOM, then the others' NCCL timeout and torchrun's table: the OOM is the crash.
    inc = crash_of(hf_lines(range(1, 41)) + FRAMES + OOM + NCCL + child_failed(1, "...")).incident
    assert inc.rule == "crash-cuda-oom"


NOT_CRASHES = [
    pytest.param(hf_lines(range(1, 21)) + LOADER + hf_lines(range(21, 41)), id="a traceback the run lived through"),
    # fairseq/trainer.py (2017-2019): the OOM caught, the batch skipped.
    pytest.param(hf_lines(range(1, 41)) + "| WARNING: ran out of memory, skipping batch\n", id="fairseq skipping batch"),
    # fairseq/trainer.py (_log_oom, then train_step's warning): caught and recovered.
    pytest.param(hf_lines(range(1, 41)) + "2026-01-01 03:00:00 | WARNING | fairseq.trainer | OOM: Ran out of memory with exception: "
                 + OOM.split(": ", 1)[1] + "2026-01-01 03:00:00 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass\n",
                 id="fairseq attempting to recover from OOM"),
    # transformers/trainer.py: the end of train(), then its summary dict.
    pytest.param(hf_lines(range(1, 41)) + "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n\n"
                 "{'train_runtime': 120.5, 'train_samples_per_second': 53.1, 'train_steps_per_second': 0.33, 'train_loss': 2.1, 'epoch': 0.4}\n",
                 id="transformers Training completed"),
    # lightning/pytorch/loops/fit_loop.py (FitLoop.done).
    pytest.param(hf_lines(range(1, 41)) + "`Trainer.fit` stopped: `max_steps=40` reached.\n", id="Lightning max_steps reached"),
    pytest.param(hf_lines(range(1, 41)) + FRAMES, id="a traceback still being written"),
    pytest.param(hf_lines(range(1, 41)) + "Saving model checkpoint to out/checkpoint-40\n", id="a plain last line"),
    pytest.param(hf_lines(range(1, 41)) + "Killed 3 stale data loader workers before the next epoch\n" + hf_lines(range(41, 45)), id="a line that says Killed, then steps"),
]


@pytest.mark.parametrize("text", NOT_CRASHES)
def test_an_output_that_did_not_end_in_an_error_is_no_crash(text):
    assert crash_of(text) is None


def test_the_tail_says_a_clean_finish_from_a_stop_and_from_nothing():
    done = tail_says(tuple((hf_lines(range(1, 5)) + "\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"
                            "{'train_runtime': 1.0, 'train_loss': 2.1, 'epoch': 1.0}\n").splitlines()))
    assert done.finished and done.last_line.startswith("{'train_runtime'")
    stopped = tail_says(tuple((hf_lines(range(1, 5)) + "Saving model checkpoint to out/checkpoint-4\n").splitlines()))
    assert not stopped.finished and stopped.last_line == "Saving model checkpoint to out/checkpoint-4"
    assert tail_says(()) == tail_says(("", "   ")) and tail_says(()).last_line is None


def test_an_oom_advice_follows_what_the_log_shows():
    # The fragmentation the numbers show comes first: 6.12 GiB reserved but unallocated against 2 GiB asked.
    causes = crash_of(hf_lines(range(1, 41)) + FRAMES + OOM).incident.causes
    assert causes[0].cause == "memory fragmentation" and "expandable_segments:True" in causes[0].suggestion
    assert "tried to allocate 2.00 GiB with 1.06 GiB free" in causes[0].evidence
    # Reserved 21.95 GiB against 21.80 allocated: no fragmentation; the logged batch size and
    # sequence length are what to cut, in the seed's proportions.
    logged = "max_seq_len=2048\n" + hf_lines(range(1, 41), batch=True) + FRAMES + OLD_OOM
    causes = crash_of(logged).incident.causes
    assert [c.cause for c in causes] == ["batch too large for the GPU", "sequences too long for the GPU", "model state too large for the GPU"]
    assert causes[0].suggestion.startswith("batch size 32 → 8 with gradient accumulation 4")
    assert causes[1].suggestion.startswith("max_seq_len 2048 → 1024")
    assert "gradient checkpointing" in causes[2].suggestion and "flash attention" in causes[2].suggestion


def test_a_rules_file_adds_its_own_errors_and_a_bad_pattern_is_refused(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[rule]]\nname = "deadlock"\nkind = "crash"\nerror = "data pipeline deadlock"\npatterns = [\'DeadlockDetected: worker \\d+\']\nadvice = "launcher"\n')
    rules = load_rules([Path("default"), mine])
    found = find_crash([Tail("log", ("{'loss': 2.0, 'epoch': 0.1}", "DeadlockDetected: worker 3 waited 600 s"))], rules.crashes, run="r", last_step=7)
    assert (found.incident.rule, found.incident.error) == ("deadlock", "data pipeline deadlock")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nname = "broken"\nkind = "crash"\nerror = "x"\npatterns = ["(unclosed"]\n')
    with pytest.raises(ConfigError, match=r"bad.toml: rule 'broken': patterns: '\(unclosed' is no regular expression"):
        load_rules([bad])
    bad.write_text('[[rule]]\nname = "empty"\nkind = "crash"\nerror = "x"\npatterns = []\n')
    with pytest.raises(ConfigError, match="patterns: Input should be a non-empty list of non-empty strings"):
        load_rules([bad])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_scan_finds_crashes_where_runs_write_their_output(tmp_path):
    # A run folder's metrics with its log beside them: the log's crash is that run's, at the metrics' last step.
    write(tmp_path / "beside" / "metrics.jsonl", "".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(0, 500, 10)))
    write(tmp_path / "beside" / "train.log", "loading model\n" + FRAMES + OOM)
    # SLURM's output file, a run of its own.
    write(tmp_path / "slurm" / "slurm-4242.out", hf_lines(range(1, 31)) + SLURM_TIME)
    # torchrun --log-dir: one job's ranks and attempts are one run; rank 1's stderr holds only a traceback.
    write(tmp_path / "tr" / "job7" / "attempt_0" / "0" / "stdout.log", "loading model\n")
    write(tmp_path / "tr" / "job7" / "attempt_0" / "1" / "stderr.log", FRAMES + OOM)
    result = scan([tmp_path], rules=default_rules())
    found = {r.run: [(i.rule, i.step, i.error) for i in r.incidents] for r in result.runs}
    assert found == {
        "beside": [("crash-cuda-oom", 490, "CUDA out of memory")],
        "slurm/slurm-4242": [("crash-slurm-time-limit", 30, "SLURM time limit")],
        "tr/job7": [("crash-cuda-oom", 0, "CUDA out of memory on rank 1, before any step was logged")],
    }
    # The log whose ending is the crash was read for it: not called a file of no metrics. A log of
    # the same run without metrics and without the crash still is.
    unrecognised = [p.source for p in result.all_problems if p.message == "no training metrics recognised in this file"]
    assert unrecognised == [str(tmp_path / "tr" / "job7" / "attempt_0" / "0" / "stdout.log")]


def test_scan_json_of_a_crash_and_its_exit_code(tmp_path):
    write(tmp_path / "exp" / "train.log", hf_lines(range(1, 41)) + FRAMES + OOM)
    res = run_lossguard("scan", str(tmp_path), "--format", "json")
    assert res.returncode == 1, res.stderr
    spike = json.loads(res.stdout)["runs"][0]["spikes"][0]
    assert {k: spike[k] for k in ("rule", "kind", "step", "error", "value")} == {
        "rule": "crash-cuda-oom", "kind": "crash", "step": 40, "error": "CUDA out of memory", "value": None}
    assert spike["lines"][0].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert spike["causes"][0]["cause"] == "memory fragmentation"
    assert json.loads(res.stdout)["summary"]["crashes"] == 1


def test_a_crash_line_is_escaped_in_every_report(tmp_path):
    from lossguard.report.scan_report import render

    write(tmp_path / "exp" / "train.log", hf_lines(range(1, 41)) + 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
          "ValueError: bad <script>alert(1)</script> | [x](javascript:y) \x1b[31mred\n")
    result = scan([tmp_path], rules=default_rules())
    assert result.runs[0].incidents[0].error == "uncaught ValueError"
    html, md, text = (render(result, f) for f in ("html", "markdown", "text"))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "ValueError: bad" in text and "\x1b" not in text
    assert "uncaught ValueError" in md


def test_the_tail_of_a_huge_log_is_read_alone(tmp_path):
    # A sparse 8 GiB log: only its last TAIL_BYTES are read, whatever its size (bounded by design).
    log = tmp_path / "train.log"
    with open(log, "wb") as fh:
        fh.truncate(8 << 30)
        fh.seek(8 << 30)
        fh.write(b"\n" + (FRAMES + OOM).encode())
    lines = tail_lines(log, final=True)
    assert lines[-1].startswith("torch.OutOfMemoryError") and sum(map(len, lines)) < TAIL_BYTES
    # A half-written last line of a growing file is not read until its newline comes.
    with open(log, "ab") as fh:
        fh.write(b"Segmentation fa")
    assert tail_lines(log, final=False)[-1].startswith("torch.OutOfMemoryError")
    assert [t.rank for t in tails_of([str(log), str(tmp_path / "gone.log"), str(tmp_path / "m.jsonl")], final=True)] == [None]


def test_backtest_no_crash_in_the_corpus_of_clean_runs():
    # The corpus' runs ended as they should: none of their console logs (several read) ends in an error.
    result = scan([CORPUS], rules=default_rules())
    consoles = [r for r in result.runs if tails_of(r.paths, final=True)]
    assert len(consoles) >= 5
    assert [(r.run, i.rule) for r in result.runs for i in r.incidents if i.is_crash] == []


def test_a_crash_alert_names_the_error_and_quotes_its_lines_as_data():
    from lossguard.alerts.labels import alert
    from lossguard.alerts.message import describe, for_notice
    from lossguard.model import Incident, Notice

    inc = crash_of(hf_lines(range(1, 41)) + 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
                   "ValueError: <!channel> *bold* `tick`\n").incident
    notice = Notice("opened", "exp", inc, source="runs/exp/train.log")
    slack = for_notice(notice, host="gpu1")
    assert slack.blocks[0]["text"]["text"].endswith("CRITICAL: run crashed: uncaught ValueError in exp")
    facts = slack.blocks[1]["text"]["text"]
    assert "*last step 40*" in facts and "`ValueError: &lt;!channel&gt; *bold* ˋtickˋ`" in facts and "<!channel>" not in slack.text
    assert describe(notice).startswith("OPENED [critical] run exp: crashed (uncaught ValueError) at step 40")
    body = alert(notice, starts=0.0, ends=None, host="gpu1")
    assert body["labels"]["alertname"] == "RunCrashed" and body["annotations"]["error"] == "uncaught ValueError"
    assert body["annotations"]["summary"] == "run exp crashed at step 40: uncaught ValueError" and "value" not in body["annotations"]
    again = Incident.from_json(json.loads(json.dumps(inc.to_json())))  # the state keeps it whole
    assert again.to_json() == inc.to_json() and again.lines == inc.lines and again.error == inc.error
