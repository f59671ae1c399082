"""The one judge, shared by `scan` (whole streams) and `watch` (each stream's committed tail plus
what just arrived): streams from the canonical table, incidents from the rules, causes from the
context. Pure: frames in, incidents out; what the daemon already knows comes in as `Seen`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from .causes import RunContext, Series, label_all
from .loss_parts import with_summed_loss
from .spikes import find_incidents, find_incidents_by_run, held_per_segment
from ..model import Incident, NoLoss, ShortHistory
from .noise import NOISY_FIRINGS, Noisy, noisy
from ..ingest.needs import Needs
from .presets import preset_names
from .kinds import RULE_KINDS
from .rules import Rule, RuleSet, preset_rules
from .streams import NO_POINTS, Points, as_context, by_metric, by_run, by_run_and_metric, increasing, points_frame, points_of, preferred, single_valued
from ..ingest.table import Span, span_of

JUDGED = ("loss", "eval_loss", "lr", "grad_norm", "loss_scale", "step_time", "throughput")
"""The canonical metrics rules judge and causes read."""
CONTEXT_TAGS = {
    "OVERFLOW loss scale": "overflow",
    "number of skipped iterations": "skipped",
    "number of nan iterations": "nan_iterations",
}
"""Tags the cause labeller reads as they are (DeepSpeed's OVERFLOW lines, Megatron's counters),
with the RunContext field each fills."""
SCAN_NEEDS = Needs(frozenset(JUDGED), frozenset(CONTEXT_TAGS), loss_parts=True)
"""All a judgement reads of a run's table (rules name only JUDGED metrics: kinds.Rule checks it),
and the parts of a loss logged only in parts (loss_parts)."""


@dataclass(frozen=True)
class Seen:
    """What an earlier judgement already covered; the default (nothing) is the audit's case.

    The daemon judges a window that starts with the points of earlier passes: an incident there was
    raised then, unless the state knows it (it may have grown or recovered since) or its last
    flagged point is new."""

    before: Mapping[str, int] = field(default_factory=dict)
    """Points each stream held before its window starts (for min_history)."""
    new_from: Mapping[str, int] | None = None
    """First new step of each stream with new points; None: every point is new."""
    known: frozenset[tuple[str, int]] = frozenset()
    """(rule, first step) of the incidents already raised on the run."""
    open: tuple[Incident, ...] = ()
    """Incidents still open from earlier passes: context for labelling (recurrence)."""

    def is_new(self, inc: Incident) -> bool:
        if self.new_from is None or (inc.rule, inc.step) in self.known:
            return True
        last = inc.last_flagged_step if inc.last_flagged_step is not None else inc.step
        return last >= self.new_from[inc.metric]

    def judges(self, metric: str) -> bool:
        return self.new_from is None or metric in self.new_from


def _tag_series(rows: pl.DataFrame | None) -> Series | None:
    """A tag's rows (step, value) by step, the later write of a step winning."""
    if rows is None or not rows.height:
        return None
    steps = rows.get_column("step").to_numpy()
    if increasing(steps):
        return Series(steps, rows.get_column("value").to_numpy())  # in order already, nothing written twice
    return Series.of(rows.unique(subset=["step"], keep="last", maintain_order=True).sort("step"))


CONTEXT_STREAMS = ("loss", "lr", "grad_norm", "loss_scale", "eval_loss", "step_time", "throughput")


def context_of(run_frame: pl.DataFrame, streams: Mapping[str, pl.DataFrame]) -> RunContext:
    """What the labeller looks at: the context streams by step (after a resume, the replayed values;
    with their segments, for a spike of a timeline a resume replaced) and the tags it reads as they are."""
    return context_from(run_frame, {m: points_of(streams[m]) for m in CONTEXT_STREAMS if m in streams})


def context_from(run_frame: pl.DataFrame, streams: Mapping[str, Points], *, tagged: Mapping[str, pl.DataFrame] | None = None) -> RunContext:
    """`context_of`, with the streams as arrays (what the daemon holds its windows as). `tagged`:
    the run's rows of CONTEXT_TAGS by tag (step, value), when the caller split many runs' at once."""
    streams = {m: streams.get(m, NO_POINTS) for m in CONTEXT_STREAMS}  # (a caller judging fewer metrics has no others)
    parts = context_parts(run_frame, ["tag"]) if tagged is None else {(tag,): rows for tag, rows in tagged.items()}
    tags = {name: _tag_series(parts.get((tag,))) for tag, name in CONTEXT_TAGS.items()}
    resumed = {m: points_frame(streams[m]) for m in CONTEXT_STREAMS if streams[m][2].size and streams[m][2].max() > 0}
    plain = {m: Series(streams[m][0], streams[m][1]) if streams[m][0].size else None for m in CONTEXT_STREAMS if m not in resumed}
    return RunContext(**plain, **{m: Series.of(as_context(f)) for m, f in resumed.items()}, **tags, timelines=resumed)


def context_parts(frame: pl.DataFrame, by: list[str]) -> dict[tuple, pl.DataFrame]:
    """The rows (step, value) of CONTEXT_TAGS in `frame`, split by the columns `by` (tag; or run and
    tag), in file order. One filter for the three tags: most runs log none of them."""
    tagged = frame.filter(pl.col("tag").is_in(list(CONTEXT_TAGS))) if frame.height else frame
    return tagged.select(*by, "step", "value").partition_by(by, as_dict=True, include_key=False) if tagged.height else {}


ESCALATION_GAP = 10
"""A loss spike follows a grad-norm spike that is still open at its first step, or recovered at
most this many logged intervals before it."""


def _escalations(found: list[Incident], pool: Sequence[Incident], *, gap: float) -> list[Incident]:
    """Loss spikes that follow a grad-norm spike, linked to it (`follows`): the grad norm usually
    jumps first, and the loss following is the same trouble growing. (A non-finite grad norm is
    not one: fp16 overflow steps are routine. Both on one timeline: cut by the same resume, or by none.)"""
    grads = sorted((i for i in pool if i.metric == "grad_norm" and i.kind != "nonfinite"), key=lambda i: i.step)
    if not grads:
        return found
    out = []
    for inc in found:
        if inc.metric == "loss":
            before = [g for g in grads if g.step <= inc.step and (g.end_step is None or g.end_step >= inc.step - gap) and g.resumed_from == inc.resumed_from]
            if before:
                inc = replace(inc, follows=(before[-1].rule, before[-1].step))
        out.append(inc)
    return out


def rewritten(steps: np.ndarray, segments: np.ndarray) -> dict[int, int]:
    """Segment -> the lowest step a later segment of the stream starts at: from there on, the
    segment's points were written again (a resume), and where the later write wins
    (formats.base.LATER_WRITE_WINS) they are gone. Segments no later one rewrote are left out."""
    if not segments.size or segments[0] == segments[-1]:
        return {}
    starts = np.flatnonzero(np.r_[True, segments[1:] != segments[:-1]])
    firsts = steps[starts]
    later = np.minimum.accumulate(firsts[::-1])[::-1]  # the lowest first step of a segment from here on
    return {int(segments[starts[k]]): int(later[k + 1]) for k in range(starts.size - 1)}


def not_rewritten(found: list[Incident], points: Callable[[str], Points], seen: Seen) -> list[Incident]:
    """`found` less the incidents that begin at points a later write of their steps replaced (a run
    whose writer's later write wins: TensorBoard's event files after a restart): what the run's own
    viewer shows no longer holds them. An incident the daemon already announced stays, to be ended
    by the resume as anywhere else; one that began before the rewritten steps stays, ended there."""
    if not found:
        return found
    gone: dict[str, dict[int, int]] = {}
    out = []
    for inc in found:
        if inc.metric not in gone:
            steps, _, segments = points(inc.metric)
            gone[inc.metric] = rewritten(steps, segments)
        since = gone[inc.metric].get(inc.segment)
        if since is None or inc.step < since or (inc.rule, inc.step) in seen.known:
            out.append(inc)
    return out


def told_once(found: list[Incident], seen: Seen) -> list[Incident]:
    """`found` with one incident per trouble where a kind says again what another rule's incident on
    the same stream says (kinds.Rule.second_opinion: a divergence beside a spike): of two such
    incidents, the one that begins while the other is open is left out (at one step, the second
    opinion). A loss that jumps to 3x and stays there for five points is one spike, and a climb a
    spike rule also fires on halfway is one divergence. A NaN is never left out. Judged before what
    is new is kept (Seen.is_new), over every incident the window holds and those the daemon holds
    open, so the daemon leaves out what `scan` does however its passes cut the run; except that an
    incident already announced is never left out, and leaves out one that overlaps it whichever
    began first (the daemon may have seen the spike before the climb was clear)."""
    def opinion(inc: Incident) -> bool | None:
        """Whether the incident is a second opinion; None: its kind is never left out nor leaves one out."""
        kind = RULE_KINDS.get(inc.kind)
        return None if kind is None or kind.nonfinite_only else kind.second_opinion

    if not any(opinion(i) for i in found):
        return found

    def open_at(inc: Incident, step: int) -> bool:
        return inc.step <= step and (inc.end_step is None or inc.end_step > step)

    def told_by(other: Incident, inc: Incident, *, same_window: bool) -> bool:
        mine, theirs = opinion(inc), opinion(other)
        if mine is None or theirs is None or mine == theirs or other.metric != inc.metric or (inc.rule, inc.step) in seen.known:
            return False
        if same_window and other.segment != inc.segment:
            return False
        if (other.rule, other.step) in seen.known and open_at(inc, other.step):
            return True
        return open_at(other, inc.step) and (other.step < inc.step or not theirs)

    held = [o for o in seen.open if o.resumed_from is None]
    return [inc for inc in found if not any(told_by(o, inc, same_window=True) for o in found)
            and not any(told_by(o, inc, same_window=False) for o in held)]


def _last_segments(windows: Mapping[str, pl.DataFrame]) -> Callable[[str], int]:
    """Each stream's last segment (its resumes), asked only for the metrics of new incidents."""
    return lambda m: int(windows[m].get_column("segment").max()) if windows[m].height else 0


def _resumes_after(inc: Incident, last_segment: Callable[[str], int]) -> int:
    """How many resumes came after the incident's segment in its stream."""
    return last_segment(inc.metric) - inc.segment


def judge(
    windows: Mapping[str, pl.DataFrame],
    context: RunContext | Callable[[], RunContext],
    rules: Sequence[Rule],
    *,
    run: str,
    seen: Seen = Seen(),
    later_write_wins: bool = False,
) -> tuple[Incident, ...]:
    """The run's new incidents, labelled. `windows`: each metric's stream (step, value, segment);
    `context`: what labelling reads (its incidents are filled in here: the new ones and
    `seen.open`), or a function that makes it, called only when there is something to label: the
    daemon judges every busy run several times a second and rarely finds anything.
    `later_write_wins`: the run's writer replaces a step's earlier write (not_rewritten)."""
    found: list[Incident] = []
    for rule in rules:
        points = windows.get(rule.metric)
        if points is None or not points.height or not seen.judges(rule.metric):
            continue
        found.extend(find_incidents(points, rule, run=run, seen_before=seen.before.get(rule.metric, 0)))
    if later_write_wins:
        found = not_rewritten(found, lambda m: points_of(windows[m]), seen)
    return _label([i for i in told_once(found, seen) if seen.is_new(i)], context, _last_segments(windows), seen, rules)


def judge_runs(
    streams: Mapping[str, pl.DataFrame],
    *,
    runs: Sequence[str],
    rules: Sequence[Sequence[Rule]],
    seen: Sequence[Seen],
    view: Callable[[int], tuple[Callable[[str], int], RunContext]],
    later_write_wins: Sequence[bool] = (),
) -> dict[int, tuple[Incident, ...]]:
    """`judge` of many runs in one set of queries (a daemon pass over hundreds of busy runs): for
    run k (an index into `runs`), what judge(its windows, its context, rules[k], seen=seen[k])
    returns. `streams`: each metric's windows of all runs, as find_incidents_by_run takes them;
    `view(k)`: run k's last segment of each stream (metric -> segment) and its context, asked only
    of runs with incidents to label; `later_write_wins`: per run, what judge takes (none: False).
    Runs without new incidents are left out; the others in order."""
    found: dict[int, list[Incident]] = {}
    for rule in dict.fromkeys(r for mine in rules for r in mine):  # each rule once, in the runs' order
        points = streams.get(rule.metric)
        if points is None or not points.height:
            continue
        judged = [k for k in range(len(runs)) if rule in rules[k] and seen[k].judges(rule.metric)]
        if not judged:
            continue
        if len(judged) < len(runs):
            points = points.filter(pl.col("run").is_in(judged))
        before = [s.before.get(rule.metric, 0) for s in seen]
        for k, incidents in find_incidents_by_run(points, rule, runs=runs, seen_before=before).items():
            found.setdefault(k, []).extend(incidents)
    out = {}
    for k, incidents in sorted(found.items()):
        if k < len(later_write_wins) and later_write_wins[k]:
            incidents = not_rewritten(incidents, lambda m, k=k: _run_points(streams[m], k), seen[k])
        incidents = [i for i in told_once(incidents, seen[k]) if seen[k].is_new(i)]
        if incidents:
            last_segment, context = view(k)
            out[k] = _label(incidents, context, last_segment, seen[k], rules[k])
    return out


def _run_points(points: pl.DataFrame, k: int) -> Points:
    """Run k's stream out of many runs' (judge_runs' `streams`)."""
    return points_of(points.filter(pl.col("run") == k))


def _label(
    found: list[Incident], context: RunContext | Callable[[], RunContext], last_segment: Callable[[str], int], seen: Seen, rules: Sequence[Rule]
) -> tuple[Incident, ...]:
    """The new incidents of a run (each rule's, in the order of its rules), linked and labelled;
    those a rule takes back once the run's other streams are seen (Rule.holds) left out."""
    if not found:
        return ()
    found.sort(key=lambda i: (i.step, i.rule))
    if callable(context):
        context = context()
    named = {r.name: r for r in rules}
    found = [i for i in found if i.rule not in named or named[i.rule].holds(i, context)]
    if not found:
        return ()
    keys = {i.key for i in found}
    found = _escalations(found, (*found, *seen.open), gap=ESCALATION_GAP * context.interval)
    context = replace(context, incidents=(*found, *(i for i in seen.open if i.key not in keys)))
    backs = [_resumes_after(i, last_segment) for i in found]
    if not any(backs):
        return tuple(label_all(found, context))
    # An incident of a timeline a resume replaced is explained by that timeline's context.
    views = {back: context.as_of(back) for back in set(backs)}
    return tuple(inc for inc, back in zip(found, backs) for inc in label_all([inc], views[back]))


@dataclass(frozen=True)
class RunAnalysis:
    run: str
    metrics: dict[str, str]
    """canonical metric -> the tag it was read from"""
    steps: int
    """loss points read (after collapsing duplicate steps)"""
    first_step: int | None
    last_step: int | None
    incidents: tuple[Incident, ...]
    short: tuple[ShortHistory, ...] = ()
    """Segments too short for every loss spike rule: judged by none of them."""
    unjudged: tuple[NoLoss, ...] = ()
    """The run itself, when it holds no loss for the loss rules to judge."""
    noisy: tuple[Noisy, ...] = ()
    """The run, when its loss rule keeps firing on the loss's own noise (detection.noise)."""

    @property
    def notes(self) -> tuple[NoLoss | ShortHistory | Noisy, ...]:
        """What the report says of the run besides its spikes: nothing judged, too short, too noisy."""
        return (*self.unjudged, *self.short, *self.noisy)


def tags_used(run_frame: pl.DataFrame) -> dict[str, str]:
    """Canonical metric -> the tag its stream is read from, as `streams.by_metric` picks it."""
    counts = (
        run_frame.select("metric", "tag").filter(pl.col("metric").is_in(list(JUDGED)))
        .group_by("metric", "tag", maintain_order=True).len()
    )
    tags: dict[str, list[tuple[str, int]]] = {}
    for metric, tag, n in counts.iter_rows():
        tags.setdefault(metric, []).append((tag, n))
    return {m: preferred(m, tags[m]) for m in JUDGED if m in tags}


def too_short(points: pl.DataFrame, rules: Sequence[Rule], *, run: str, metric: str = "loss") -> tuple[ShortHistory, ...]:
    """The segments of a stream (step, value, segment) that every spike rule on it needs more values
    for than they hold. Rules that only catch NaN/Inf judge any point and are left out; with no spike
    rule on the metric, nothing is too short for it."""
    spike_rules = [r for r in rules if r.metric == metric and not r.nonfinite_only]
    if not spike_rules or not points.height:
        return ()
    held = [(r, held_per_segment(points, r)) for r in spike_rules]
    segments = points.get_column("segment")
    if single_valued(segments):
        # A run that never rewound (nearly all): its one span is read off the ends, no group-by.
        steps = points.get_column("step")
        spans = [(segments[0], steps[0], steps[-1], points.height)]
    else:
        spans = points.group_by("segment", maintain_order=True).agg(
            pl.col("step").first().alias("first"), pl.col("step").last().alias("last"), pl.len().alias("n")
        ).rows()
    whole = len(spans) == 1
    out = []
    for segment, first, last, n in spans:
        have = [(r.history - got.get(segment, 0), got.get(segment, 0), r.history) for r, got in held]
        if all(short > 0 for short, _, _ in have):
            _, closest, needed = min(have)
            out.append(ShortHistory(
                run=run, metric=metric, segment=segment, resumed=segment > 0, whole_run=whole,
                first_step=first, last_step=last, points=n, held=closest, needed=needed,
            ))
    return tuple(out)


def analyse_run(run_frame: pl.DataFrame, rules: RuleSet, *, run: str, later_write_wins: bool = False) -> RunAnalysis:
    return analyse_runs([run_frame], rules, runs=[run], later_write_wins=[later_write_wins])[0][0]


def analyse_runs(
    frames: Sequence[pl.DataFrame], rules: RuleSet, *, runs: Sequence[str], spans: Sequence[Span | None] | None = None,
    later_write_wins: Sequence[bool] = (),
) -> list[tuple[RunAnalysis, dict[str, Points]]]:
    """The audit of whole runs, each with the streams it was judged on (the scan plots them). Many
    runs are judged in one set of queries: a scan worker takes its small runs many at a time, where
    a dozen polars calls per run cost more than the rows (1,000 runs of 1,200 steps: ~10 ms a run
    alone). A run alone (a large one: a scan batches only small runs) is judged on its own, with no
    run key to carry over tens of millions of rows. `frames`: each run's table (at least step,
    metric, tag, value); `spans`: the steps each run covers, when its frame holds only what judging
    needs (SCAN_NEEDS); None: read off the frames. Runs judged together are judged as strangers:
    nothing of one reaches another, and each gets what it gets alone (tests/test_many_runs.py).
    `later_write_wins`: per run, whether its writer replaces a step's earlier write (judge)."""
    active = [rules.for_run(run) for run in runs]
    frames = [with_summed_loss(f) for f in frames]
    if len(frames) == 1:
        streams = by_metric(frames[0], JUDGED)
        windows = [{m: points_of(s) for m, s in streams.items()}]
        wins = bool(later_write_wins and later_write_wins[0])
        found = {0: judge(streams, lambda: context_of(frames[0], streams), active[0], run=runs[0], later_write_wins=wins)}
        tags = [tags_used(frames[0])]
    else:
        windows, found, tags = _judge_together(frames, active, runs, later_write_wins)
    out = []
    for k, run in enumerate(runs):
        span = span_of(frames[k]) if spans is None else spans[k]
        first, last = span or (None, None)
        loss = windows[k]["loss"]
        analysis = RunAnalysis(
            run=run,
            metrics=tags[k],
            steps=loss[0].size,
            first_step=first,
            last_step=last,
            incidents=found.get(k, ()),
            short=too_short(points_frame(loss), active[k], run=run),
            # (A run of one step, a config's numbers read as a record, is no training log to say it of.)
            unjudged=(NoLoss(run),) if not loss[0].size and first != last and any(r.metric == "loss" for r in active[k]) else (),
        )
        if len(analysis.incidents) >= NOISY_FIRINGS:
            analysis = replace(analysis, noisy=_noisy(analysis, frames[k], loss[0].size, windows[k]))
        out.append((analysis, windows[k]))
    return out


def _noisy(analysis: RunAnalysis, frame: pl.DataFrame, points: int, windows: Mapping[str, Points]) -> tuple[Noisy, ...]:
    """The run's noise note, with each preset judged on this run (only for a run whose rules fired
    often enough to ask)."""
    streams: dict[str, pl.DataFrame] | None = None

    def judged_with(name: str) -> tuple[Incident, ...]:
        nonlocal streams
        streams = streams if streams is not None else by_metric(frame, JUDGED)
        rules = preset_rules(name).for_run(analysis.run)
        return judge(streams, lambda: context_of(frame, streams), rules, run=analysis.run)

    interval = RunContext(loss=Series(windows["loss"][0], windows["loss"][1])).interval
    note = noisy(analysis.run, analysis.incidents, points=points, interval=interval, presets=preset_names(), judged_with=judged_with,
                 loss=(windows["loss"][0], windows["loss"][1]))
    return (note,) if note is not None else ()


def _judge_together(
    frames: Sequence[pl.DataFrame], active: Sequence[Sequence[Rule]], runs: Sequence[str], later_write_wins: Sequence[bool] = ()
) -> tuple[list[dict[str, Points]], dict[int, tuple[Incident, ...]], list[dict[str, str]]]:
    """Each run's streams, its incidents (by position, runs without any left out) and the tags its
    streams were read from, for many runs in one set of queries."""
    # Runs told apart by position: names need not be unique.
    whole = pl.concat([f.select("step", "metric", "tag", "value", pl.lit(k, dtype=pl.UInt32()).alias("run")) for k, f in enumerate(frames)], how="vertical_relaxed")
    points, chosen = by_run_and_metric(whole, JUDGED, best={})
    windows = [{m: points.get((k, m), NO_POINTS) for m in JUDGED} for k in range(len(frames))]
    tags = [{m: chosen[(k, m)] for m in JUDGED if (k, m) in chosen} for k in range(len(frames))]

    tagged: dict[int, dict[str, pl.DataFrame]] = {}
    for (k, tag), rows in context_parts(whole, ["run", "tag"]).items():
        tagged.setdefault(k, {})[tag] = rows

    def view(k: int) -> tuple[Callable[[str], int], RunContext]:
        mine = windows[k]
        return (lambda m: int(mine[m][2].max()) if mine[m][2].size else 0), context_from(frames[k], mine, tagged=tagged.get(k, {}))

    found = judge_runs(by_run(windows, JUDGED), runs=runs, rules=active, seen=[Seen()] * len(runs), view=view, later_write_wins=later_write_wins)
    return windows, found, tags
