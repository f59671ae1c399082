"""One analysis, shared by `scan` (a whole run at once) and `watch` (the daemon): streams from the
canonical table, incidents from the rules, causes from the context."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .causes import RunContext, Series, label_all
from .detect import detect_all
from .model import Incident
from .rules import RuleSet
from .streams import as_context, by_metric

JUDGED = ("loss", "eval_loss", "lr", "grad_norm", "loss_scale")


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


def _tag_series(run_frame: pl.DataFrame, tag: str) -> Series | None:
    rows = run_frame.filter(pl.col("tag") == tag).select("step", "value")
    if not rows.height:
        return None
    return Series.of(rows.unique(subset=["step"], keep="last", maintain_order=True).sort("step"))


def run_context(run_frame: pl.DataFrame, streams: dict[str, pl.DataFrame], incidents: tuple[Incident, ...] = ()) -> RunContext:
    return RunContext(
        loss=Series.of(as_context(streams["loss"])),
        lr=Series.of(as_context(streams["lr"])),
        grad_norm=Series.of(as_context(streams["grad_norm"])),
        loss_scale=Series.of(as_context(streams["loss_scale"])),
        overflow=_tag_series(run_frame, "OVERFLOW loss scale"),
        skipped=_tag_series(run_frame, "number of skipped iterations"),
        nan_iterations=_tag_series(run_frame, "number of nan iterations"),
        incidents=incidents,
    )


def analyse_run(run_frame: pl.DataFrame, rules: RuleSet, *, run: str) -> RunAnalysis:
    return analyse_streams(run_frame, rules, run=run)[0]


def analyse_streams(run_frame: pl.DataFrame, rules: RuleSet, *, run: str) -> tuple[RunAnalysis, dict[str, pl.DataFrame]]:
    """The analysis, and the streams it was made from (the scan plots them)."""
    active = rules.for_run(run)
    streams = by_metric(run_frame, JUDGED)
    incidents = tuple(detect_all(streams, active, run=run))
    labelled = tuple(label_all(incidents, run_context(run_frame, streams, incidents)))
    loss = streams["loss"]
    counts = (
        run_frame.select("metric", "tag").filter(pl.col("metric").is_in(list(JUDGED)))
        .group_by("metric", "tag", maintain_order=True).len()
        .sort("len", descending=True, maintain_order=True)
    )
    metrics = {}
    for metric, tag, _ in counts.iter_rows():
        metrics.setdefault(metric, tag)
    metrics = {m: metrics[m] for m in JUDGED if m in metrics}
    steps = run_frame.get_column("step")
    analysis = RunAnalysis(
        run=run,
        metrics=metrics,
        steps=loss.height,
        first_step=None if not steps.len() else int(steps.min()),
        last_step=None if not steps.len() else int(steps.max()),
        incidents=labelled,
    )
    return analysis, streams


def analyse(frame: pl.DataFrame, rules: RuleSet) -> list[RunAnalysis]:
    out = []
    for (run,), part in frame.partition_by("run", as_dict=True, maintain_order=True).items():
        out.append(analyse_run(part, rules, run=run))
    return sorted(out, key=lambda a: a.run)
