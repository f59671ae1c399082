"""Backtesting: what two rule sets flag differently on the same history, and how often each would
have alerted, so rules can be tuned before the daemon pages anyone."""

from __future__ import annotations

from dataclasses import dataclass

from ..display import table_lines
from ..escaping import printable
from ..model import Incident
from .audit import ScanResult


def _span(inc: Incident) -> tuple[int, int]:
    end = inc.end_step if inc.end_step is not None else max(inc.peak_step, inc.last_flagged_step or inc.step)
    return inc.step, max(end, inc.step)


def _overlaps(a: Incident, others: list[Incident]) -> bool:
    a0, a1 = _span(a)
    return any(b0 <= a1 and a0 <= b1 for b0, b1 in map(_span, others))


@dataclass(frozen=True)
class RunComparison:
    run: str
    steps: int
    """The span of steps the run covers (alerts per 10k steps are per 10k of these)."""
    points: int
    """Loss values logged in it."""
    a: tuple[Incident, ...]
    b: tuple[Incident, ...]
    only_a: tuple[Incident, ...]
    only_b: tuple[Incident, ...]

    def rate(self, incidents: tuple[Incident, ...]) -> float:
        return 0.0 if self.steps <= 0 else len(incidents) / self.steps * 10_000


def compare(a: ScanResult, b: ScanResult) -> list[RunComparison]:
    runs_b = {r.run: r for r in b.runs}
    out = []
    for ra in a.runs:
        rb = runs_b.get(ra.run)
        ib = list(rb.incidents) if rb else []
        ia = list(ra.incidents)
        out.append(
            RunComparison(
                run=ra.run,
                steps=0 if ra.analysis.first_step is None else ra.analysis.last_step - ra.analysis.first_step + 1,
                points=ra.analysis.steps,
                a=tuple(ia),
                b=tuple(ib),
                only_a=tuple(i for i in ia if not _overlaps(i, ib)),
                only_b=tuple(i for i in ib if not _overlaps(i, ia)),
            )
        )
    return out


def to_text(rows: list[RunComparison], name_a: str, name_b: str) -> str:
    lines = [f"A = {printable(name_a)}", f"B = {printable(name_b)}", ""]
    header = ["RUN", "STEPS", "POINTS", "A", "B", "A/10k", "B/10k", "ONLY A (steps)", "ONLY B (steps)"]
    table = [
        [printable(r.run), str(r.steps), str(r.points), str(len(r.a)), str(len(r.b)), f"{r.rate(r.a):.2f}", f"{r.rate(r.b):.2f}",
         ",".join(str(i.step) for i in r.only_a) or "-", ",".join(str(i.step) for i in r.only_b) or "-"]
        for r in rows
    ]
    lines.extend(table_lines(table, header))
    total_steps = sum(r.steps for r in rows)
    ta, tb = sum(len(r.a) for r in rows), sum(len(r.b) for r in rows)
    if total_steps:
        lines += ["", f"alerts per 10k steps over all runs: A {ta / total_steps * 1e4:.2f}, B {tb / total_steps * 1e4:.2f}"]
    return "\n".join(lines) + "\n"


def to_json(rows: list[RunComparison], name_a: str, name_b: str) -> dict[str, object]:
    return {
        "a": name_a,
        "b": name_b,
        "runs": [
            {
                "run": r.run,
                "steps": r.steps,
                "points": r.points,
                "a": len(r.a),
                "b": len(r.b),
                "a_per_10k_steps": round(r.rate(r.a), 4),
                "b_per_10k_steps": round(r.rate(r.b), 4),
                "only_a": [i.to_report() for i in r.only_a],
                "only_b": [i.to_report() for i in r.only_b],
            }
            for r in rows
        ],
    }
