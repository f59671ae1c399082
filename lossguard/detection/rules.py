"""Spike rules: loading and checking the TOML files in rules/ (and the packaged defaults and
presets). Rules are data, checked field by field (lossguard.validate); nothing in a rules file is ever
evaluated as code. What each kind means, its parameters and how it judges a point, is its class in
lossguard.detection.kinds.

    [[rule]]
    name = "loss-spike"
    metric = "loss"
    kind = "ratio"        # a kind from lossguard.detection.kinds: its parameters follow
    factor = 2.0
    window = 9
    severity = "warning"  # info | warning | critical
    runs = "*"            # glob on the run name
    cooldown = 0          # steps after an incident during which this rule opens no new one on the run
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from .crash import CrashRule
from .kinds import RULE_KINDS, Rule
from . import run_kinds  # noqa: F401  (defining its kinds registers them)
from .presets import preset_names, preset_text
from ..tomlio import load_toml, load_toml_text
from ..validate import build


def kinds() -> dict[str, type[Rule] | type[CrashRule]]:
    """Every kind a rules file may name: the metric kinds (those defined so far: a subclass of Rule
    registers itself), and `crash` (read off a log's last lines)."""
    return {**RULE_KINDS, CrashRule.kind: CrashRule}


def rule_from(raw: object) -> Rule | CrashRule:
    """One rule from its TOML table; ValueError says what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError("each [[rule]] must be a table")
    known = kinds()
    if "kind" not in raw:
        raise ValueError(f"missing `kind`; one of: {', '.join(known)}")
    cls = known.get(raw["kind"]) if isinstance(raw["kind"], str) else None
    if cls is None:
        raise ValueError(f"unknown kind {raw['kind']!r}; one of: {', '.join(known)}")
    return build(cls, raw)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    """The rules that judge metric streams."""
    origin: str
    crashes: tuple[CrashRule, ...] = ()
    """The rules that read a run's logs for the error that ended it (kept apart: they judge no stream)."""

    @classmethod
    def of(cls, rules: Sequence[Rule | CrashRule], origin: str) -> RuleSet:
        return cls(tuple(r for r in rules if isinstance(r, Rule)), origin, tuple(r for r in rules if isinstance(r, CrashRule)))

    def for_run(self, run: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.applies_to(run))

    def crashes_for(self, run: str) -> tuple[CrashRule, ...]:
        return tuple(r for r in self.crashes if r.applies_to(run))


def parse_rules(data: dict, *, origin: str) -> tuple[Rule | CrashRule, ...]:
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
    if not rules:
        # An empty file (or one of comments, or a typo'd table name caught above) would load as no
        # rules at all: a daemon that runs for weeks and can never alert.
        raise ConfigError(f"{origin}: no rules in this file; each rule is a [[rule]] table")
    return tuple(rules)


def default_rules() -> RuleSet:
    text = resources.files("lossguard").joinpath("data/default.toml").read_text("utf-8")
    origin = "default"
    return RuleSet.of(parse_rules(load_toml_text(text, origin=origin), origin=origin), origin)


@functools.cache
def preset_rules(name: str) -> RuleSet:
    """A preset shipped inside the package, by name: package data, never a path looked up where the
    command runs (a folder named `megatron` there is the user's, not the preset)."""
    origin = f"preset {name}"
    return RuleSet.of(parse_rules(load_toml_text(preset_text(name), origin=origin), origin=origin), origin)


def load_rules(paths: Sequence[Path] | None) -> RuleSet:
    """Rules from files or folders of *.toml (a preset name such as `olmo-core` also works); the
    packaged defaults when none are given."""
    if not paths:
        return default_rules()
    rules: list[Rule | CrashRule] = []
    origins = []
    for path in paths:
        if not path.exists() and str(path) == "default":  # what the report's header calls them
            rules.extend((*default_rules().rules, *default_rules().crashes))
            origins.append("default")
            continue
        if not path.exists() and str(path) in preset_names():
            rules.extend((*preset_rules(str(path)).rules, *preset_rules(str(path)).crashes))
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
    return RuleSet.of(rules, ", ".join(origins))
