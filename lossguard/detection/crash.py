"""Crash findings: the error that ended a run, read off the end of the text it wrote (its console
log, a log beside its metrics, `slurm-<job>.out`, torchrun's per-rank `stdout.log`/`stderr.log`).

At 3 a.m. a run is far more often dead than spiky, and its metrics alone cannot say so: a run that
died of CUDA OOM just stops. Pure: the last lines of each log (`Tail`), the run's last step and
the `crash` rules in, at most one finding out; the files are read by ingest.sources.texttail.

What counts as "ended": an error line after the last line that reports training progress (a loss,
a step, an iteration, an epoch with a number). An error line is never progress, whatever numbers it
carries (`[step 1200] torch.OutOfMemoryError: ...`, slurmstepd's `*** STEP 4242.0 ... CANCELLED`). A traceback the run lived through has progress after
it; an OOM a framework skipped says so (fairseq's `ran out of memory, skipping batch`, `attempting
to recover from OOM`); a run that finished cleanly says that (HF's `Training completed`, Lightning's
`Trainer.fit` stopped). The first rule (in the rules' order) that matches any log's ending names the
crash: the defaults list the root causes (OOM) before what follows from them (an NCCL timeout on the
other ranks, torchrun's ChildFailedError, a bare traceback).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase

from ..ingest.sources.texttail import Tail
from ..model import Incident, split_rank
from ..validate import spec
from .crash_advice import ADVICE, causes_for
from .kinds import SEVERITIES

MAX_KEPT = 6
"""Lines a finding keeps of the log (the error and what names where it happened)."""
MAX_KEPT_CHARS = 300
"""Each kept line is cut to this many characters: an OOM message is ~500, a line can be megabytes."""
MAX_MATCHED_CHARS = 4000
"""Patterns see at most this much of a line (a user's regex over a megabyte line costs seconds)."""

PROGRESS = re.compile(r"\b(?:loss|step|iter|iteration|epoch)\b['\"]?\s*[:=]?\s*[-+]?(?:\d|nan\b|inf\b)", re.IGNORECASE)
"""A line reporting training progress (`{'loss': 2.1, ...}`, `| epoch 001 | loss 5.2`, Megatron's
`iteration 100/...`, tqdm's `loss=2.3`). Indented lines are never progress: a traceback's frames
and source lines (`    loss = 0.5 * x`) are indented."""
FINISHED = re.compile(
    r"Training completed\. Do not forget|`Trainer\.fit` stopped: `max_(?:steps|epochs)=\d+` reached"
    r"|\bexit(?:ed with)? ?code:? 0\b|\bexitcode *: *0\b",
)
"""A clean finish: transformers' trainer.py (`Training completed. Do not forget to share your model
on huggingface.co/models =)`), Lightning's fit_loop.py (`` `Trainer.fit` stopped: `max_steps=1000`
reached. ``), a launcher's exit code 0."""
SURVIVED = re.compile(r"ran out of memory.{0,40}skipping batch|attempting to recover from OOM|Skipping batch", re.IGNORECASE)
"""An OOM a framework caught and skipped (fairseq/trainer.py; many scripts copy its wording)."""
TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
EXCEPTION = re.compile(r"^(?:\[[^\]]*\]:?\s*)?(?P<name>[A-Za-z_][\w.]*)(?::|$)")
"""The exception line that closes a traceback (`torch.OutOfMemoryError: CUDA out of ...`), after an
optional `[rank0]:` prefix torchrun's `--tee` adds."""
ERROR = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b:|^Traceback \(most recent call last\):")
"""A line that names an exception (`RuntimeError: ...`, `[step 5] KeyError: 'x'`) besides those
a crash rule names: an error, never progress, whatever step it carries."""
ROOT_CAUSE = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?(?:host|rank|exitcode|error_file)\s*:\s*\S")
"""The fields of torchrun's ChildFailedError table (torch/distributed/elastic/multiprocessing/
errors/__init__.py) that say where a worker failed."""
FAILED_AT = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?(?P<field>host|rank)\s*:\s*(?P<value>[^\s(]+)")
"""The table's `host : node-3` and `rank : 9 (local_rank: 1)` (the global rank)."""


WORKER_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*\d+\]: ?)+")
"""What torch puts before a worker's lines: torchrun's `--tee` `[default1]:` (its role and local
rank, torch/distributed/elastic/multiprocessing/subprocess_handler and tail_log.py) and the
`[rank1]: ` torch.distributed's excepthook writes before an uncaught exception's lines
(distributed_c10d.py, `excepthook_prefix`); often both, `[default1]:[rank1]: Traceback ...`.
Taken off before the rules read a line: a traceback is one whatever the launcher wrapped it in."""


@dataclass(frozen=True, kw_only=True)
class CrashRule:
    """An error that ends a run: its name and the regexes (Python `re`, searched in each line of a
    log's ending) of the lines that say it.

        [[rule]]
        name = "cuda-oom"
        kind = "crash"
        error = "CUDA out of memory"
        patterns = ["CUDA out of memory", "torch\\\\.(?:cuda\\\\.)?OutOfMemoryError"]
        advice = "gpu-memory"   # which causes and suggestions the finding carries

    `error` may hold `{exception}`: the type the traceback's last line names (`uncaught {exception}`
    says `uncaught KeyError`)."""

    name: str = field(metadata=spec(str, min_length=1))
    error: str = field(metadata=spec(str, min_length=1))
    patterns: tuple[str, ...] = field(metadata=spec(list))
    advice: str = field(default="exception", metadata=spec(tuple(ADVICE)))
    severity: str = field(default="critical", metadata=spec(SEVERITIES))
    runs: str = field(default="*", metadata=spec(str))
    kind: str = "crash"
    metric: str = field(default="loss", init=False)
    """The stream whose last step a finding names (what silences and alerts key a rule by)."""

    def _check(self) -> str | None:
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                return f"patterns: {pattern!r} is no regular expression ({exc})"
        return None

    def applies_to(self, run: str) -> bool:
        """(A rank's stream is judged by its run's rules: a rules file names runs, not ranks.)"""
        return fnmatchcase(split_rank(run)[0], self.runs)

    def matches(self, line: str) -> bool:
        return any(re.search(p, line[:MAX_MATCHED_CHARS]) for p in self.patterns)


@dataclass(frozen=True)
class TailSays:
    """What a log's last lines say of how its run stopped (for the `stalled` notice)."""

    finished: bool
    """The output ends in a clean finish."""
    last_line: str | None
    """The last line with any text, cut short; None: the log ends in nothing."""


def _progress(line: str, rules: Sequence[CrashRule]) -> bool:
    """A line reporting progress and saying no error: a logger's prefix (`[step 1200] `) or a job's
    step id (`*** STEP 4242.0 ON ...`) on an error line must not hide the error behind it."""
    head = line[:MAX_MATCHED_CHARS]
    if not line or line[0].isspace() or PROGRESS.search(head) is None:
        return False
    return ERROR.search(head) is None and not any(rule.matches(line) for rule in rules)


def ending_lines(lines: Sequence[str], rules: Sequence[CrashRule]) -> Sequence[str]:
    """The lines after the last one that reports progress: what the run wrote once it stopped moving.
    `rules`: the crash rules, whose lines are errors, never progress."""
    for k in range(len(lines) - 1, -1, -1):
        if _progress(lines[k], rules):
            return lines[k + 1:]
    return lines


def tail_says(lines: Sequence[str]) -> TailSays:
    """A clean finish anywhere in the tail counts (transformers logs its summary of the run, a
    progress line, after `Training completed`), unless a traceback follows it."""
    last = next((line.strip() for line in reversed(lines) if line.strip()), None)
    finish = next((k for k in range(len(lines) - 1, -1, -1) if FINISHED.search(lines[k][:MAX_MATCHED_CHARS])), None)
    finished = finish is not None and not any(TRACEBACK.match(line) for line in lines[finish:])
    return TailSays(finished, None if last is None else _cut(last))


def _cut(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= MAX_KEPT_CHARS else line[: MAX_KEPT_CHARS - 3] + "..."


def _exception_after(ending: Sequence[str], at: int) -> int | None:
    """The line closing the traceback that begins at `at` (its first unindented line after the
    frames), or None while the traceback is still being written."""
    for k in range(at + 1, len(ending)):
        line = ending[k]
        if line.strip() and not line[0].isspace():
            return k if EXCEPTION.match(line) and not TRACEBACK.match(line) else None
    return None


@dataclass(frozen=True)
class _Match:
    rule: CrashRule
    log: Tail
    lines: tuple[str, ...]
    at: int
    exception: str | None


def _match(rule: CrashRule, log: Tail, ending: Sequence[str]) -> _Match | None:
    if any(FINISHED.search(line[:MAX_MATCHED_CHARS]) for line in ending):
        return None
    for k, line in enumerate(ending):
        if not rule.matches(line) or any(SURVIVED.search(later[:MAX_MATCHED_CHARS]) for later in ending[k:]):
            continue
        last = next((j for j in range(len(ending) - 1, -1, -1) if TRACEBACK.match(ending[j])), None)
        closing = _exception_after(ending, last) if last is not None else None
        if TRACEBACK.match(line) and closing is None:
            continue  # a traceback not yet closed by its exception line: not an error yet
        exception = EXCEPTION.match(ending[closing])["name"] if closing is not None else None
        return _Match(rule, log, tuple(ending), k, exception)
    return None


def _kept(found: _Match) -> tuple[str, ...]:
    """The lines that say the error: the matched one (or a traceback's exception line and the frame
    above it), then where torchrun says the worker failed."""
    lines = found.lines
    at = found.at
    if TRACEBACK.match(lines[at]):
        closing = _exception_after(lines, max(k for k in range(len(lines)) if TRACEBACK.match(lines[k])))
        assert closing is not None
        frames = [k for k in range(closing) if lines[k].lstrip().startswith("File ")]
        picked = [frames[-1], closing] if frames else [closing]
    else:
        picked = [at]
    picked += [k for k in range(len(lines)) if ROOT_CAUSE.match(lines[k]) and k not in picked]
    return tuple(_cut(lines[k]) for k in sorted(set(picked))[:MAX_KEPT])


@dataclass(frozen=True)
class Crash:
    incident: Incident
    source: str
    """The log whose ending says it."""
    failed_at: float | None = None
    """When torch recorded the failure (Tail.failed_at): of several ranks' crashes, the first is the cause."""


def find_crash(logs: Sequence[Tail], rules: Sequence[CrashRule], *, run: str, last_step: int | None) -> Crash | None:
    """The error that ended the run, if one of its logs ends in one; `last_step`: the last step the
    run reached (None: it logged none)."""
    # The log of the first failure torch recorded goes first (its error files' times: the table's
    # `Root Cause` is chosen so, errors/__init__.py): the others' errors followed from it.
    logs = sorted((_unwrapped(log) for log in logs), key=lambda log: math.inf if log.failed_at is None else log.failed_at)
    endings = [ending_lines(log.lines, rules) for log in logs]
    for rule in rules:
        if not rule.applies_to(run):
            continue
        for log, ending in zip(logs, endings):
            found = _match(rule, log, ending)
            if found is not None:
                return Crash(_finding(found, run=run, last_step=last_step), log.source, log.failed_at)
    return None


def _unwrapped(log: Tail) -> Tail:
    """The log with torch's worker prefixes (WORKER_PREFIX) taken off its lines."""
    if not any(line.startswith("[") for line in log.lines):
        return log
    return replace(log, lines=tuple(WORKER_PREFIX.sub("", line) for line in log.lines))


def _finding(found: _Match, *, run: str, last_step: int | None) -> Incident:
    rule, kept = found.rule, _kept(found)
    error = rule.error.replace("{exception}", found.exception or "exception")
    table = failed_at(found.log.lines)
    rank = found.log.rank or table.get("rank")
    if rank is not None:
        error += f" on rank {rank}"
    if "host" in table:
        error += f" ({table['host']})"
    if last_step is None:
        error += ", before any step was logged"
    where = found.log.source
    step = last_step if last_step is not None else 0
    causes = causes_for(rule.advice, found.log.lines, where=where, reached="before logging any step" if last_step is None else f"at step {step}")
    return Incident(
        run=run, metric=rule.metric, rule=rule.name, kind=rule.kind, severity=rule.severity, step=step, peak_step=step,
        value=math.nan, baseline=None, threshold=None, causes=causes, error=error, lines=kept,
        ranks=(rank,) if rank is not None and table.get("rank") == rank else (), host=table.get("host"),
    )


def failed_at(lines: Sequence[str]) -> dict[str, str]:
    """The rank and host torchrun's ChildFailedError table gives its root cause (the first failure
    it observed; the `Failures:` above it are others), where the lines hold one."""
    start = next((k for k in range(len(lines) - 1, -1, -1) if "Root Cause" in lines[k]), None)
    out: dict[str, str] = {}
    if start is None:
        return out
    for line in lines[start:]:
        match = FAILED_AT.match(line)
        if match and match["field"] not in out and match["value"].isprintable():
            out[match["field"]] = match["value"]
        if len(out) == 2:
            break
    return out
