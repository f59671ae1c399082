"""Causes of the run-level incidents (lossguard.detection.run_kinds), from what the log shows:
how a slowdown looks (sudden and steady, erratic, creeping, brief) says where to look; an
overfitting onset says which checkpoint to keep. Pure, like the spike labeller."""

from __future__ import annotations

import math

import numpy as np

from ..model import Cause, Incident
from .context import RunContext, Series
from .phrases import fmt_number as _fmt
from .run_kinds import SLOWER, train_loss_fell

ERRATIC = 0.25
"""Spread (standard deviation over median) of the slow points above which the pace is erratic:
steps waiting on input now and then, not a machine that got slower."""
CREEP = 1.3
"""How much slower the last third of the slow points is than the first third for a creep."""
BRIEF_POINTS = 20
"""A slowdown that recovered within this many points: a long save or evaluation, not the machine."""


def _slow_points(inc: Incident, series: Series | None) -> np.ndarray:
    if series is None:
        return np.empty(0)
    _, values = series.between(inc.step, inc.end_step - 1 if inc.end_step is not None else math.inf)
    return values[np.isfinite(values)]


def pace_causes(inc: Incident, ctx: RunContext) -> tuple[Cause, ...]:
    """Why a run slowed, ranked. The pace's own shape is the evidence: the log says how slow, from
    when, how steady, whether it came back; which of the machine's parts it was needs the machine."""
    slow = _slow_points(inc, getattr(ctx, inc.metric, None))
    up = SLOWER.get(inc.metric, "up") == "up"
    base = inc.baseline if inc.baseline is not None and inc.baseline > 0 else None
    level = float(np.median(slow)) if slow.size else inc.value
    times = (level / base if up else base / level) if base is not None and level > 0 else None
    pace = f"{inc.metric} {_fmt(level)} against a median of {_fmt(base)} before" if base is not None else f"{inc.metric} {_fmt(level)}"
    said = f"{pace} ({times:.1f}x slower) from step {inc.step}" if times is not None else f"{pace} from step {inc.step}"
    spread = float(np.std(slow) / level) if slow.size >= 3 and level > 0 else 0.0
    third = max(1, slow.size // 3)
    creep = slow.size >= 6 and (float(np.median(slow[-third:])) / float(np.median(slow[:third]))) ** (1 if up else -1) >= CREEP
    causes: list[Cause] = []
    if inc.end_step is not None and slow.size <= BRIEF_POINTS:
        causes.append(Cause(
            "checkpoint_or_evaluation", 0.5, f"{said}, back to the old pace at step {inc.end_step} after {slow.size} points",
            "A stretch of slow steps that ends by itself is what a synchronous checkpoint save to slow storage or an evaluation run "
            "inside the training steps looks like: save asynchronously (torch.distributed.checkpoint.async_save) or less often, "
            "and time evaluation apart from the training steps.",
        ))
    if spread >= ERRATIC:
        causes.append(Cause(
            "data_loader", 0.55, f"{said}; the slow points vary by {spread:.0%} of their median (from {_fmt(float(slow.min()))} to {_fmt(float(slow.max()))})",
            "Erratic steps are GPUs waiting for input: raise the data loader's num_workers and prefetch_factor, use pin_memory and "
            "persistent_workers, and check the storage the data is read from (a remote or shared filesystem, a cold cache); "
            "torch.profiler shows the time spent in the loader.",
        ))
    elif creep:
        causes.append(Cause(
            "throttling", 0.5, f"{said}; it kept getting slower, from {_fmt(float(np.median(slow[:third])))} to {_fmt(float(np.median(slow[-third:])))}",
            "A pace that worsens by degrees is a GPU slowing its clocks (heat, power cap: nvidia-smi -q -d PERFORMANCE lists the throttle "
            "reasons) or memory that grows step after step (host swapping, a leak kept alive across steps: watch torch.cuda.memory_allocated).",
        ))
    else:
        causes.append(Cause(
            "shared_node", 0.5 if inc.end_step is None else 0.4, f"{said}; a step change that held (spread {spread:.0%})",
            "A run that turns slower at once and stays there usually lost part of its machine: another job on the node "
            "(nvidia-smi, squeue -w <node>), a slower link (NCCL falling back to sockets after a restart: NCCL_DEBUG=INFO says), "
            "or another node after a resume. Compare the node's and the job's logs at that step.",
        ))
    return tuple(sorted(causes, key=lambda c: (-c.confidence, c.cause)))


def overfitting_causes(inc: Incident, ctx: RunContext) -> tuple[Cause, ...]:
    """The evaluation loss at its best and since, and the training loss over the same steps."""
    now = inc.last_flagged_step if inc.last_flagged_step is not None else inc.peak_step
    fell = train_loss_fell(ctx.loss, inc.step, now)
    at = ctx.eval_loss.between(inc.step, inc.step)[1] if ctx.eval_loss is not None else np.empty(0)
    lowest = float(at[-1]) if at.size and math.isfinite(at[-1]) else inc.baseline  # (the baseline: a mean of evaluations)
    best = f"eval_loss best {_fmt(lowest)} at step {inc.step}" if lowest is not None else f"eval_loss best at step {inc.step}"
    rise = f" (+{inc.value / lowest - 1:.1%})" if lowest else ""
    evidence = f"{best}, up to {_fmt(inc.value)}{rise} by step {inc.peak_step}"
    if fell is not None:
        evidence += f", while the training loss fell from {_fmt(fell[0])} to {_fmt(fell[1])}"
    return (Cause(
        "overfitting", 0.8, evidence,
        f"Keep the checkpoint from step {inc.step} (the best evaluation); stop there or earlier next time (early stopping on the "
        "evaluation loss: HF EarlyStoppingCallback, Lightning EarlyStopping), and regularise (weight decay, dropout, "
        "fewer epochs) or train on more or augmented data.",
    ),)
