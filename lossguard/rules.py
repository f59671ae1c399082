"""Spike rules: what to watch, how to judge a point, how loud to be. Rules are data (TOML files in
rules/), checked field by field (lossguard.validate); nothing in a rules file is ever evaluated as code.

    [[rule]]
    name = "loss-spike"
    metric = "loss"
    kind = "ratio"        # ratio | zscore | ewm | threshold | nonfinite | sustained
    factor = 2.0
    window = 9
    severity = "warning"  # info | warning | critical
    runs = "*"            # glob on the run name
    cooldown = 0          # steps after an incident during which this rule opens no new one on the run
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Union

from .errors import ConfigError
from .table import CANONICAL_METRICS
from .tomlio import load_toml, load_toml_text
from .validate import build, spec

SEVERITIES = ("info", "warning", "critical")
KINDS = ("ratio", "zscore", "ewm", "threshold", "nonfinite", "sustained")
_RULE_CLASS = dataclass(frozen=True, kw_only=True)


@_RULE_CLASS
class _Rule:
    name: str = field(metadata=spec(str, min_length=1))
    metric: str = field(metadata=spec(str))
    severity: str = field(default="warning", metadata=spec(SEVERITIES))
    runs: str = field(default="*", metadata=spec(str))
    min_history: int | None = field(default=None, metadata=spec(int, optional=True, ge=1))
    """Values the stream must hold (the judged one included) before the rule may fire."""
    cooldown: int = field(default=0, metadata=spec(int, ge=0))
    recovery: int = field(default=3, metadata=spec(int, ge=1))
    """Points back under the threshold that close an incident."""

    def _check(self) -> str | None:
        if self.metric not in CANONICAL_METRICS:
            return f"metric: unknown metric {self.metric!r}; one of: {', '.join(CANONICAL_METRICS)}"
        return None

    def applies_to(self, run: str) -> bool:
        return fnmatchcase(run, self.runs)

    @property
    def history(self) -> int:
        return self.min_history if self.min_history is not None else self.default_history()

    def default_history(self) -> int:
        return 1

    @property
    def lookback(self) -> int:
        """Finite points before the judged one that its decision can depend on."""
        return 0


@_RULE_CLASS
class RatioRule(_Rule):
    """value > factor x (mean | median | max) of the previous `window` finite values."""

    kind: str = field(default="ratio", metadata=spec(("ratio",)))
    factor: float = field(default=2.0, metadata=spec(float, gt=0))
    window: int = field(default=9, metadata=spec(int, ge=1))
    baseline: str = field(default="mean", metadata=spec(("mean", "median", "max")))

    def default_history(self) -> int:
        return self.window + 1

    @property
    def lookback(self) -> int:
        return self.window


@_RULE_CLASS
class ZScoreRule(_Rule):
    """value > mean + k x std of the previous `window` finite values."""

    kind: str = field(default="zscore", metadata=spec(("zscore",)))
    k: float = field(default=6.0, metadata=spec(float, gt=0))
    window: int = field(default=128, metadata=spec(int, ge=2))

    def default_history(self) -> int:
        return self.window + 1

    @property
    def lookback(self) -> int:
        return self.window


@_RULE_CLASS
class EwmRule(_Rule):
    """value > factor x the exponentially weighted mean of the previous finite values."""

    kind: str = field(default="ewm", metadata=spec(("ewm",)))
    factor: float = field(default=1.5, metadata=spec(float, gt=0))
    alpha: float = field(default=0.1, metadata=spec(float, gt=0, le=1))

    def default_history(self) -> int:
        return max(2, round(2 / self.alpha))

    @property
    def lookback(self) -> int:
        # Weights below 1e-4 of the newest are negligible: that many points pin the mean.
        return max(1, math.ceil(math.log(1e-4) / math.log(1 - self.alpha))) if self.alpha < 1 else 1


@_RULE_CLASS
class ThresholdRule(_Rule):
    """value above `above` (or below `below`) for `patience` consecutive points."""

    kind: str = field(default="threshold", metadata=spec(("threshold",)))
    above: float | None = field(default=None, metadata=spec(float, optional=True))
    below: float | None = field(default=None, metadata=spec(float, optional=True))
    patience: int = field(default=1, metadata=spec(int, ge=1))

    def _check(self) -> str | None:
        if (self.above is None) == (self.below is None):
            return "set exactly one of `above` or `below`"
        return super()._check()

    @property
    def lookback(self) -> int:
        return self.patience - 1


@_RULE_CLASS
class NonFiniteRule(_Rule):
    """NaN or +/-Inf in the metric: never let a NaN loss pass silently."""

    kind: str = field(default="nonfinite", metadata=spec(("nonfinite",)))
    patience: int = field(default=1, metadata=spec(int, ge=1))


@_RULE_CLASS
class SustainedRule(_Rule):
    """`patience` consecutive values above factor x the mean of the `window` values before them:
    divergence rather than a blip."""

    kind: str = field(default="sustained", metadata=spec(("sustained",)))
    factor: float = field(default=2.0, metadata=spec(float, gt=0))
    window: int = field(default=100, metadata=spec(int, ge=1))
    patience: int = field(default=4, metadata=spec(int, ge=1))

    def default_history(self) -> int:
        return self.window + self.patience

    @property
    def lookback(self) -> int:
        return self.window + self.patience - 1


Rule = Union[RatioRule, ZScoreRule, EwmRule, ThresholdRule, NonFiniteRule, SustainedRule]
_BY_KIND: dict[str, type] = {
    "ratio": RatioRule, "zscore": ZScoreRule, "ewm": EwmRule,
    "threshold": ThresholdRule, "nonfinite": NonFiniteRule, "sustained": SustainedRule,
}


def rule_from(raw: object) -> Rule:
    """One rule from its TOML table; ValueError says what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError("each [[rule]] must be a table")
    if "kind" not in raw:
        raise ValueError(f"missing `kind`; one of: {', '.join(KINDS)}")
    cls = _BY_KIND.get(raw["kind"]) if isinstance(raw["kind"], str) else None
    if cls is None:
        raise ValueError(f"unknown kind {raw['kind']!r}; one of: {', '.join(KINDS)}")
    return build(cls, raw)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    origin: str

    def for_run(self, run: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.applies_to(run))


def parse_rules(data: dict, *, origin: str) -> tuple[Rule, ...]:
    raw_rules = data.get("rule", [])
    unknown = set(data) - {"rule"}
    if unknown:
        raise ConfigError(f"{origin}: unknown top-level key(s) {', '.join(sorted(unknown))}; rules go in [[rule]] tables")
    if not isinstance(raw_rules, list):
        raise ConfigError(f"{origin}: `rule` must be an array of tables ([[rule]])")
    rules = []
    names: set[str] = set()
    for i, raw in enumerate(raw_rules):
        label = raw.get("name") if isinstance(raw, dict) and isinstance(raw.get("name"), str) else f"#{i + 1}"
        try:
            rule = rule_from(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}: rule {label!r}: {exc}") from None
        if rule.name in names:
            raise ConfigError(f"{origin}: rule {rule.name!r}: a rule of that name is already defined")
        names.add(rule.name)
        rules.append(rule)
    return tuple(rules)


def default_rules() -> RuleSet:
    text = resources.files("lossguard").joinpath("data/default.toml").read_text("utf-8")
    origin = "default"
    return RuleSet(parse_rules(load_toml_text(text, origin=origin), origin=origin), origin)


def preset_names() -> list[str]:
    folder = resources.files("lossguard").joinpath("data/presets")
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_rules(paths: Sequence[Path] | None) -> RuleSet:
    """Rules from files or folders of *.toml (a preset name such as `olmo-core` also works); the
    packaged defaults when none are given."""
    if not paths:
        return default_rules()
    rules: list[Rule] = []
    origins = []
    for path in paths:
        if not path.exists() and str(path) in preset_names():
            text = resources.files("lossguard").joinpath(f"data/presets/{path}.toml").read_text("utf-8")
            rules.extend(parse_rules(load_toml_text(text, origin=f"preset {path}"), origin=f"preset {path}"))
            origins.append(f"preset {path}")
            continue
        files = sorted(path.glob("*.toml")) if path.is_dir() else [path]
        if path.is_dir() and not files:
            raise ConfigError(f"{path}: no *.toml rules files in this folder")
        for file in files:
            rules.extend(parse_rules(load_toml(file), origin=str(file)))
            origins.append(str(file))
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise ConfigError(f"rule {rule.name!r} is defined twice across {', '.join(origins)}")
        seen.add(rule.name)
    return RuleSet(tuple(rules), ", ".join(origins))
