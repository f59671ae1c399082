"""A loss logged in parts, summed pass by pass as `scan` sums it (detection.loss_parts).

A run's parts are kept between passes in the state beside the tails (key `part:<tag>`, committed
with the pass: a kill -9 loses or repeats none) until the run has shown SETTLE complete steps of
them and no loss of its own: only then is its loss their sum (scan, which sees the whole run, sums
only a run that never logs a loss). From there on a step is summed once, when its last part
arrives, pairing each part's writes of a step as `scan` does, and never from some parts only; the
sums join the pass's new rows as the run's loss, a stream like any other (tails, windows, incidents).

A run whose own loss shows up once its sum is judged (a loss first logged late) is judged on its
own loss from there, on a timeline of its own (`switched`): the sum's history is no history of it.
Where a run stands is told after a restart by what the state keeps: part tails and no loss tail,
still waiting; part tails and a loss tail, summed; a loss tail and no part tails, its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..detection.loss_parts import SETTLE, part_tags, summed
from ..ingest.vocabulary import PARTS_SEPARATOR
from ..state import State, Tail
from .tails import TAIL_CAP, Tails

PART = "part:"
"""The key prefix of a part's kept rows in the state's tails."""
LONE_CAP = 20 * SETTLE
"""The rows kept of a run's one loss-like tag while no other shows up (a run with no loss and one
`aux_loss`, which nothing judges): its latest, not the whole run rewritten at every pass."""


def _kept_rows(run: str, tag: str, tail: Tail, schema: pl.Schema) -> pl.DataFrame:
    """A part's kept rows in the shape of the pass's new rows."""
    n = tail.steps.size
    return pl.DataFrame({
        "run": [run] * n, "source": [""] * n, "step": tail.steps, "metric": [tag] * n, "tag": [tag] * n,
        "value": tail.values, "wall_time": [None] * n,
    }, schema={c: schema[c] for c in ("run", "source", "step", "metric", "tag", "value", "wall_time")}).select(schema.names())


@dataclass
class Summed:
    """What a pass's parts gave: its rows with the sums added, the part tails to write or drop, and
    the runs whose own loss replaces a sum judged before (a new timeline for their loss)."""

    frame: pl.DataFrame
    put: list[tuple[str, str, Tail]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    switched: list[str] = field(default_factory=list)


class LossParts:
    """Per run, whether its loss is its own or its parts' sum, and the sums of each pass."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._own: set[str] = set()
        """Runs judged on a loss of their own: never summed (in memory; after a restart, a run with
        a loss tail and no parts kept is one)."""

    def summed(self, frame: pl.DataFrame, runs: Sequence[str], tails: Tails) -> Summed:
        """The pass's new rows with each parts run's sums added as its loss rows, and the parts'
        rows to keep (their tails) for the next pass."""
        own_loss = frame.filter((pl.col("metric") == "loss") & ~pl.col("tag").cast(pl.String).str.contains(PARTS_SEPARATOR, literal=True))
        with_loss = set(own_loss.get_column("run").unique().to_list())
        parts = frame.filter(pl.col("metric") == pl.col("tag"))
        todo = [run for run in runs if run not in self._own]
        out = Summed(frame)
        if not todo:
            self._own.update(with_loss)
            return out
        kept = self.state.tails_under(todo, PART)
        keeping = {r for (r, _) in kept}
        # Judged on a loss of its own before a restart: a loss tail and no parts kept.
        self._own.update(r for r in todo if r not in keeping and (r, "loss") in tails)
        for run in [r for r in todo if r in with_loss]:
            # Its own loss: parts kept for it are dropped, and a sum judged before gives way.
            mine = [key for (r, key) in kept if r == run]
            out.dropped += [(run, key) for key in mine]
            if mine and (run, "loss") in tails:
                out.switched.append(run)
        self._own.update(with_loss)
        todo = [run for run in todo if run not in with_loss]
        parts = parts.filter(pl.col("run").is_in(todo)) if parts.height and todo else parts.clear()
        by_run = parts.partition_by("run", as_dict=True, maintain_order=True) if parts.height else {}
        added = []
        for (run,), rows in by_run.items():
            if run in self._own:
                continue
            before = {key[len(PART):]: tail for (r, key), tail in kept.items() if r == run}
            settled = bool(before) and (run, "loss") in tails
            tags = tuple(sorted(before)) if settled else tuple(sorted(set(before) | set(part_tags(rows))))
            if not tags:
                continue
            rows = rows.filter(pl.col("tag").is_in(tags))
            held = [_kept_rows(run, tag, before[tag], rows.schema) for tag in tags if tag in before and before[tag].steps.size]
            pending = pl.concat([*held, rows]) if held else rows
            if not settled and len(tags) > 1:
                # Parts as often logged as each other, among all those kept so far.
                tags = part_tags(pending)
                pending = pending.filter(pl.col("tag").is_in(tags))
            if len(tags) > 1:
                loss, left = summed(pending, tags)
                if settled or loss.height >= SETTLE:
                    added.append(loss)
                    pending = left
            counts = dict(rows.group_by("tag").len().iter_rows())
            # One part alone is no loss yet: only what a second part's first steps would pair with is kept.
            cap = TAIL_CAP if len(tags) > 1 else LONE_CAP
            for tag in tags:
                left_rows = pending.filter(pl.col("tag") == tag)
                steps, values = left_rows.get_column("step").to_numpy()[-cap:], left_rows.get_column("value").to_numpy()[-cap:]
                seen = (before[tag].seen if tag in before else 0) + counts.get(tag, 0)
                out.put.append((run, PART + tag, Tail(np.ascontiguousarray(steps, np.int64), np.ascontiguousarray(values, np.float64), seen)))
            out.dropped += [(run, PART + tag) for tag in before if tag not in tags]
        added = [a for a in added if a.height]
        if added:
            out.frame = pl.concat([frame, *added], how="vertical_relaxed")
        return out
