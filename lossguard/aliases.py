"""Tag -> canonical metric names. The table is data (data/aliases.toml plus the user's config), so a
user whose trainer writes `objective/ce` can teach lossguard that it is the loss without a release."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from .errors import ConfigError
from .tomlio import load_toml_text


def _builtin() -> dict[str, tuple[str, ...]]:
    text = resources.files("lossguard").joinpath("data/aliases.toml").read_text("utf-8")
    data = load_toml_text(text, origin="lossguard/data/aliases.toml")
    return {metric: tuple(tags) for metric, tags in data.items()}


@dataclass(frozen=True)
class Aliases:
    """Ordered (pattern, metric) pairs; the first pattern that matches a tag wins."""

    patterns: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def default(cls) -> Aliases:
        return cls.build({})

    @classmethod
    def build(cls, user: Mapping[str, Sequence[str]], *, origin: str = "config") -> Aliases:
        pairs: list[tuple[str, str]] = []
        for metric, tags in user.items():
            if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
                raise ConfigError(f"{origin}: [aliases] {metric} must be a list of tag names")
            pairs.extend((t.lower(), metric) for t in tags)
        for metric, tags in _builtin().items():
            pairs.extend((t.lower(), metric) for t in tags)
        return cls(tuple(pairs))

    def metric_of(self, tag: str) -> str:
        low = tag.lower()
        for pattern, metric in self.patterns:
            if pattern == low or (("*" in pattern or "?" in pattern) and fnmatch.fnmatchcase(low, pattern)):
                return metric
        return tag

    def mapping(self, tags: Sequence[str]) -> dict[str, str]:
        return {t: self.metric_of(t) for t in tags}
