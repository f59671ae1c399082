"""Spike rules: what to watch, how to judge a point, how loud to be. Rules are data (TOML files in
rules/), validated with pydantic; nothing in a rules file is ever evaluated as code.

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

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .table import CANONICAL_METRICS
from .tomlio import load_toml, load_toml_text

Severity = Literal["info", "warning", "critical"]
KINDS = ("ratio", "zscore", "ewm", "threshold", "nonfinite", "sustained")


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    metric: str
    severity: Severity = "warning"
    runs: str = "*"
    min_history: int | None = Field(default=None, ge=1)
    """Values the stream must hold (the judged one included) before the rule may fire."""
    cooldown: int = Field(default=0, ge=0)
    recovery: int = Field(default=3, ge=1)
    """Points back under the threshold that close an incident."""

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in CANONICAL_METRICS:
            raise ValueError(f"unknown metric {value!r}; one of: {', '.join(CANONICAL_METRICS)}")
        return value

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


class RatioRule(_Rule):
    """value > factor x (mean | median | max) of the previous `window` finite values."""

    kind: Literal["ratio"]
    factor: float = Field(default=2.0, gt=0)
    window: int = Field(default=9, ge=1)
    baseline: Literal["mean", "median", "max"] = "mean"

    def default_history(self) -> int:
        return self.window + 1

    @property
    def lookback(self) -> int:
        return self.window


class ZScoreRule(_Rule):
    """value > mean + k x std of the previous `window` finite values."""

    kind: Literal["zscore"]
    k: float = Field(default=6.0, gt=0)
    window: int = Field(default=128, ge=2)

    def default_history(self) -> int:
        return self.window + 1

    @property
    def lookback(self) -> int:
        return self.window


class EwmRule(_Rule):
    """value > factor x the exponentially weighted mean of the previous finite values."""

    kind: Literal["ewm"]
    factor: float = Field(default=1.5, gt=0)
    alpha: float = Field(default=0.1, gt=0, le=1)

    def default_history(self) -> int:
        return max(2, round(2 / self.alpha))

    @property
    def lookback(self) -> int:
        # Weights below 1e-4 of the newest are negligible: that many points pin the mean.
        import math

        return max(1, math.ceil(math.log(1e-4) / math.log(1 - self.alpha))) if self.alpha < 1 else 1


class ThresholdRule(_Rule):
    """value above `above` (or below `below`) for `patience` consecutive points."""

    kind: Literal["threshold"]
    above: float | None = None
    below: float | None = None
    patience: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _one_bound(self) -> ThresholdRule:
        if (self.above is None) == (self.below is None):
            raise ValueError("set exactly one of `above` or `below`")
        return self

    @property
    def lookback(self) -> int:
        return self.patience - 1


class NonFiniteRule(_Rule):
    """NaN or +/-Inf in the metric: never let a NaN loss pass silently."""

    kind: Literal["nonfinite"]
    patience: int = Field(default=1, ge=1)


class SustainedRule(_Rule):
    """`patience` consecutive values above factor x the mean of the `window` values before them:
    divergence rather than a blip."""

    kind: Literal["sustained"]
    factor: float = Field(default=2.0, gt=0)
    window: int = Field(default=100, ge=1)
    patience: int = Field(default=4, ge=1)

    def default_history(self) -> int:
        return self.window + self.patience

    @property
    def lookback(self) -> int:
        return self.window + self.patience - 1


Rule = Annotated[
    Union[RatioRule, ZScoreRule, EwmRule, ThresholdRule, NonFiniteRule, SustainedRule], Field(discriminator="kind")
]
_RULE = TypeAdapter(Rule)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    origin: str

    def for_run(self, run: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.applies_to(run))


def _message(err: dict) -> str:
    loc = [str(p) for p in err["loc"] if str(p) not in KINDS]
    field = ".".join(loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "union_tag_invalid":
        return f"unknown kind {err['input'].get('kind')!r}; one of: {', '.join(KINDS)}" if isinstance(err["input"], dict) else msg
    if err["type"] == "union_tag_not_found":
        return f"missing `kind`; one of: {', '.join(KINDS)}"
    if err["type"] == "extra_forbidden":
        return f"unknown field `{field}`"
    got = err.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{field}: {msg}{shown}" if field else msg


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
            rule = _RULE.validate_python(raw)
        except ValidationError as exc:
            reasons = "; ".join(_message(e) for e in exc.errors())
            raise ConfigError(f"{origin}: rule {label!r}: {reasons}") from None
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
