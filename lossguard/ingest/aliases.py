"""Tag -> canonical metric: the user's [aliases] first, then the built-in vocabulary (`vocabulary`).

The user's table stays data, so a trainer that writes `objective/ce` can be taught without a release;
the built-in recognition reads a tag's words instead of listing whole tags (see `vocabulary`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from .vocabulary import RANK_USER, Match, recognise


@dataclass(frozen=True)
class Aliases:
    """The user's (pattern, metric) pairs, tried in order before the vocabulary; case-insensitive,
    `*` and `?` wildcards."""

    patterns: tuple[tuple[str, str], ...] = ()

    @classmethod
    def default(cls) -> Aliases:
        return cls()

    @classmethod
    def build(cls, user: Mapping[str, Sequence[str]], *, origin: str = "config") -> Aliases:
        pairs: list[tuple[str, str]] = []
        for metric, tags in user.items():
            if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
                raise ConfigError(f"{origin}: [aliases] {metric} must be a list of tag names (got {tags!r:.40})")
            pairs.extend((t.lower(), metric) for t in tags)
        return cls(tuple(pairs))

    def match(self, tag: str) -> Match | None:
        low = tag.lower()
        for pattern, metric in self.patterns:
            if pattern == low or (("*" in pattern or "?" in pattern) and fnmatch.fnmatchcase(low, pattern)):
                return Match(metric, RANK_USER)
        return recognise(tag)

    def metric_of(self, tag: str) -> str:
        """The metric `tag` means on its own."""
        found = self.match(tag)
        return found.metric if found else tag

    def mapping(self, tags: Sequence[str]) -> dict[str, str]:
        """Each tag -> the metric it means, on its own: the same whatever other tags the read holds,
        so a log read in pieces (the daemon) gets the table one read gets. Where several tags of a
        run mean one metric, the stream takes the best ranked (`streams.preferred`: user alias,
        canonical name, other spelling, test set, epoch aggregate), so an epoch mean is never
        spliced into the per-step curve."""
        return {t: self.metric_of(t) for t in tags}
