"""Runs written per rank: the files of one job that each rank (process) of it writes apart, known by
their names, so that each rank's rows are its own stream of the job's run (model.ranked).

- torchrun's `--log-dir` (torch/distributed/elastic/multiprocessing/api.py, `DefaultLogsSpecs`):
  `<log_dir>/<run_id>/attempt_<N>/<local_rank>/{stdout,stderr}.log`, named so by discovery itself.
- A rank word before a number at the end of a name (`train_rank1.log`, `log.rank3.txt`,
  `worker-rank0.jsonl`, `logs/rank2.out`): DeepSpeed's and many launch scripts' per-rank logs. The
  word says it: one such file is already a rank's.
- A job id then a task number (`train_%j_%t.log` -> `train_4242_1.log`, sbatch's `%j.%t` ->
  `4242.1.out`): SLURM's per-task outputs. A bare number says little (`exp_1.log`, `exp_2.log` are
  two experiments), so only a set of sibling files is taken for ranks: two or more that differ in
  that number alone, their base ending in a number (the job id), one of them rank 0. SLURM's own
  name for a job array's tasks, `slurm-%A_%a.out` (sbatch's default with --array), is left alone:
  array tasks are runs of their own, not ranks of one.

A Megatron-style `[Rank N]` prefix on lines of one file is not a file per rank: such lines stay in
their file's run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...model import ranked

RANK_WORD = re.compile(r"^(?P<base>.+?)(?:/|[._-])rank[._-]?(?P<n>\d{1,5})$", re.IGNORECASE)
JOB_TASK = re.compile(r"^(?P<base>.*\d)[._-](?P<n>\d{1,5})$")
ARRAY_TASK = re.compile(r"(?:^|/)slurm-\d+_\d+$")
"""sbatch's default output name for a job array's tasks (`slurm-%A_%a.out`)."""


def per_rank(runs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Run name -> the name of its rank's stream (`train_4242_1` -> `train_4242 [rank 1]`), for the
    runs of `runs` ((run, folder of one of its files) pairs) that are ranks of one job. Decided by
    the names alone, all of them at once: which runs are siblings needs them all."""
    out: dict[str, str] = {}
    tasks: dict[tuple[str, str], dict[str, str]] = {}
    for run, folder in runs:
        if run in out:
            continue
        word = RANK_WORD.match(run)
        if word and not word["base"].endswith("/"):
            out[run] = ranked(word["base"], word["n"])
            continue
        task = JOB_TASK.match(run)
        if task and not ARRAY_TASK.search(run) and "/" not in run[len(task["base"]):]:
            tasks.setdefault((folder, task["base"]), {})[run] = task["n"]
    for (_, base), members in tasks.items():
        numbers = {int(n) for n in members.values()}
        if len(numbers) >= 2 and 0 in numbers and len(numbers) == len(members):
            out.update({run: ranked(base, n) for run, n in members.items()})
    return out
