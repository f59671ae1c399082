"""A loss logged in parts, summed pass by pass as `scan` sums it (detection.loss_parts).

A step's parts can arrive in different passes (a TensorBoard file holds one event per part, a read
ends at its byte limit between them), so the parts of steps not yet complete are kept between
passes, in the state beside the tails (key `part:<tag>`, committed with the pass: a kill -9 loses
or repeats none), and the next pass sums them with what it reads, pairing each part's writes of a
step as `scan` does: a step is summed once, when its last part arrives, and never from some parts
only. The summed rows join the pass's new rows as the run's loss; from there on it is a stream like
any other (tails, windows, incidents).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ..detection.loss_parts import part_tags, summed
from ..state import State, Tail
from .tails import TAIL_CAP, Tails

PART = "part:"
"""The key prefix of a part's kept rows in the state's tails."""


def _kept_rows(run: str, tag: str, tail: Tail, schema: pl.Schema) -> pl.DataFrame:
    """A part's kept rows in the shape of the pass's new rows."""
    n = tail.steps.size
    return pl.DataFrame({
        "run": [run] * n, "source": [""] * n, "step": tail.steps, "metric": [tag] * n, "tag": [tag] * n,
        "value": tail.values, "wall_time": [None] * n,
    }, schema={c: schema[c] for c in ("run", "source", "step", "metric", "tag", "value", "wall_time")}).select(schema.names())


class LossParts:
    """Per run, whether its loss is its own or its parts' sum, and the sums of each pass."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._own: set[str] = set()
        """Runs that logged a loss of their own: never summed (in memory; after a restart, a run
        with a loss tail and no parts kept is one)."""

    def summed(self, frame: pl.DataFrame, runs: Sequence[str], tails: Tails) -> tuple[pl.DataFrame, list[tuple[str, str, Tail]]]:
        """The pass's new rows with each parts run's sums added as its loss rows, and the parts'
        rows to keep (their tails) for the next pass."""
        with_loss = frame.filter(pl.col("metric") == "loss").get_column("run").unique().to_list()
        self._own.update(with_loss)
        parts = frame.filter(pl.col("metric") == pl.col("tag"))
        todo = [run for run in runs if run not in self._own]
        if not parts.height or not todo:
            return frame, []
        parts = parts.filter(pl.col("run").is_in(todo))
        by_run = parts.partition_by("run", as_dict=True, maintain_order=True) if parts.height else {}
        mine = {(run,): rows for (run,), rows in by_run.items() if part_tags(rows)}
        if not mine:
            return frame, []
        kept = self.state.tails_under([run for (run,) in mine], PART)
        added, out = [], []
        for (run,), rows in mine.items():
            before = {key[len(PART):]: tail for (r, key), tail in kept.items() if r == run}
            if not before and (run, "loss") in tails:
                self._own.add(run)  # its loss was its own before a restart
                continue
            tags = tuple(sorted(set(before) | set(part_tags(rows))))
            rows = rows.filter(pl.col("tag").is_in(tags))
            held = [_kept_rows(run, tag, before[tag], rows.schema) for tag in tags if tag in before and before[tag].steps.size]
            pending = pl.concat([*held, rows]) if held else rows
            if len(tags) > 1:
                loss, pending = summed(pending, tags)
                added.append(loss)
            counts = dict(rows.group_by("tag").len().iter_rows())
            for tag in tags:
                left = pending.filter(pl.col("tag") == tag)
                steps, values = left.get_column("step").to_numpy()[-TAIL_CAP:], left.get_column("value").to_numpy()[-TAIL_CAP:]
                seen = (before[tag].seen if tag in before else 0) + counts.get(tag, 0)
                out.append((run, PART + tag, Tail(np.ascontiguousarray(steps, np.int64), np.ascontiguousarray(values, np.float64), seen)))
        added = [a for a in added if a.height]
        return (pl.concat([frame, *added], how="vertical_relaxed") if added else frame), out

