"""The domain objects that leave the engine: immutable, hashable, with a stable JSON form shared by
`scan --format json` and the daemon."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace


def json_number(value: float | None) -> float | str | None:
    """JSON has no NaN/Infinity: they are written as the strings every JSON parser can carry."""
    if value is None:
        return None
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def from_json_number(value: object) -> float | None:
    """The inverse of json_number."""
    if value is None:
        return None
    return float(value)  # float("NaN"), float("Infinity") and float("-Infinity") are what they say


RANKED = re.compile(r"^(?P<run>.+) \[rank (?P<rank>\d{1,6})\]$")
"""The name a run's per-rank stream goes by inside lossguard (`job7 [rank 1]`): discovery gives each
rank's files their own stream, so the daemon's state (streams, cursors, incidents keyed by run)
needs nothing new and a run of one rank costs nothing; reports split it back into run and rank. It
reads well wherever it is shown as it is (a status line, a metric's label, a daemon's alert)."""


def ranked(run: str, rank: str) -> str:
    """The internal name of one rank's stream of `run`."""
    return f"{run} [rank {int(rank)}]"


def split_rank(run: str) -> tuple[str, str | None]:
    """(run, rank) of an internal run name; (run, None) for a run not written per rank."""
    match = RANKED.match(run)
    return (match["run"], match["rank"]) if match else (run, None)


@dataclass(frozen=True)
class Cause:
    cause: str
    confidence: float
    evidence: str
    suggestion: str

    def to_json(self) -> dict[str, object]:
        """Every field as it is (the daemon's store): from_json gives this cause back."""
        return {"cause": self.cause, "confidence": self.confidence, "evidence": self.evidence, "suggestion": self.suggestion}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Cause:
        return cls(cause=str(data["cause"]), confidence=float(data["confidence"]), evidence=str(data["evidence"]), suggestion=str(data["suggestion"]))

    def to_report(self) -> dict[str, object]:
        """The scan report's form: the confidence rounded for people."""
        return {**self.to_json(), "confidence": round(self.confidence, 3)}


TROUBLES = {"divergence": "divergence", "throughput": "slowdown", "overfitting": "overfitting", "straggler": "straggler", "nonfinite": "NaN"}
"""Incident.trouble of the rule kinds that are no spike (a crash is a `crash`; a non-finite value that
is infinite an `Inf`, a replica's loss apart from the others' a `diverging replica`)."""
PLURALS = {"spike": "spikes", "crash": "crashes", "divergence": "divergences", "slowdown": "slowdowns", "overfitting": "overfitting",
           "straggler": "stragglers", "NaN": "NaNs", "Inf": "Infs", "diverging replica": "diverging replicas"}
ORDER = ("spike", "NaN", "Inf", "divergence", "slowdown", "straggler", "diverging replica", "overfitting", "crash")


def troubles_counted(incidents: Iterable[Incident]) -> str:
    """The findings by their word, as a report or a digest says them: `1 spike, 2 crashes`."""
    counts = Counter(inc.trouble for inc in incidents)
    order = [*ORDER, *sorted(set(counts) - set(ORDER))]
    return ", ".join(f"{counts[w]} {w if counts[w] == 1 else PLURALS.get(w, w)}" for w in order if counts[w])


@dataclass(frozen=True)
class Incident:
    run: str
    metric: str
    rule: str
    kind: str
    severity: str
    step: int
    """First step of the incident (for patience rules, the first of the consecutive points)."""
    peak_step: int
    value: float
    """The peak value (for non-finite incidents, the first non-finite value)."""
    baseline: float | None
    """What the rule compared against just before the incident (window mean, EWM, bound...)."""
    threshold: float | None
    end_step: int | None = None
    """First step of the recovery (back under the threshold for `recovery` points); None while open."""
    last_flagged_step: int | None = None
    points: int = 1
    """Points of the incident that the rule flagged."""
    segment: int = 0
    causes: tuple[Cause, ...] = field(default=())
    resumed_from: int | None = None
    """The run resumed from this (earlier) step before the incident recovered: its timeline was
    replaced by the replay, so the incident ended there rather than staying open."""
    follows: tuple[str, int] | None = None
    """(rule, first step) of the grad-norm incident this loss spike followed: the same trouble
    escalating (one alert thread), not a second, unrelated one."""
    error: str | None = None
    """A crash: the error that ended the run, in one line (`CUDA out of memory`)."""
    lines: tuple[str, ...] = ()
    """A crash: the lines of the log that say it (a few, each cut short; raw text, escaped where shown)."""
    ranks: tuple[str, ...] = ()
    """The ranks of a run written per rank that saw the incident (several: the same spike on data
    parallel replicas, one incident); () where the run is one stream, or its name says the rank."""
    host: str | None = None
    """The host the incident happened on, where the log says it (torchrun's failure table)."""
    timeline: int = 0
    """Which of the stream's timelines the incident is on, as the daemon counts them from its first
    read: each time the steps go back (a resume, a log a new run rewrote from its start) a new one
    begins. With (run, rule, step) it names the incident: a re-run's spike at a step an earlier
    timeline spiked at is another incident, alerted on its own. (`scan` leaves it 0.)"""

    @property
    def over(self) -> bool:
        """Recovered, or ended by a resume from an earlier checkpoint."""
        return self.end_step is not None or self.resumed_from is not None

    @property
    def ending(self) -> str:
        """How the incident ended, in words (for reports and alerts)."""
        if self.end_step is not None:
            return f"recovered at step {self.end_step}"
        if self.resumed_from is not None:
            return f"ended when the run resumed from step {self.resumed_from}"
        return "still open"

    @property
    def later_timeline(self) -> int:
        """Which of the run's timelines the incident is on, counted from 0, where the run's steps
        went back (a resume, a re-run into the same log or tracker run): the daemon's `timeline`,
        else scan's `segment`."""
        return self.timeline or self.segment

    @property
    def timeline_words(self) -> str | None:
        """The incident's timeline in words, where the steps went back before it (two files of one
        W&B run that both count from 0 both have a step 100); None on the run's first."""
        return f"timeline {self.later_timeline + 1}: after the steps went back" if self.later_timeline else None

    @property
    def at(self) -> str:
        """Where the incident is, in words: its step, and its timeline_words."""
        return f"step {self.step}" + (f" ({self.timeline_words})" if self.timeline_words else "")

    @property
    def trouble(self) -> str:
        """What reports and alerts call the incident, in one word: a crash, a divergence (a loss that
        kept rising, measured against its recent minimum, never far above the points just before
        it), a slowdown (the throughput kind), overfitting, a NaN (or Inf: a non-finite value; "spike"
        said of a NaN read as a large number), a straggler or a diverging replica, else a spike."""
        if self.is_crash:
            return "crash"
        if self.kind == "nonfinite" and math.isinf(self.value):
            return "Inf"
        if self.kind == "straggler" and self.metric != "step_time":
            return "diverging replica"
        return TROUBLES.get(self.kind, "spike")

    @property
    def compared_with(self) -> str:
        """Its baseline, in words: a divergence's is the loss's recent minimum, not a recent mean; a
        straggler's the other ranks' median at the same steps."""
        if self.kind == "straggler":
            return "the other ranks' median"
        return "its recent minimum" if self.kind == "divergence" else "baseline"

    @property
    def is_crash(self) -> bool:
        return self.error is not None

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0 or not math.isfinite(self.value):
            return None
        return self.value / self.baseline

    @property
    def run_name(self) -> str:
        """The run, without the rank its stream is of."""
        return split_rank(self.run)[0]

    @property
    def rank_list(self) -> tuple[str, ...]:
        """The ranks that saw it, as a report says them: its own, or the one its stream is of."""
        own = split_rank(self.run)[1]
        return self.ranks or ((own,) if own is not None else ())

    @property
    def shown_run(self) -> str:
        """The run as an alert names it: one seen on several ranks names them all (`job [ranks 0, 1]`)."""
        ranks = self.rank_list
        return f"{self.run_name} [ranks {', '.join(ranks)}]" if len(ranks) > 1 else self.run

    @property
    def where(self) -> str | None:
        """Its ranks and host in words (`rank 1 on node-3`, `ranks 0, 1`); None where neither is known."""
        ranks = self.rank_list
        said = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}" if ranks else ""
        if self.host:
            said = f"{said} on {self.host}" if said else f"on {self.host}"
        return said or None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.run, self.rule, self.step)

    def with_causes(self, causes: tuple[Cause, ...]) -> Incident:
        return replace(self, causes=causes)

    def to_json(self) -> dict[str, object]:
        """Every field, losslessly (non-finite numbers as JSON-safe strings): how the daemon stores an
        incident and hands it to the alert pipeline. from_json gives the same incident back."""
        return {
            "run": self.run,
            "metric": self.metric,
            "rule": self.rule,
            "kind": self.kind,
            "severity": self.severity,
            "step": self.step,
            "peak_step": self.peak_step,
            "value": json_number(self.value),
            "baseline": json_number(self.baseline),
            "threshold": json_number(self.threshold),
            "end_step": self.end_step,
            "last_flagged_step": self.last_flagged_step,
            "points": self.points,
            "segment": self.segment,
            "causes": [c.to_json() for c in self.causes],
            "resumed_from": self.resumed_from,
            "follows": None if self.follows is None else list(self.follows),
            "timeline": self.timeline,
            **({"error": self.error, "lines": list(self.lines)} if self.error is not None else {}),
            **({"ranks": list(self.ranks)} if self.ranks else {}),
            **({"host": self.host} if self.host else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Incident:
        """Also reads the report form (to_report) that state files from before layout 3 stored:
        the fields it lacks take their defaults."""

        def step(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(value)

        return cls(
            run=str(data["run"]), metric=str(data["metric"]), rule=str(data["rule"]), kind=str(data["kind"]),
            severity=str(data["severity"]), step=int(data["step"]), peak_step=int(data["peak_step"]),
            value=float(data["value"]), baseline=from_json_number(data.get("baseline")),
            threshold=from_json_number(data.get("threshold")), end_step=step("end_step"),
            last_flagged_step=step("last_flagged_step"), points=int(data.get("points", 1)),
            segment=int(data.get("segment", 0)), causes=tuple(Cause.from_json(c) for c in data.get("causes", ())),
            resumed_from=step("resumed_from"),
            follows=None if not data.get("follows") else (str(data["follows"][0]), int(data["follows"][1])),
            timeline=int(data.get("timeline", 0)),
            error=None if data.get("error") is None else str(data["error"]),
            lines=tuple(str(line) for line in data.get("lines") or ()),
            ranks=tuple(str(r) for r in data.get("ranks") or ()),
            host=None if data.get("host") is None else str(data["host"]),
        )

    def to_report(self) -> dict[str, object]:
        """The documented spike of `scan --format json` (docs/scan.md): the derived ratio and rounded
        confidences for people; the engine's bookkeeping (segment, last flagged step) left out."""
        full, ratio = self.to_json(), self.ratio
        head = ("run", "metric", "rule", "kind", "severity", "step", "peak_step", "end_step", "value", "baseline", "threshold")
        report = {
            **{k: full[k] for k in head},
            "ratio": None if ratio is None else round(ratio, 4),
            "points": self.points,
            "causes": [c.to_report() for c in self.causes],
        }
        if self.error is not None:
            # A crash has no value to compare: it says the error and the lines that say it.
            report.update(value=None, ratio=None, error=self.error, lines=list(self.lines))
        if self.resumed_from is not None:  # (only then: these keys are new, and rare)
            report["resumed_from"] = self.resumed_from
        if self.later_timeline:
            report["segment"] = self.later_timeline  # (as a too_short warning numbers them)
        if self.follows is not None:
            report["follows"] = {"rule": self.follows[0], "step": self.follows[1]}
        ranks = self.rank_list
        if ranks:  # (only for runs written per rank: a run of one stream has no rank to say)
            report.update(run=self.run_name, rank=int(ranks[0]), ranks=[int(r) for r in ranks])
        if self.host:
            report["host"] = self.host
        return report

@dataclass(frozen=True)
class ShortHistory:
    """A run (or one of its segments) holding fewer loss values than every spike rule needs before it
    may fire: nothing in it was judged, and the report says so rather than a silent "no spike"."""

    run: str
    metric: str
    segment: int
    resumed: bool
    """The segment began at a resume (rather than being the run's first timeline)."""
    whole_run: bool
    """The run is this one segment."""
    first_step: int
    last_step: int
    points: int
    """The segment's own points."""
    held: int
    """Values the closest rule could judge with: the segment's finite ones (for the rules that skip
    NaN) and the history a resumed segment continues from."""
    needed: int
    """What the closest rule needs (its history)."""

    @property
    def message(self) -> str:
        where = "" if self.whole_run else (
            f"segment resumed at step {self.first_step}: " if self.resumed else f"steps {self.first_step}-{self.last_step}, before a resume: "
        )
        count = f"{self.held} {self.metric} point{'s' if self.held != 1 else ''}"
        if self.resumed and self.held != self.points:
            count += " (with the history it resumes from)"
        elif self.held != self.points:
            count = f"{self.held} finite {self.metric} point{'s' if self.held != 1 else ''} of {self.points}"
        return f"{where}too short to judge spikes: {count}, rules need {self.needed}"

    def to_report(self, source: str) -> dict[str, object]:
        """A run's entry under `warnings` in `scan --format json` (docs/scan.md): the keys every warning
        has, then the numbers behind the message."""
        return {
            "kind": "too_short", "source": source, "line": None, "offset": None, "message": self.message,
            "metric": self.metric, "segment": self.segment, "first_step": self.first_step, "last_step": self.last_step,
            "points": self.points, "held": self.held, "needed": self.needed,
        }


@dataclass(frozen=True)
class NoLoss:
    """A run that loss rules are set for, none of whose metrics is read as the loss (a trainer that
    logs its loss in parts only: YOLO's results.csv, train/box_loss, train/cls_loss...): the rules
    judged nothing, and the report says so rather than a silent "no spike"."""

    run: str

    @property
    def message(self) -> str:
        return (
            "no loss in this run: none of its metrics is read as the loss, so the loss rules judged nothing "
            "(`lossguard read` lists its metrics; to judge one, name it in lossguard.toml: [aliases] loss = [\"<its name>\"])"
        )

    def to_report(self, source: str) -> dict[str, object]:
        """A run's entry under `warnings` in `scan --format json` (docs/scan.md)."""
        return {"kind": "no_loss", "source": source, "line": None, "offset": None, "message": self.message}


NOTICE_KINDS = ("opened", "escalated", "updated", "resolved", "relabelled", "stalled", "resumed", "noisy")


@dataclass(frozen=True)
class NoisyRun:
    """What the daemon folded of a run's loss rule, as it says it once (a `noisy` notice): the rule
    fired `firings` times in `points` loss points; `folded` of them were within the loss's own
    batch-to-batch spread, the largest `largest`x at step `largest_step`; `ceiling`: the ratio a
    firing must exceed to stand outside that noise (what a rule that fits this run must exceed)."""

    rule: str
    firings: int
    points: int
    folded: int
    largest: float
    largest_step: int
    ceiling: float

    @property
    def per_1000(self) -> float:
        return 1000.0 * self.firings / self.points if self.points else 0.0

    @property
    def message(self) -> str:
        s = "s" if self.folded != 1 else ""
        return (
            f"noisy for its rule: {self.rule} fired {self.firings} times in {self.points} loss points ({self.per_1000:.1f} per 1,000), "
            f"on the loss's own batch-to-batch spread; {self.folded} firing{s} folded into this notice, not alerted "
            f"(the largest {self.largest:.1f}x at step {self.largest_step}); what stands outside that noise (above {self.ceiling:.1f}x, "
            f"4x the usual firing, a NaN) is still alerted; a rule that fits this run flags only above {self.ceiling:.1f}x "
            f"(`lossguard scan` on its logs names the preset that keeps its incidents)"
        )

    def to_json(self) -> dict[str, object]:
        return {"rule": self.rule, "firings": self.firings, "points": self.points, "per_1000": round(self.per_1000, 2), "folded": self.folded,
                "largest": round(self.largest, 4), "largest_step": self.largest_step, "ceiling": round(self.ceiling, 4)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> NoisyRun:
        return cls(rule=str(data["rule"]), firings=int(data["firings"]), points=int(data["points"]), folded=int(data["folded"]),
                   largest=float(data["largest"]), largest_step=int(data["largest_step"]), ceiling=float(data["ceiling"]))


@dataclass(frozen=True)
class Notice:
    """One notification for the sinks: an incident's lifecycle event (opened; escalated: opened as
    the loss following a grad-norm spike already announced; updated, resolved, relabelled) or a
    run's (stalled, resumed). It carries the incident itself, so what a sink says
    is built from the same object the engine produced, not from a dict rebuilt on the way."""

    kind: str
    run: str
    incident: Incident | None = None
    source: str = ""
    """The log file(s) the incident was read from."""
    previous_cause: str | None = None
    """relabelled (and a resolution that revised the cause): the top cause said before."""
    step: int | None = None
    """stalled, resumed: the run's last step."""
    minutes: float | None = None
    """stalled: minutes without a new step."""
    spark: tuple[float, ...] = ()
    """opened, escalated: the metric around the spike, as the daemon saw it (the message's sparkline)."""
    silenced_by: str | None = None
    """unsilenced (an incident still open, or a run still stalled, as the silence that held its
    notices back ends): that silence, in words."""
    noisy: NoisyRun | None = None
    """noisy: what the daemon folds of the run's loss rule instead of alerting on each firing."""
    tail: str | None = None
    """stalled: the last line of the run's console log (raw text, escaped where shown); None: there is
    none to read, or it ends in nothing."""
    finished: bool = False
    """stalled: the log ends in a clean finish (the run ended, it did not stop)."""
    also: str | None = None
    """updated: the rank the incident was seen on too, since its alert (its ranks name it now)."""

    @property
    def severity(self) -> str | None:
        return None if self.incident is None else self.incident.severity

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run,
            "incident": None if self.incident is None else self.incident.to_json(),
            "source": self.source,
            "previous_cause": self.previous_cause,
            "step": self.step,
            "minutes": self.minutes,
            **({"silenced_by": self.silenced_by} if self.silenced_by is not None else {}),
            **({"tail": self.tail} if self.tail is not None else {}),
            **({"finished": True} if self.finished else {}),
            **({"also": self.also} if self.also is not None else {}),
            **({"spark": [v if math.isfinite(v) else None for v in self.spark]} if self.spark else {}),
            **({"noisy": self.noisy.to_json()} if self.noisy is not None else {}),
        }

    @classmethod
    def from_json(cls, kind: str, data: Mapping[str, object]) -> Notice:
        """Also reads the flat payloads of state layout 2 (the incident's fields beside `source`)."""
        if "incident" in data:
            raw = data["incident"]
            incident = None if raw is None else Incident.from_json(raw)
        else:
            incident = Incident.from_json(data) if "metric" in data else None
        step = data.get("step") if incident is None else None
        return cls(
            kind=kind, run=str(data["run"]), incident=incident, source=str(data.get("source") or ""),
            previous_cause=data.get("previous_cause"), step=None if step is None else int(step),
            minutes=None if data.get("minutes") is None else float(data["minutes"]),
            silenced_by=None if data.get("silenced_by") is None else str(data["silenced_by"]),
            tail=None if data.get("tail") is None else str(data["tail"]), finished=bool(data.get("finished", False)),
            also=None if data.get("also") is None else str(data["also"]),
            spark=tuple(math.nan if v is None else float(v) for v in data.get("spark") or ()),
            noisy=NoisyRun.from_json(data["noisy"]) if data.get("noisy") else None,
        )
