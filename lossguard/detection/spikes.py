"""Pure detection: a metric stream and a rule in, incidents out. No clock, no I/O, so `scan` and
`watch` can never disagree about the same points.

Every rule is judged with vectorised polars expressions over the whole stream (rolling windows per
evaluation unit, see streams.segments_with_history); only the few flagged points are walked in Python
to group them into incidents and find where each recovered.

What a kind flags, and how its incidents recover, is the kind's own (lossguard.detection.kinds); this module
runs every kind the same way. Kinds that are `finite_only` see only finite values: a NaN neither
enters a window nor resets it, and the `nonfinite` rule is what catches it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import numpy as np
import polars as pl

from .kinds import Rule
from ..model import Incident
from .streams import segments_with_history, single_valued


def _judge(units: pl.DataFrame, rule: Rule, *, seen_before: int | pl.Expr = 0) -> tuple[pl.DataFrame, int]:
    """The flagged points only: their row index `i` in `units`, the `baseline` each was compared
    with and the `limit` it exceeded; and how many points back the condition began (`onset`).
    Only flagged rows are materialised: on a healthy stream that is none of millions.
    `seen_before`: one count for every unit, or an expression giving each row its unit's (the
    units of find_incidents_by_run are runs, each with the tail it continues)."""
    if isinstance(seen_before, pl.Expr):
        return _judge_units(units, rule, seen_before=seen_before, single=False)
    single = single_valued(units.get_column("unit"))
    index = rule.quick_flags(units) if single else None
    if index is not None:
        index = index[index + 1 + seen_before >= rule.history]
        if rule.judge_until is not None:
            index = index[index + 1 + seen_before <= rule.judge_until]
        empty = pl.Series([None] * index.size, dtype=pl.Float64)
        return pl.DataFrame({"i": index.astype(np.int64), "baseline": empty, "limit": empty}), 0
    return _judge_units(units, rule, seen_before=seen_before, single=single)


def _judge_units(units: pl.DataFrame, rule: Rule, *, seen_before: int | pl.Expr, single: bool) -> tuple[pl.DataFrame, int]:
    def per_unit(e: pl.Expr) -> pl.Expr:
        # Window expressions cost a group-by; a stream that never rewound needs none.
        return e if single else e.over("unit")

    judgement = rule.judgement(pl.col("value"), per_unit)
    seen = per_unit(pl.int_range(1, pl.len() + 1)) + seen_before
    flag = judgement.condition.fill_null(False) & (seen >= rule.history)
    if rule.judge_until is not None:
        flag = flag & (seen <= rule.judge_until)
    if rule.lookback and (isinstance(seen_before, pl.Expr) or seen_before):
        # A window cut from a longer stream (the daemon's tail): a point whose lookback reaches past
        # its start would be judged on fewer values than the whole stream gives it. Only the stream's
        # true start may judge on a short history (min_history).
        cut = seen - seen_before > rule.lookback
        flag = flag & (cut if not isinstance(seen_before, pl.Expr) else (seen_before == 0) | cut)
    if not single or not units.get_column("judge").all():
        flag = flag & pl.col("judge")
    flagged = (
        units.lazy()
        .with_row_index("i")
        .with_columns(flag.alias("__flag"), judgement.baseline.alias("baseline"), judgement.limit.alias("limit"))
        .filter(pl.col("__flag"))
        .select(pl.col("i").cast(pl.Int64), "baseline", "limit")
        # One engine for every judgement: polars' streaming engine sums a rolling window in another
        # order than the in-memory one, which window expressions over many runs (`over`) always use,
        # and a limit one ulp apart could flag a point in one command and not the other.
        .collect(engine="in-memory")
    )
    return flagged, judgement.onset


def held_per_segment(points: pl.DataFrame, rule: Rule) -> dict[int, int]:
    """Values the rule can judge the last point of each segment with: the segment's own (finite, for
    a kind that skips NaN) and the history it continues from (at most its lookback), as _judge
    counts them. A segment missing from the answer holds none."""
    segment = points.get_column("segment")
    if points.height and single_valued(segment):
        # A run that never rewound (nearly all): a count, not a group-by over millions of points.
        values = points.get_column("value").to_numpy()
        n = int(np.isfinite(values).sum()) if rule.finite_only else values.size
        return {int(segment[0]): n} if n else {}
    if rule.finite_only:
        points = points.filter(pl.col("value").is_finite())
    if not points.height:
        return {}
    units = segments_with_history(points, rule.lookback)
    return dict(units.group_by("unit").len().iter_rows())


def _recovery(signal: np.ndarray, start: int, stop: int, beyond: Callable[[np.ndarray], np.ndarray], need: int) -> int | None:
    """Index of the first of `need` consecutive points in [start, stop) that are not `beyond`."""
    run = 0
    chunk = 64
    i = start
    while i < stop:
        block = ~beyond(signal[i : min(stop, i + chunk)])
        for j, ok in enumerate(block):
            run = run + 1 if ok else 0
            if run == need:
                return i + j - need + 1
        i += chunk
        chunk *= 2
    return None


def find_incidents_by_run(
    points: pl.DataFrame, rule: Rule, *, runs: Sequence[str], seen_before: Sequence[int] | None = None
) -> dict[int, list[Incident]]:
    """find_incidents of many runs' streams in one set of queries: what a daemon pass over hundreds
    of busy runs judges (one query per rule, not one per rule per run). `points`: columns run (an
    index into `runs`), step, value, segment, each run's rows together and in file order;
    `seen_before`: per run index, what find_incidents takes. Returns what find_incidents returns for
    each run's rows, keyed by run index in order (runs without incidents left out). Each run is a unit of
    the window expressions; a run that rewound (several segments) is judged on its own."""
    seen_before = seen_before if seen_before is not None else [0] * len(runs)
    if not points.height:
        return {}
    codes = points.get_column("run").to_numpy()
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    if starts.size == 1:
        found = find_incidents(points.drop("run"), rule, run=runs[int(codes[0])], seen_before=seen_before[int(codes[0])])
        return {int(codes[0]): found} if found else {}
    segments = points.get_column("segment").to_numpy()
    rewound = np.minimum.reduceat(segments, starts) != np.maximum.reduceat(segments, starts)
    out: dict[int, list[Incident]] = {}
    if rewound.any():
        ends = np.r_[starts[1:], codes.size]
        for start, end in zip(starts[rewound].tolist(), ends[rewound].tolist()):
            code = int(codes[start])
            found = find_incidents(points.slice(start, end - start).drop("run"), rule, run=runs[code], seen_before=seen_before[code])
            if found:
                out[code] = found
        points = points.filter(~pl.Series(np.repeat(rewound, np.diff(np.r_[starts, codes.size]))))
    values = points.get_column("value").to_numpy()
    all_finite = bool(np.isfinite(values).all())
    if rule.finite_only:
        if not all_finite:
            points = points.filter(pl.col("value").is_finite())
    elif rule.nonfinite_only and all_finite:
        return dict(sorted(out.items()))
    if not points.height:
        return dict(sorted(out.items()))
    codes = points.get_column("run").to_numpy()
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    lengths = np.diff(np.r_[starts, codes.size])
    before = np.asarray(seen_before, dtype=np.int64)[codes[starts]]
    units = points.select("step", "value", "segment", pl.col("run").alias("unit"), pl.lit(True).alias("judge")).with_columns(
        pl.Series("seen_before", np.repeat(before, lengths))
    )
    flagged, onset = _judge(units, rule, seen_before=pl.col("seen_before"))
    if not flagged.height:
        return dict(sorted(out.items()))
    i = flagged.get_column("i").to_numpy()
    at = np.searchsorted(starts, i, side="right") - 1
    # Each run's flagged rows, numbered within its run, as slices of one frame (a filter and a
    # renumbering a run were a tenth of a batch's analysis); they come in order of `i`, so of run.
    flagged = flagged.with_columns(pl.Series("i", i - starts[at], dtype=flagged.schema["i"]))
    if at.size > 1 and not bool((at[1:] >= at[:-1]).all()):
        order = np.argsort(at, kind="stable")
        flagged, at = flagged[order], at[order]
    ks, firsts, counts = np.unique(at, return_index=True, return_counts=True)
    for k, lo, m in zip(ks.tolist(), firsts.tolist(), counts.tolist()):
        start, n = int(starts[k]), int(lengths[k])
        mine = flagged.slice(lo, m)
        part = units.slice(start, n)
        code = int(codes[start])
        found = _incidents(part, mine, onset, rule, run=runs[code], segment=0)  # (as find_incidents numbers a lone unit)
        if found:
            out[code] = _apply_cooldown(found, rule)
    return dict(sorted(out.items()))


def find_incidents(points: pl.DataFrame, rule: Rule, *, run: str, seen_before: int = 0) -> list[Incident]:
    """Incidents of one rule on one stream (columns step, value, segment; file order).
    `seen_before`: points the stream held before these (the daemon passes a tail), for min_history."""
    all_finite = bool(np.isfinite(points.get_column("value").to_numpy()).all())
    if rule.finite_only:
        if not all_finite:
            points = points.filter(pl.col("value").is_finite())
    elif rule.nonfinite_only and all_finite:
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
    resumes = {} if single_valued(unit_of) else _resumes(units)
    for unit, part, mine in parts:
        found = _incidents(part, mine, onset, rule, run=run, segment=int(unit))
        for inc in found:
            if inc.end_step is None and unit in resumes:
                inc = replace(inc, resumed_from=resumes[unit])  # its timeline was replaced by a replay
            # A replay after a resume must not raise the incident of the original timeline again.
            if inc.step in seen_keys:
                continue
            seen_keys.add(inc.step)
            incidents.append(inc)
    return _apply_cooldown(incidents, rule)


def _resumes(units: pl.DataFrame) -> dict[int, int]:
    """Each unit (segment) that a resume ended -> the step the run resumed from: the first step the
    next segment judges."""
    firsts = units.filter(pl.col("judge")).group_by("unit", maintain_order=True).agg(pl.col("step").first())
    rows = firsts.rows()
    return {int(unit): int(nxt) for (unit, _), (_, nxt) in zip(rows, rows[1:])}


def _incidents(part: pl.DataFrame, flagged: pl.DataFrame, onset: int, rule: Rule, *, run: str, segment: int) -> list[Incident]:
    idx = flagged.get_column("i").to_numpy()
    if not idx.size:
        return []
    steps = part.get_column("step").to_numpy()
    values = part.get_column("value").to_numpy()
    baselines = dict(zip(idx.tolist(), flagged.get_column("baseline").to_list()))
    limits = dict(zip(idx.tolist(), flagged.get_column("limit").to_list()))
    n = len(values)
    signal = rule.recovery_signal(values, idx)
    out: list[Incident] = []
    covered_until = -1  # index up to which the current incident has not recovered
    for f in idx.tolist():
        if f < covered_until:
            out[-1] = _extend(out[-1], f, steps, values)
            continue
        # An incident never begins inside the one before it, whatever its onset reaches back to.
        first = max(0, rule.start(values, f, onset), covered_until)
        limit = limits[f]
        end = _recovery(signal, f + 1, n, partial(rule.beyond, limit=limit), rule.recovery)
        span_end = end if end is not None else n
        peak = first + rule.peak(values[first:span_end])
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
