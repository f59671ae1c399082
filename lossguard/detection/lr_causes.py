"""The learning rate's part in a spike: a discontinuity before it (lr_schedule), an LR at its
schedule's peak (lr_too_high), and whether a grad-norm explosion came only after an LR jump. Pure,
as the rest of the labelling (causes.py)."""

from __future__ import annotations

import math
import numpy as np

from ..model import Cause, Incident
from .context import RunContext
from .phrases import fmt_number as _fmt, steps_phrase as _steps_phrase


LR_EVENT_POINTS = 10
"""Logged LR intervals before a spike in which an LR discontinuity is taken for its cause: a loss
answers a jump within a few optimizer steps, and where the LR is logged every step those steps are
as many logged points. The schedule's usual change is measured before that window, so the jump
never counts as the schedule's own movement however far back it came."""


def _lr_jump(inc: Incident, steps: np.ndarray, values: np.ndarray, interval: float) -> tuple[Cause | None, int | None]:
    """The LR-schedule cause: the largest discontinuity in the LR logged in the LR_EVENT_POINTS
    intervals up to the spike, an upward one preferred (a drop rarely starts a spike), against the
    schedule's usual step-to-step change before them; None when the LR moved as it usually does."""
    lo = inc.step - max(LR_EVENT_POINTS * interval, 1)
    first = int(np.searchsorted(steps, lo, "left"))  # values[first:] are in the window
    diffs = np.diff(values)
    before = np.abs(diffs[max(0, first - 61) : max(0, first - 1)])
    moving = before[before > 0]
    typical = float(np.median(moving)) if moving.size else 0.0
    best: tuple[bool, float, int] | None = None  # (upward, relative size, index of the diff)
    for j in range(max(0, first - 1), diffs.size):
        prev, jump = float(values[j]), float(diffs[j])
        # Against the schedule's usual change, and against the changes just before it: a warmup's
        # steps are large beside an LR near 0, but each is as large as the one before.
        local = float(np.median(np.abs(diffs[max(0, j - 5) : j]))) if j else 0.0
        if jump == 0 or abs(jump) < max(10 * typical, 10 * local, 0.2 * abs(prev)):
            continue
        key = (jump > 0, abs(jump) / abs(prev) if prev else math.inf, j)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return None, None
    j = best[2]
    prev, cur, at = float(values[j]), float(values[j + 1]), steps[j + 1]
    up = cur > prev
    return Cause(
        "lr_schedule",
        0.8 if up else 0.35,
        f"lr {'jumped' if up else 'dropped'} {_fmt(prev)} -> {_fmt(cur)} at step {int(at)}, "
        f"{_steps_phrase(inc.step - at).replace('the loss spike', 'the spike')}; the schedule's usual step-to-step change is {_fmt(typical)}",
        "Check the LR scheduler: a jump like this usually means it restarted or was not restored on resume; "
        "restore its state (or set the intended LR) and resume from a checkpoint before the jump.",
    ), int(at)


def lr_events(inc: Incident, ctx: RunContext, interval: float) -> tuple[Cause | None, Cause | None, int | None]:
    """(lr_too_high, lr_schedule, the step of the LR jump the schedule cause names)."""
    lr = ctx.lr
    if lr is None or lr.steps.size < 3:
        return None, None, None
    # Up to the peak: a spike flagged a few points early (the noise of a small model's loss just
    # over the threshold) may run into the LR jump that made it.
    upto = lr.steps <= max(inc.step, inc.peak_step)
    if not upto.any():
        return None, None, None
    steps, values = lr.steps[upto], lr.values[upto]
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if steps.size < 2:
        return None, None, None
    schedule, jump_at = _lr_jump(inc, steps, values, interval)
    # The schedule's peak as far as the log shows it (the whole run in an audit, so far in the daemon).
    all_values = lr.values[np.isfinite(lr.values)]
    all_steps = lr.steps[np.isfinite(lr.values)]
    peak = float(all_values.max())
    current = float(values[-1])
    if peak <= 0:
        return None, schedule, jump_at
    frac = current / peak
    high: Cause | None = None
    reached = int(all_steps[np.argmax(all_values >= 0.99 * peak)])
    first_step, start = int(all_steps[0]), float(all_values[0])
    warmup = start < 0.5 * peak and reached > first_step
    warm_len = reached - first_step
    since = inc.step - reached
    rising = values.size >= 2 and values[-1] > values[-2]
    if schedule is None and warmup and since < 0 and rising and frac >= 0.5:
        confidence, when = 0.5, f"still warming up toward {_fmt(peak)} (reached at step {reached})"
    elif schedule is None and frac >= 0.9 and since >= 0:
        if warmup and since <= max(warm_len, 3 * interval):
            confidence, when = 0.75, f"warmup ended {since} steps earlier (at step {reached})"
        elif warmup and since <= 3 * warm_len:
            confidence, when = 0.55, f"warmup ended {since} steps earlier (at step {reached})"
        elif warmup:
            confidence, when = 0.3, f"the LR has been near its peak since step {reached}"
        else:
            confidence, when = 0.3, "no warmup visible in the log"
    else:
        return None, schedule, jump_at
    high = Cause(
        "lr_too_high",
        confidence,
        f"lr {_fmt(current)} = {frac:.0%} of its max {_fmt(peak)}, {when}",
        f"Lower the peak LR (e.g. to {_fmt(peak / 2)}) or lengthen warmup, and resume from a checkpoint before step {inc.step}.",
    )
    return high, schedule, jump_at


def exploded_after(ctx: RunContext, jump_at: int, hi: float) -> bool:
    """Whether the grad norm first rose past 3x its median before the LR jump at or after it (not
    already exploding when the LR moved)."""
    gn = ctx.grad_norm
    if gn is None:
        return False
    prior = gn.before(jump_at, 50)
    prior = prior[np.isfinite(prior)]
    if prior.size < 2 or float(np.median(prior)) <= 0:
        return False
    median = float(np.median(prior))
    _, after = gn.between(jump_at, hi)
    after = after[np.isfinite(after)]
    return bool(after.size) and float(after.max()) >= 3 * median and bool((prior[-3:] < 3 * median).all())
