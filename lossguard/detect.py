"""Pure detection: a metric stream and a rule in, incidents out. No clock, no I/O, so `scan` and
`watch` can never disagree about the same points.

Every rule is judged with vectorised polars expressions over the whole stream (rolling windows per
evaluation unit, see streams.segments_with_history); only the few flagged points are walked in Python
to group them into incidents and find where each recovered.

Statistical rules (ratio, zscore, ewm, sustained) see only finite values: a NaN neither enters a
window nor resets it, and the `nonfinite` rule is what catches it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import polars as pl

from .model import Incident
from .rules import EwmRule, NonFiniteRule, RatioRule, Rule, SustainedRule, ThresholdRule, ZScoreRule
from .streams import segments_with_history, single_valued

_STATISTICAL = (RatioRule, ZScoreRule, EwmRule, SustainedRule)


def _judge(units: pl.DataFrame, rule: Rule, *, seen_before: int = 0) -> tuple[pl.DataFrame, int]:
    """The flagged points only: their row index `i` in `units`, the `baseline` each was compared
    with and the `limit` it exceeded; and how many points back the condition began (`onset`).
    Only flagged rows are materialised: on a healthy stream that is none of millions."""
    v = pl.col("value")
    single = single_valued(units.get_column("unit"))
    if isinstance(rule, NonFiniteRule) and single and rule.patience == 1:
        # The common guard: just the non-finite points (numpy finds them in milliseconds).
        values = units.get_column("value").to_numpy()
        judge = units.get_column("judge").to_numpy()
        index = np.flatnonzero(~np.isfinite(values) & judge)
        index = index[index + 1 + seen_before >= rule.history]
        empty = pl.Series([None] * index.size, dtype=pl.Float64)
        return pl.DataFrame({"i": index.astype(np.int64), "baseline": empty, "limit": empty}), 0

    def per_unit(e: pl.Expr, *extra: str) -> pl.Expr:
        # Window expressions cost a group-by; a stream that never rewound needs none.
        if single and not extra:
            return e
        return e.over(["unit", *extra])

    seen = per_unit(pl.int_range(1, pl.len() + 1)) + seen_before
    onset = 0
    if isinstance(rule, RatioRule):
        window = {"mean": v.rolling_mean, "median": v.rolling_median, "max": v.rolling_max}[rule.baseline]
        baseline = per_unit(window(rule.window, min_samples=rule.window).shift(1))
        limit = baseline * rule.factor
        cond = v > limit
    elif isinstance(rule, ZScoreRule):
        baseline = per_unit(v.rolling_mean(rule.window, min_samples=rule.window).shift(1))
        spread = per_unit(v.rolling_std(rule.window, min_samples=rule.window).shift(1))
        limit = baseline + rule.k * spread
        cond = v > limit
    elif isinstance(rule, EwmRule):
        baseline = per_unit(v.ewm_mean(alpha=rule.alpha, adjust=False).shift(1))
        limit = baseline * rule.factor
        cond = v > limit
    elif isinstance(rule, SustainedRule):
        baseline = per_unit(v.rolling_mean(rule.window, min_samples=rule.window).shift(rule.patience))
        limit = baseline * rule.factor
        cond = per_unit(v.rolling_min(rule.patience, min_samples=rule.patience)) > limit
        onset = rule.patience - 1
    elif isinstance(rule, (ThresholdRule, NonFiniteRule)):
        if isinstance(rule, NonFiniteRule):
            raw = ~v.is_finite()
            baseline = pl.lit(None, dtype=pl.Float64)
            limit = pl.lit(None, dtype=pl.Float64)
        else:
            bound = rule.above if rule.above is not None else rule.below
            raw = (v > rule.above) if rule.above is not None else (v < rule.below)
            baseline = pl.lit(bound, dtype=pl.Float64)
            limit = pl.lit(bound, dtype=pl.Float64)
        # Length of the run of consecutive raw points ending here: index minus the last clean index.
        index = per_unit(pl.int_range(0, pl.len()))
        last_clean = per_unit(pl.when(~raw).then(index).otherwise(None).forward_fill()).fill_null(-1)
        streak = index - last_clean
        cond = raw & (streak >= rule.patience)
        onset = rule.patience - 1
    else:  # pragma: no cover - the rule union is closed
        raise TypeError(rule)
    flag = cond.fill_null(False) & (seen >= rule.history)
    if not single or not units.get_column("judge").all():
        flag = flag & pl.col("judge")
    flagged = (
        units.lazy()
        .with_row_index("i")
        .with_columns(flag.alias("__flag"), baseline.alias("baseline"), limit.alias("limit"))
        .filter(pl.col("__flag"))
        .select(pl.col("i").cast(pl.Int64), "baseline", "limit")
        .collect()
    )
    return flagged, onset


def _recovery(values: np.ndarray, start: int, stop: int, above: callable, need: int) -> int | None:
    """Index of the first of `need` consecutive points in [start, stop) that are not `above`."""
    run = 0
    chunk = 64
    i = start
    while i < stop:
        block = ~above(values[i : min(stop, i + chunk)])
        for j, ok in enumerate(block):
            run = run + 1 if ok else 0
            if run == need:
                return i + j - need + 1
        i += chunk
        chunk *= 2
    return None


def find_incidents(points: pl.DataFrame, rule: Rule, *, run: str, seen_before: int = 0) -> list[Incident]:
    """Incidents of one rule on one stream (columns step, value, segment; file order).
    `seen_before`: points the stream held before these (the daemon passes a tail), for min_history."""
    all_finite = bool(np.isfinite(points.get_column("value").to_numpy()).all())
    if isinstance(rule, _STATISTICAL):
        if not all_finite:
            points = points.filter(pl.col("value").is_finite())
    elif isinstance(rule, NonFiniteRule) and all_finite:
        return []
    units = segments_with_history(points, rule.lookback)
    if not units.height:
        return []
    flagged, onset = _judge(units, rule, seen_before=seen_before)
    if not flagged.height:
        return []
    incidents: list[Incident] = []
    seen_keys: set[int] = set()
    unit_of = units.get_column("unit")
    if single_valued(unit_of):
        parts = [(int(unit_of[0]), units, flagged)]
    else:
        starts = units.with_row_index("i").group_by("unit", maintain_order=True).agg(pl.col("i").min().alias("start"), pl.len().alias("n"))
        parts = []
        for unit, start, n in starts.iter_rows():
            mine = flagged.filter((pl.col("i") >= start) & (pl.col("i") < start + n)).with_columns(pl.col("i") - start)
            if mine.height:
                parts.append((unit, units.slice(start, n), mine))
    for unit, part, mine in parts:
        found = _incidents(part, mine, onset, rule, run=run, segment=int(unit))
        for inc in found:
            # A replay after a resume must not raise the incident of the original timeline again.
            if inc.step in seen_keys:
                continue
            seen_keys.add(inc.step)
            incidents.append(inc)
    return _apply_cooldown(incidents, rule)


def _incidents(part: pl.DataFrame, flagged: pl.DataFrame, onset: int, rule: Rule, *, run: str, segment: int) -> list[Incident]:
    idx = flagged.get_column("i").to_numpy()
    if not idx.size:
        return []
    steps = part.get_column("step").to_numpy()
    values = part.get_column("value").to_numpy()
    baselines = dict(zip(idx.tolist(), flagged.get_column("baseline").to_list()))
    limits = dict(zip(idx.tolist(), flagged.get_column("limit").to_list()))
    n = len(values)
    out: list[Incident] = []
    covered_until = -1  # index up to which the current incident has not recovered
    for f in idx.tolist():
        if f < covered_until:
            out[-1] = _extend(out[-1], f, steps, values)
            continue
        first = max(0, f - onset)
        limit = limits[f]
        above = _above(rule, limit)
        end = _recovery(values, f + 1, n, above, rule.recovery)
        span_end = end if end is not None else n
        window = values[first:span_end]
        if isinstance(rule, NonFiniteRule):
            peak = first + int(np.flatnonzero(~np.isfinite(window))[0])
        else:
            finite = np.where(np.isfinite(window), window, -np.inf)
            peak = first + int(np.argmax(finite))
        base = baselines[f]
        out.append(
            Incident(
                run=run,
                metric=rule.metric,
                rule=rule.name,
                kind=rule.kind,
                severity=rule.severity,
                step=int(steps[first]),
                peak_step=int(steps[peak]),
                value=float(values[peak]),
                baseline=None if base is None or math.isnan(base) else float(base),
                threshold=None if limit is None or math.isnan(limit) else float(limit),
                end_step=None if end is None else int(steps[end]),
                last_flagged_step=int(steps[f]),
                points=1,
                segment=segment,
            )
        )
        covered_until = span_end
    return out


def _above(rule: Rule, limit: float | None):
    if isinstance(rule, NonFiniteRule):
        return lambda a: ~np.isfinite(a)
    if isinstance(rule, ThresholdRule) and rule.below is not None:
        return lambda a: a < rule.below
    return lambda a: a > limit


def _extend(inc: Incident, f: int, steps: np.ndarray, values: np.ndarray) -> Incident:
    return replace(inc, last_flagged_step=int(steps[f]), points=inc.points + 1)


def _apply_cooldown(incidents: list[Incident], rule: Rule) -> list[Incident]:
    """Within `cooldown` steps after an incident, the rule opens no new one: it is folded into the
    previous incident instead (its points count, nothing is lost)."""
    if rule.cooldown <= 0 or len(incidents) < 2:
        return incidents

    merged = [incidents[0]]
    for inc in incidents[1:]:
        prev = merged[-1]
        last = prev.last_flagged_step if prev.last_flagged_step is not None else prev.step
        if inc.segment == prev.segment and inc.step - last <= rule.cooldown:
            better = inc.value > prev.value if math.isfinite(inc.value) and math.isfinite(prev.value) else False
            merged[-1] = replace(
                prev,
                last_flagged_step=inc.last_flagged_step,
                points=prev.points + inc.points,
                end_step=inc.end_step,
                peak_step=inc.peak_step if better else prev.peak_step,
                value=inc.value if better else prev.value,
            )
        else:
            merged.append(inc)
    return merged


def detect_tail(history: pl.DataFrame, new: pl.DataFrame, rule: Rule, *, run: str, seen_before: int = 0) -> list[Incident]:
    """Incidents among `new` points only, judged with `history`, the points of the stream just before
    them (the daemon keeps rule.lookback of them). Costs time in the new points, not the stream's
    length. `seen_before`: points the stream held before `history`, for min_history."""
    if isinstance(rule, _STATISTICAL):
        history = history.filter(pl.col("value").is_finite())
        new = new.filter(pl.col("value").is_finite())
    history = history.tail(rule.lookback) if rule.lookback else history.head(0)
    units = pl.concat(
        [
            history.select("step", "value").with_columns(pl.lit(False).alias("judge")),
            new.select("step", "value").with_columns(pl.lit(True).alias("judge")),
        ]
    ).with_columns(pl.lit(0, dtype=pl.Int64).alias("unit"))
    flagged, onset = _judge(units, rule, seen_before=seen_before)
    if not flagged.height:
        return []
    return _incidents(units, flagged, onset, rule, run=run, segment=0)


def detect_all(streams: dict[str, pl.DataFrame], rules: Sequence[Rule], *, run: str) -> list[Incident]:
    out: list[Incident] = []
    for rule in rules:
        points = streams.get(rule.metric)
        if points is None or not points.height:
            continue
        out.extend(find_incidents(points, rule, run=run))
    return sorted(out, key=lambda i: (i.step, i.rule))
