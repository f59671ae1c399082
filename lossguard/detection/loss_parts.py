"""A loss logged in parts only, judged as their sum.

YOLO's results.csv logs `train/box_loss`, `train/cls_loss` and `train/dfl_loss` and no total;
DeepSpeed-Chat's RLHF step logs `act_loss` and `cri_loss`. Where a run holds no stream read as the
loss but two or more training loss parts (vocabulary.is_loss_part) logged about as often as each
other, and they make SETTLE sums or more, its loss is their sum, read as any loss is, under the tag
`a + b + c` (what the report's metrics line names), ranked below every tag that names a loss itself
(vocabulary.RANK_PARTS): a run whose own loss the daemon reads late is judged on that loss.

A run that logs its parts beside a loss of its own (a VAE's `recon_loss` and `kl_loss`, an MoE's
`aux_loss`) is never summed by `scan`, which sees the whole run; the daemon, which sees a run as it
grows, waits for SETTLE complete steps of parts with no loss before it judges a sum, so that a
loss written a little after its parts (TensorBoard writes an event a metric) is read first.

The sum is made on the rows, before the streams are: so `scan` (a whole run) and the daemon (a
pass's new rows after the parts it kept from earlier passes) build one stream, and every rule, tail
and resume works on it as on a logged loss. A step's sum is made once every part has a value at it,
pairing each part's k-th write of that step (a resume that writes the step again gives a second
sum, after the first); a step some part never wrote is no point, and a part's NaN or Inf makes the
sum non-finite, which the rules that catch those see. Pure: frames in, frames out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ..ingest.vocabulary import PARTS_SEPARATOR, is_loss_part

SEPARATOR = PARTS_SEPARATOR
SETTLE = 10
"""Steps with every part written and no loss of the run's own before parts are taken for its loss:
the seed rule's window and one, so a run judged on its sum has its first judgeable point, and a
run's own loss, logged with its parts or a few steps after them, is read before any sum is judged."""
SIMILAR = 2
"""Parts are the loss-like tags logged at least 1/SIMILAR as often as the most logged one: a sum
over a part written every 100 steps would have a point only there."""


def part_tags(frame: pl.DataFrame) -> tuple[str, ...]:
    """The loss parts among the frame's tags (no alias mapped them: their metric is their tag),
    logged about as often as each other (SIMILAR), in name order (the daemon, which meets them pass
    by pass, names the sum as `scan` does)."""
    # (Distinct pairs first: a scan's table holds names as Categorical, and tens of millions of rows.)
    counts = frame.group_by("metric", "tag").len().select(pl.col("metric").cast(pl.String), pl.col("tag").cast(pl.String), "len")
    found = {t: n for m, t, n in counts.iter_rows() if m == t and is_loss_part(t)}
    most = max(found.values(), default=0)
    return tuple(sorted(t for t, n in found.items() if n * SIMILAR >= most))


def has_loss(frame: pl.DataFrame) -> bool:
    return bool((frame.get_column("metric") == "loss").any())


def name_of(tags: Sequence[str]) -> str:
    """The tag the summed loss is read from: `train/box_loss + train/cls_loss + train/dfl_loss`."""
    return SEPARATOR.join(tags)


def summed(rows: pl.DataFrame, tags: Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(loss rows, rows left over) of one run's part rows (`tags` only, in the order written): a
    loss row where each of the tags has a value at a step, in the order the last of them was
    written, its other columns those of that last part; the rows of steps some part has not reached
    yet are left over (the daemon keeps them for its next pass, and pairs them as `scan` does)."""
    at = rows.with_row_index("_at").with_columns(pl.Series("_occ", _writes_before(rows), dtype=pl.Int64()))
    groups = at.group_by("step", "_occ").agg(pl.len().alias("_n"), pl.col("_at").max().alias("_done"), pl.col("value").sum().alias("_sum"))
    done = groups.filter(pl.col("_n") == len(tags)).sort("_done")
    metric_type, tag_type = rows.schema["metric"], rows.schema["tag"]
    loss = at[done.get_column("_done")].with_columns(
        pl.lit("loss").cast(metric_type).alias("metric"),
        pl.lit(name_of(tags)).cast(tag_type).alias("tag"),
        done.get_column("_sum").alias("value"),
    ).select(rows.columns)
    left = at.join(groups.filter(pl.col("_n") < len(tags)).select("step", "_occ"), on=["step", "_occ"], how="semi", maintain_order="left")
    return loss, left.select(rows.columns)


def _writes_before(rows: pl.DataFrame) -> np.ndarray:
    """Each row's count of earlier rows of its tag at its step (0 but where a resume wrote a step
    again): numpy sorts, where a polars window over (tag, step) costs ~1 s a million rows."""
    tag = rows.get_column("tag")
    codes = (tag if tag.dtype == pl.Categorical() else tag.cast(pl.Categorical())).to_physical().to_numpy()
    steps = rows.get_column("step").to_numpy()
    order = np.lexsort((steps, codes))  # stable: the order written, within each (tag, step)
    c, s = codes[order], steps[order]
    first = np.r_[True, (c[1:] != c[:-1]) | (s[1:] != s[:-1])]
    index = np.arange(order.size)
    nth = index - np.maximum.accumulate(np.where(first, index, 0))
    out = np.empty(order.size, np.int64)
    out[order] = nth
    return out


def with_summed_loss(frame: pl.DataFrame) -> pl.DataFrame:
    """One run's whole table (`scan`, `lossguard read`'s metrics line) with its parts' sum as its
    loss rows, where it has no loss of its own and two or more parts making SETTLE sums or more;
    otherwise as it was."""
    if not frame.height or has_loss(frame):
        return frame
    tags = part_tags(frame)
    if len(tags) < 2:
        return frame
    loss, _ = summed(frame.filter(pl.col("tag").cast(pl.String).is_in(tags)), tags)
    return pl.concat([frame, loss], how="vertical_relaxed") if loss.height >= SETTLE else frame
