"""What a caller will use of a read (projection): the canonical metrics and the raw tags it looks at.

`scan` judges five metrics and reads three tags as they are, out of the dozens a log may hold; a
reader told so builds rows only for the tags that can matter. Which tags those are is decided per
tag through the aliases (the user's, then the vocabulary), the same mapping the table's `metric`
column is made with, so every tag that could carry a needed metric is kept, whatever its rank: the
stream still picks the best one (`streams.by_metric`). `lossguard read` and `lossguard.read()` ask
for no projection and get every row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .aliases import Aliases
from .vocabulary import is_loss_part


@dataclass(frozen=True)
class Needs:
    metrics: frozenset[str]
    """Canonical metrics: a tag is kept if it means one of them."""
    tags: frozenset[str] = frozenset()
    """Tags kept as they are, whatever they mean."""
    loss_parts: bool = False
    """Keep the parts of a loss logged only in parts (vocabulary.is_loss_part), when no alias maps
    them: the loss is their sum where a run has no loss of its own."""

    def keeper(self, aliases: Aliases) -> Callable[[str], bool]:
        """tag -> is it needed; decided once per distinct tag (a read asks about a handful of names
        over millions of rows)."""
        decided: dict[str, bool] = {}

        def keep(tag: str) -> bool:
            found = decided.get(tag)
            if found is None:
                metric = aliases.metric_of(tag)
                found = decided[tag] = tag in self.tags or metric in self.metrics or (self.loss_parts and metric == tag and is_loss_part(tag))
            return found

        return keep
