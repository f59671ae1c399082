"""Where a reader stopped in a file, and the little parsing state it needs to go on from there.

A cursor only ever points just past complete data (a whole line, a whole event record), so a reader
called again on a grown file continues exactly where the previous call stopped, and reading a file in
one go or in many pieces gives the same rows. It serialises to JSON for the daemon's state store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Cursor:
    offset: int = 0
    """Bytes consumed: the next read starts here."""
    line: int = 0
    """Lines consumed (text formats), for messages that name a line."""
    index: int = 0
    """Records numbered so far (formats without steps) or entries consumed (whole-document formats)."""
    last_step: int | None = None
    """The last step a record carried, for records that carry none (DeepSpeed OVERFLOW lines...)."""
    header: str | None = None
    """A CSV file's header line, which later chunks of the file do not repeat."""
    skipping: bool = False
    """Inside an over-long line that is being discarded up to its newline."""
    block: str | None = None
    """For a format of a header line and the metric lines under it (OLMo-core's console): the tag
    prefix of the block open where the cursor stopped ("" for a training step's), None if none is."""
    steps: str | None = None
    """Where a format that has several ways to find a step took this file's from, once it had to
    choose (`epoch`, `numbered`...): a later block goes on the same way, and a fallback is said once."""
    bar: int | None = None
    """The count a training progress bar showed (`2564/4920`) since the last HF console dict, if any
    (formats/progress_bars: the last count of the Keras bar drawn last)."""
    bar_total: int | None = None
    """The training progress bar's total (`4920`): bars of other totals are evaluation's."""
    per_epoch: float | None = None
    """Optimizer steps per epoch as the trainer's banner stated it, for HF console dicts."""
    anchor: int | None = None
    """The step of the last HF console dict a progress bar's count placed."""
    since: int = 0
    """HF console training dicts read since that one (spread by `interval` after it)."""
    interval: float | None = None
    """Steps between two HF console dicts (the logging interval), as the last two bar readings and
    the dicts between them imply."""
    refresh: bool = False
    """The last HF console dict was placed by no bar: the next bar drawn is tqdm.write's refresh."""
    by_bar: int = 0
    """HF console training dicts placed at a bar's count (`read` says how the steps were placed)."""
    by_interval: int = 0
    """... at the interval after the last bar-placed dict."""
    by_epoch: int = 0
    """... at epoch x the steps per epoch."""
    by_last: int = 0
    """... at the step before them (nothing else to go by)."""
    mark: str | None = None
    """A database's last row read (sources.sqlite_db: `index` is its key), as a digest of what it
    holds: a row that no longer holds it means the keys were renumbered (VACUUM) or the database
    replaced in place, and the database is read again from its start. For a trainer_state.json, the
    last log_history entry read: a later checkpoint goes on from that entry only if it holds it."""
    behind: str | None = None
    """The last bytes before `offset` (hex; text files, read by sources.textfile): a file whose bytes
    there changed was written again from its start in place (a new run's logger in the same folder:
    the same inode, the same first lines), not appended to, and is read again from its start."""
    pace: str | None = None
    """For a metric of MLflow's file store logged without a step: the metric whose steps its rows go
    at (formats/mlruns_pace; "" for none), once its third row decided it."""
    epoch: int | None = None
    """The epoch a progress bar's header line named (Keras' `Epoch 3/10`), for the bar after it;
    once that bar is drawn, minus that epoch: a bar with no header before it is another loop's
    (formats/progress_bars)."""
    drawn: str | None = None
    """What progress bars drew before (JSON; formats/progress_bars): a tqdm bar's last values and
    state, the metrics seen logged by a batch, the epochs' lengths of a bar of unknown length, the
    offset of a NeMo step to the count, Keras' last state read."""
    name: str | None = None
    """The run a file names for its rows, as a record read before said (a W&B log's RunRecord, at
    its head), for reads that start past that record."""
    scanned: int | None = None
    """A W&B log's record cut into chunks whose LAST chunk has not come yet (it starts at `offset`):
    where its next chunk starts, its chunks before that checked (sources/wandb_log.scan_pending)."""
    zeros: int | None = None
    """A W&B log read up to its end inside a run of zeros: where the run began (it is said once,
    when it ends or the file is final, not once per read)."""

    def advance(self, **changes: object) -> Cursor:
        return replace(self, **changes)

    def to_json(self) -> str:
        # The fields as they are (all flat): asdict's deep copy was most of the cost, and the
        # daemon writes a cursor for every file it reads in every pass.
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Cursor:
        return cls(**json.loads(text))
