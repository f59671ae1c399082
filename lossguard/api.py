"""The notebook API: `lossguard.read`, `lossguard.scan` and `lossguard.detect`, the library calls the
CLI makes, with the arguments a notebook has at hand (a path as a string, a preset's name) and the
results a notebook shows (polars DataFrames, the JSON report's fields as attributes).

Bad input is what it is in the CLI: a file that cannot be read is a warning (a `LossguardWarning`,
one per problem, naming the file), not an exception; a path that does not exist or a bad rules file
is a `LossguardError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import polars as pl

from .errors import UsageError
from .detection.rules import RuleSet, load_rules

Paths = str | PathLike | Iterable[str | PathLike]
Rules = RuleSet | str | PathLike | Iterable[str | PathLike] | None


class LossguardWarning(UserWarning):
    """A file that could not be read, or read only in part (what `scan` prints as a warning)."""


def _paths(paths: Paths, *, urls: bool = False) -> list[Path | str]:
    """Paths as given; with `urls`, an object store's URL (s3://bucket/prefix) kept as one."""
    from .ingest.sources.object_store import root

    given = [paths] if isinstance(paths, (str, PathLike)) else list(paths)
    out = [root(p) if urls else Path(p) for p in given]
    missing = [str(p) for p in out if isinstance(p, Path) and not p.exists()]
    if missing:
        raise UsageError(f"no such file or folder: {', '.join(missing)}")
    return out


def _rules(rules: Rules) -> RuleSet:
    if isinstance(rules, RuleSet):
        return rules
    if rules is None:
        return load_rules(None)
    given = [rules] if isinstance(rules, (str, PathLike)) else list(rules)
    return load_rules([Path(r) for r in given])


def _warn(problems: Iterable[object]) -> None:
    for problem in problems:
        warnings.warn(str(problem), LossguardWarning, stacklevel=3)


def read(paths: Paths, *, log_format: str | None = None) -> pl.DataFrame:
    """Every log under `paths` (a file or folder, or several) as lossguard's canonical long table:
    one row per (run, source, step, metric, tag, value, wall_time), `metric` the canonical name
    (loss, lr, grad_norm, loss_scale, eval_loss...) or the tag itself. `log_format` forces a format
    (`lossguard read --help` lists them)."""
    from .ingest.config import read_options
    from .ingest.reader import read_paths

    options = read_options(None, fmt=log_format)
    if log_format is not None:
        options.reader(log_format)  # an unknown name is a UsageError before anything is read
    frame, _, problems = read_paths(_paths(paths), options)
    _warn(problems)
    return frame


@dataclass(frozen=True)
class Report:
    """What `lossguard scan --format json` writes, as attributes (the same names and values), with
    the spikes also as a DataFrame."""

    lossguard_version: str
    rules: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    warnings: list[dict[str, Any]]
    summary: dict[str, Any]
    result: Any = field(default=None, repr=False, compare=False)
    """The library's ScanResult behind it (incidents as objects, the curves the HTML report draws)."""

    def spikes(self) -> pl.DataFrame:
        """One row per spike of every run (the JSON report's spike fields and the top cause)."""
        return _spike_frame(s for run in self.runs for s in run["spikes"])

    def to_json(self) -> str:
        from .report.scan_report import to_json

        return to_json(self.result)


def scan(paths: Paths, *, rules: Rules = None, run: str | None = None) -> Report:
    """The audit `lossguard scan` makes: every run under `paths` (folders, files, or object store
    URLs such as s3://bucket/prefix), judged by `rules` (None: the defaults; a preset name such as
    "olmo-core", a rules file or folder, or several), only the runs whose name matches the glob
    `run` if given."""
    from .report.audit import scan as audit
    from .ingest.config import read_options
    from .report.scan_report import document

    result = audit(_paths(paths, urls=True), rules=_rules(rules), options=read_options(None), run_glob=run, jobs=1)
    _warn(result.all_problems)
    return Report(**document(result), result=result)


def detect(frame: pl.DataFrame, *, rules: Rules = None) -> pl.DataFrame:
    """The spikes in a canonical table (`read`'s, or one you built with its columns; `run` and
    `source` may be left out), judged per run with `rules`, labelled with their likely causes."""
    from .detection.engine import analyse_run

    needed = {"step", "metric", "value"}
    if not needed <= set(frame.columns):
        raise UsageError(f"detect needs the columns {', '.join(sorted(needed))} (lossguard.read's table); this frame has {', '.join(frame.columns)}")
    filled = frame.with_columns(
        *(pl.lit(default).alias(name) for name, default in (("run", "."), ("source", ""), ("wall_time", None)) if name not in frame.columns),
        *([pl.col("metric").alias("tag")] if "tag" not in frame.columns else []),
    )
    ruleset = _rules(rules)
    spikes = []
    for (run,), part in filled.partition_by("run", as_dict=True, maintain_order=True).items():
        spikes += [i.to_report() for i in analyse_run(part, ruleset, run=str(run)).incidents]
    return _spike_frame(spikes)


SPIKE_SCHEMA = {
    "run": pl.String(), "metric": pl.String(), "rule": pl.String(), "severity": pl.String(), "step": pl.Int64(),
    "peak_step": pl.Int64(), "end_step": pl.Int64(), "value": pl.Float64(), "baseline": pl.Float64(), "ratio": pl.Float64(),
    "cause": pl.String(), "confidence": pl.Float64(), "evidence": pl.String(),
}


def _spike_frame(spikes: Iterable[dict[str, Any]]) -> pl.DataFrame:
    def number(x: Any) -> float | None:
        return None if x is None else float(x)  # (non-finite values come as "NaN", "Infinity")

    rows = []
    for s in spikes:
        top = s["causes"][0] if s["causes"] else {}
        rows.append({
            "run": s["run"], "metric": s["metric"], "rule": s["rule"], "severity": s["severity"], "step": s["step"],
            "peak_step": s["peak_step"], "end_step": s["end_step"], "value": number(s["value"]), "baseline": number(s["baseline"]),
            "ratio": number(s["ratio"]), "cause": top.get("cause"), "confidence": top.get("confidence"), "evidence": top.get("evidence"),
        })
    return pl.DataFrame(rows, schema=SPIKE_SCHEMA)
