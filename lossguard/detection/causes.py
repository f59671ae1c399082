"""Pure cause labelling: an incident and its run's context in, ranked causes with evidence out.

The heuristics are those an experienced engineer applies when looking at the curves, written down so
they can be judged (docs/rules.md, "Why lossguard says what it says"):

- gradient_explosion: the grad norm peaks far above its median of the previous 50 logged values at,
  or just before, the spike. 3x is suspicious, 10x and more is an explosion.
- numerical_instability: a NaN/Inf in the loss or grad norm; an fp16 loss scale halving repeatedly
  (DeepSpeed OVERFLOW lines); Megatron's skipped/NaN iteration counters rising.
- lr_schedule: the LR moves by far more than the schedule's own step-to-step change right before the
  spike (a scheduler restart, a wrong resume). An upward jump is damning; a drop much less so.
- lr_too_high: the LR is at (>= 90% of) the highest value its schedule reached, warmup ended shortly
  before (within about one warmup length), or the LR was still rising smoothly.
- bad_batch: one or two flagged points that recover at once, with a calm grad norm and no LR event.
- model_architecture: spikes that keep coming back (3 or more on the run) with a grad-norm baseline
  that keeps climbing, or that each take a while to recover (this one included); or a NaN that
  stays for many points. Recurring blips that recover at once on a flat grad norm are not it: a
  detector tuned tight flags dozens on a healthy run, and a NaN in a log's last point says nothing
  about whether it would have stayed.
- unknown: no cause stands out; when the context that would tell causes apart was not logged, says
  which metric and what it would have told.

Confidences are independent plausibilities in [0, 1], not probabilities that sum to one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..model import Cause, Incident
from .context import RunContext, Series
from .lr_causes import exploded_after as _exploded_after, lr_events as _lr_events
from .phrases import fmt_number as _fmt, steps_phrase as _steps_phrase
from .run_causes import overfitting_causes, pace_causes


SLOW_POINTS = 3
"""A spike still above its threshold more than this many points after it began recovered slowly
(recovering "at once", as a bad batch does, is within it)."""
STAYING_POINTS = 10
"""Non-finite points up to the end of the log that make a NaN one that stays: fewer is what a job
killed at its first NaN, or a few overflow steps just before the log ends, look like."""
MISSING = {
    "grad_norm": ("grad norm", "to tell a gradient explosion from a bad batch"),
    "lr": ("learning rate", "to tell an LR too high or an LR-schedule jump from the other causes"),
}
"""What each context metric tells apart, for the label that has to do without it."""


def _missing(inc: Incident, ctx: RunContext, metric: str) -> str | None:
    """What the log lacks of a context metric for this spike, and why it matters; None: logged."""
    series: Series | None = getattr(ctx, metric)
    name, why = MISSING[metric]
    if series is None or not np.isfinite(series.values).any():
        return f"no {name} in this log: log it {why}"
    if not np.isfinite(series.before(max(inc.peak_step, inc.step) + 1, 1 << 62)).any():
        return f"no {name} logged before step {inc.step}: log it from the start {why}"
    return None


def _gradient(inc: Incident, ctx: RunContext, near_lo: float) -> tuple[Cause | None, float | None]:
    gn = ctx.grad_norm
    if gn is None:
        return None, None
    prior = gn.before(near_lo, 50)
    prior = prior[np.isfinite(prior)]
    if prior.size < 3:
        # A short log: the values before the spike step itself are all the history there is.
        prior = gn.before(inc.step, 50)
        prior = prior[np.isfinite(prior)]
    steps, values = gn.between(near_lo, max(inc.peak_step, inc.step))
    finite = np.isfinite(values)
    if prior.size < 2 or not finite.any():
        return None, None
    median = float(np.median(prior))
    if median <= 0:
        return None, None
    k = int(np.argmax(np.where(finite, values, -np.inf)))
    peak, at = float(values[k]), int(steps[k])
    ratio = peak / median
    if ratio < 3:
        return None, ratio
    confidence = min(0.95, 0.45 + 0.15 * math.log2(ratio / 1.5))
    onset = int(steps[np.argmax(np.where(finite, values, -np.inf) >= 3 * median)])
    evidence = f"grad_norm {_fmt(peak)} = {ratio:.0f}x its median over the previous {prior.size} values"
    if inc.metric == "grad_norm":  # the grad-norm spike itself: say whether the loss has followed yet
        followed, said = _loss_after(ctx, inc.step, interval=max(1.0, (inc.step - near_lo) / 3))
        evidence += f" (step {at}); {said}"
        if not followed:
            # A one-step blip of the grad norm that the loss does not follow is common on healthy
            # runs (a batch with a rare token, a clipped step): a line to read, not a rewind.
            return Cause(
                "gradient_explosion", min(confidence, 0.4), evidence,
                "Nothing to undo while the loss holds: a lone grad-norm blip the loss does not follow is common. "
                "If the loss follows, lossguard escalates this alert; if blips recur, clip gradients (max_norm=1.0).",
            ), ratio
    elif onset == at:
        evidence += f", {_steps_phrase(inc.step - at)}"
    else:
        evidence += f" at step {at}; first above 3x {_steps_phrase(inc.step - onset)} (step {onset})"
    suggestion = "Clip gradients (max_norm=1.0; lower it if already clipping) and resume from a checkpoint before step " f"{inc.step}."
    return Cause("gradient_explosion", confidence, evidence, suggestion), ratio


def _loss_after(ctx: RunContext, step: int, *, interval: float) -> tuple[bool, str]:
    """Whether the loss has followed a grad-norm spike (above 1.5x its median before, or not
    finite, within two intervals), and where it stands, said: an explosion usually reaches the loss
    an interval or more later, so "not yet" is the early warning. Unknown (no loss beside it) counts
    as followed: nothing says the spike was harmless."""
    if ctx.loss is None:
        return True, "no loss logged beside it"
    before = ctx.loss.before(step, 20)
    before = before[np.isfinite(before)]
    _, now = ctx.loss.between(step, step + 2 * interval)
    if not before.size or not now.size:
        return True, "the loss around it is not logged"
    median = float(np.median(before))
    if not np.isfinite(now).all():
        return True, f"the loss is already {_fmt(float(now[~np.isfinite(now)][0]))}"
    worst = float(now.max())
    if median > 0 and worst > 1.5 * median:
        return True, f"the loss has followed ({_fmt(worst)}, its median {_fmt(median)})"
    if ctx.loss.steps[-1] > step + 2 * interval:  # (an audit sees past the window: it did not)
        return False, f"the loss did not follow ({_fmt(worst)} at most, its median {_fmt(median)})"
    return False, f"the loss has not followed yet ({_fmt(float(now[-1]))}, its median {_fmt(median)}): it often does within a few intervals"


def _first_nonfinite(series: Series | None, lo: float, hi: float) -> tuple[int, float] | None:
    """The step and value of the series' first value in [lo, hi] that is not finite."""
    if series is None:
        return None
    steps, values = series.between(lo, hi)
    bad = np.flatnonzero(~np.isfinite(values))
    return (int(steps[bad[0]]), float(values[bad[0]])) if bad.size else None


def _numerical(inc: Incident, ctx: RunContext, lo: float, hi: float) -> Cause | None:
    found: list[tuple[float, str]] = []
    if inc.kind == "nonfinite":
        found.append((0.95, f"{inc.metric} is {_fmt(inc.value)} at step {inc.step}"))
    for name, series in (("loss", ctx.loss), ("grad_norm", ctx.grad_norm)):
        if series is None or (inc.kind == "nonfinite" and inc.metric == name):
            continue
        first = _first_nonfinite(series, lo, hi)
        if first is not None:
            found.append((0.85, f"{name} is {_fmt(first[1])} at step {first[0]}"))
    if ctx.loss_scale is not None:
        steps, values = ctx.loss_scale.between(lo, hi)
        before = ctx.loss_scale.before(lo, 1)
        seq = np.concatenate([before, values]) if before.size else values
        seq = seq[np.isfinite(seq)]
        if seq.size >= 2:
            halvings = int(np.sum(np.diff(seq) < 0))
            drop = seq[0] / seq.min() if seq.min() > 0 else math.inf
            if halvings >= 2 or drop >= 4:
                found.append((0.75, f"fp16 loss scale fell {_fmt(seq[0])} -> {_fmt(float(seq.min()))} ({halvings} reductions) around the spike"))
    if ctx.overflow is not None:
        steps, _ = ctx.overflow.between(lo, hi)
        if steps.size:
            found.append((0.6 + min(0.2, 0.04 * steps.size), f"{steps.size} DeepSpeed OVERFLOW (skipped step) line{'s' if steps.size != 1 else ''} between steps {int(steps[0])} and {int(steps[-1])}"))
    for label, series in (("skipped", ctx.skipped), ("NaN", ctx.nan_iterations)):
        if series is None:
            continue
        steps, values = series.between(lo, hi)
        positive = values[np.isfinite(values) & (values > 0)]
        if positive.size:
            found.append((0.6, f"Megatron counted {int(positive.sum())} {label} iteration(s) around the spike"))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    confidence = min(0.97, found[0][0] + 0.05 * (len(found) - 1))
    return Cause(
        "numerical_instability",
        confidence,
        "; ".join(text for _, text in found),
        "Prefer bf16 to fp16 (or keep softmax/attention logits in fp32), check the loss-scaler settings "
        "(initial and minimum scale), and look for log(0) or division by zero in the loss.",
    )


def _climbing_grad_norm(ctx: RunContext) -> tuple[float, float] | None:
    """The grad-norm baseline early and late in the run when it at least doubled, else None."""
    gn = ctx.grad_norm
    if gn is None:
        return None
    values = gn.values[np.isfinite(gn.values)]
    if values.size < 40:
        return None
    # Skip the first tenth (warmup's large norms), compare the next quarter with the last.
    tenth, quarter = values.size // 10, values.size // 4
    early, late = float(np.median(values[tenth : tenth + quarter])), float(np.median(values[-quarter:]))
    return (early, late) if early > 0 and late / early >= 2 else None


def _slow(inc: Incident, ctx: RunContext, interval: float) -> bool:
    """Took more than SLOW_POINTS points to recover, or is still open that long before the log ends."""
    end = inc.end_step
    if end is None:
        series = getattr(ctx, inc.metric, None) if inc.metric in ("loss", "lr", "grad_norm", "loss_scale") else None
        series = series if series is not None else ctx.loss
        end = int(series.steps[-1]) if series is not None and series.steps.size else inc.step
    return end - inc.step > SLOW_POINTS * interval


def _recurrence(inc: Incident, ctx: RunContext, interval: float) -> Cause | None:
    same = [i for i in ctx.incidents if i.metric == inc.metric and i.kind != "nonfinite"]
    notes: list[str] = []
    confidence = 0.0
    if len(same) >= 3 and inc.kind != "nonfinite":
        # Recurrence alone is what a tight detector finds on any noisy run: it points at the model
        # only with a grad norm drifting up under it, or with spikes the model is slow to get over.
        climbing = _climbing_grad_norm(ctx)
        slow = [i for i in same if _slow(i, ctx, interval)]
        slow_ones = len(slow) >= 3 and _slow(inc, ctx, interval)
        if climbing is not None or slow_ones:
            confidence = min(0.7, 0.45 + 0.1 * ((len(same) if climbing is not None else len(slow)) - 3))
            notes.append(f"{len(same)} {inc.metric} spikes on this run (steps {', '.join(str(i.step) for i in same[:6])}{'...' if len(same) > 6 else ''})")
            if slow_ones:
                notes.append(f"{len(slow)} of them took more than {SLOW_POINTS} points to recover")
            if climbing is not None:
                confidence = min(0.9, confidence + 0.2)
                notes.append(f"grad_norm baseline climbing ({_fmt(climbing[0])} -> {_fmt(climbing[1])} median)")
    if inc.kind == "nonfinite" and not inc.over and inc.points >= STAYING_POINTS:
        confidence = max(confidence, 0.7)
        notes.append(f"{inc.metric} stays non-finite for {inc.points} points, from step {inc.step} to the end of the log")
    if not notes:
        return None
    return Cause(
        "model_architecture",
        confidence,
        "; ".join(notes),
        "Check where NaN/Inf first appear and add normalization (pre-LN, QK-layernorm, a z-loss on the logits); "
        "scale down the init of residual projections.",
    )


def _bad_batch(
    inc: Incident, ctx: RunContext, interval: float, gn_ratio: float | None, gn_overflow: tuple[int, float] | None, lr_event: bool,
    numerical: Cause | None,
) -> Cause | None:
    if inc.end_step is None or inc.points > 2:
        return None
    quick = inc.end_step - inc.step <= 3 * interval
    if not quick:
        return None
    if gn_ratio is not None and gn_ratio >= 3:
        return None
    if lr_event:
        return None
    recovered = f"back under the threshold {int((inc.end_step - inc.step) / interval) or 1} point(s) later"
    if gn_overflow is not None:
        # An Inf or NaN grad norm measures nothing: "only 1.0x its median" of the finite ones
        # would read as a calm gradient at the very step it overflowed.
        confidence = 0.4
        calm = f"grad_norm {_fmt(gn_overflow[1])} at step {gn_overflow[0]} (an overflow, or a batch that made one: the grad norm cannot tell)"
    elif gn_ratio is None:
        confidence = 0.45
        calm = _missing(inc, ctx, "grad_norm") or "too few grad norm values before the spike to rule out an explosion"
    else:
        confidence, calm = 0.7, f"grad_norm only {gn_ratio:.1f}x its median"
    # Without an LR there is no LR event to see, which is not the same as none.
    lr_note = "no LR event" if _missing(inc, ctx, "lr") is None else "no learning rate logged to rule out an LR event"
    notes = []
    if len([i for i in ctx.incidents if i.metric == inc.metric and i.kind != "nonfinite"]) >= 3:
        confidence -= 0.2
        notes.append("but spikes recur on this run")
    if numerical is not None and numerical.confidence >= 0.6:
        # A bad batch can produce a NaN, but the numerics are then the better lead.
        confidence = min(confidence, 0.4)
    return Cause(
        "bad_batch",
        max(0.1, confidence),
        "; ".join([f"isolated spike at step {inc.step}, {recovered}", calm, lr_note, *notes]),
        f"Inspect the batch(es) of step {inc.step} (data order is deterministic) and skip them on resume; gradient clipping limits the damage.",
    )


SHIFT_POINTS = 30
"""Points after a spike's start that must all hold its level for it to be called a level shift:
three windows of the default rule, more than a spike that is merely slow to recover lasts."""


def _level_shift(inc: Incident, ctx: RunContext) -> str | None:
    """What a loss that stepped up and stayed there looks like (its every point since the spike
    began above the spike's threshold, for SHIFT_POINTS points or more): a rule judging a window of
    the last points stops flagging it once the window holds the new level, which reads as "recovered"
    but is not; None for a spike that came back down."""
    if inc.metric != "loss" or ctx.loss is None or inc.end_step is not None or inc.threshold is None or inc.baseline is None:
        return None  # (the context holds the training loss only: another metric's points are not in it)
    if not math.isfinite(inc.threshold) or inc.baseline <= 0:
        return None
    _, after = ctx.loss.between(inc.step, math.inf)
    after = after[np.isfinite(after)]
    if after.size < SHIFT_POINTS or not (after > inc.threshold).all():
        return None
    level = float(np.median(after))
    return (f"the loss stepped up {level / inc.baseline:.1f}x at step {inc.step} and has stayed there ({after.size - 1} points since, "
            f"median {_fmt(level)} against {_fmt(inc.baseline)} before): a level shift so far, not a spike")


RUN_LABELS = {"throughput": pace_causes, "overfitting": overfitting_causes}
"""Kinds about the run's course rather than a spike, each with its own labeller."""


def _climb(inc: Incident) -> str | None:
    """What a divergence looks like, in words: a loss that kept rising, each point never far above
    the ones before it (no step up to name, as a level shift has). None for another incident."""
    if inc.trouble != "divergence" or inc.baseline is None or inc.baseline <= 0 or not math.isfinite(inc.value):
        return None
    return (f"the loss kept rising (clear from step {inc.step}): {_fmt(inc.value)} at step {inc.peak_step} against its recent minimum "
            f"{_fmt(inc.baseline)} ({inc.value / inc.baseline:.1f}x), never far above the points just before it")


def label(inc: Incident, ctx: RunContext) -> tuple[Cause, ...]:
    if inc.kind in RUN_LABELS:
        return RUN_LABELS[inc.kind](inc, ctx)
    interval = ctx.interval
    near_lo = inc.step - 3 * interval
    hi = max(inc.peak_step, inc.step) + interval
    causes: list[Cause] = []
    grad, gn_ratio = _gradient(inc, ctx, near_lo)
    numerical = _numerical(inc, ctx, inc.step - 10 * interval, hi)
    high, schedule, jump_at = _lr_events(inc, ctx, interval)
    if schedule is not None and grad is not None and jump_at is not None and schedule.confidence >= 0.8 and _exploded_after(ctx, jump_at, hi):
        # The LR jump came first and the gradient blew up after it: the jump is what to fix, the
        # explosion what it did.
        schedule = replace(schedule, confidence=min(0.97, max(schedule.confidence, grad.confidence + 0.02)),
                           evidence=f"{schedule.evidence}; the grad norm exploded after it")
    recurrence = _recurrence(inc, ctx, interval)
    gn_overflow = _first_nonfinite(ctx.grad_norm, near_lo, max(inc.peak_step, inc.step))  # (the window _gradient judges)
    batch = _bad_batch(inc, ctx, interval, gn_ratio, gn_overflow, schedule is not None and schedule.confidence >= 0.5, numerical)
    causes = [c for c in (grad, numerical, high, schedule, recurrence, batch) if c is not None]
    missing = {name: why for name in MISSING if (why := _missing(inc, ctx, name)) is not None}
    top = max((c.confidence for c in causes), default=0.0)
    if missing and top < 0.6:
        causes.append(
            Cause(
                "unknown",
                0.5 if top < 0.4 else 0.3,
                "; ".join(missing.values()),
                f"Log {' and '.join(missing)} (HF Trainer logs both; Lightning: LearningRateMonitor and a grad-norm callback) so the next spike can be diagnosed.",
            )
        )
    elif top < 0.4:
        climb = _climb(inc)
        shift = climb or _level_shift(inc, ctx)
        if climb:
            advice = (f"A loss climbing on calm optimiser signals is most often an LR too high for this stage of training: resume from a "
                      f"checkpoint before step {inc.step} with a lower LR, and look for a change of data there (a new shard or mixture).")
        elif shift:
            advice = (f"A level shift on calm optimiser signals points at what is fed or loaded: look for a change of data at step {inc.step} "
                      "(a new shard or mixture, a tokenizer or preprocessing change, a resume that loaded other weights or restarted the data loader).")
        else:
            advice = f"Look at the data and the job's other logs (restarts, node failures) around step {inc.step}."
        causes.append(
            Cause(
                "unknown",
                0.35,
                f"{shift}, with no sign of it in lr, grad_norm or loss scale" if shift else "no clear signal in lr, grad_norm or loss scale around the spike",
                advice,
            )
        )
    return tuple(sorted(causes, key=lambda c: (-c.confidence, c.cause)))


def label_all(incidents: Sequence[Incident], ctx: RunContext) -> list[Incident]:
    return [inc.with_causes(label(inc, ctx)) for inc in incidents]
