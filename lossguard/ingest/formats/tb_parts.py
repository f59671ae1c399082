"""Event files of one run written by several writers, each into a folder of its own below the
run's folder: which run such a file is part of, and its tags' names there. Discovery names the
file's run by it, the event-file reader its tags."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

EVENT_FILE = "events.out.tfevents"
KERAS_TRAIN, KERAS_VALIDATION = "train", "validation"
"""The folders keras.callbacks.TensorBoard writes a run's event files into (keras/src/callbacks/
tensorboard.py: `_train_dir`, `_val_dir` under `log_dir`): the training's `epoch_loss`,
`epoch_learning_rate`, `batch_loss`, the validation's `epoch_loss` and
`evaluation_loss_vs_iterations`, one run."""
WRITER_DEPTH = 3
"""How far above an event file's folder the run's own writer is looked for (add_scalars' folders
are `<logdir>/<main tag>/<key>`, a main tag with `/` one level deeper each)."""


@dataclass(frozen=True)
class SubWriter:
    """An event file written for one part of a run by a writer of its own, below the run's folder."""

    run_folder: Path
    below: str
    """The event file's folder below the run's, `/`-separated: `validation`, `loss_val`, `loss/val`."""

    def tag(self, tag: str) -> str:
        """The run's name for a tag of this writer's: tensorboardX's add_scalars writes `<main>/<key>/`
        and torch's `<main with / as _>_<key>/`, each holding the main tag (`loss` in `loss_val/`:
        `loss/val`); another writer's folder is the tag's namespace (Keras' `validation/epoch_loss`)."""
        if self.below.startswith(tag + "/"):
            return self.below
        flat = tag.replace("/", "_") + "_"
        if "/" not in self.below and self.below.startswith(flat) and len(self.below) > len(flat):
            return f"{tag}/{self.below[len(flat):]}"
        return f"{self.below}/{tag}"


@functools.lru_cache(maxsize=4096)
def _holds_events(folder: str) -> bool:
    """Whether a folder holds an event file of its own. (A run's writer makes its file before any
    add_scalars writer below it: a folder found without one is not asked again.)"""
    try:
        with os.scandir(folder) as entries:
            return any(e.name.startswith(EVENT_FILE) for e in entries)
    except OSError:
        return False


def sub_writer(folder: Path, *, top: Path | None = None) -> SubWriter | None:
    """The run an event file in `folder` is part of, when it is one part of a run (None: the folder
    is a run of its own), no higher than `top`. Keras' `validation/`, and its `train/` beside one
    (a `train/` alone is a run so named: YOLO's runs/detect/train); or a folder below one holding a
    writer's event file, as SummaryWriter.add_scalars makes one a key (`loss_train/`, `loss_val/`),
    each a run of its own to TensorBoard. As separate runs, the validation's loss was judged as a
    training loss and the training's lost its learning rate's context."""
    above = folder.parent
    if folder.name == KERAS_VALIDATION or (folder.name == KERAS_TRAIN and (above / KERAS_VALIDATION).is_dir()):
        return SubWriter(above, folder.name) if above != folder and (top is None or _within(above, top)) else None
    for _ in range(WRITER_DEPTH):
        if above == folder or (top is not None and not _within(above, top)):
            return None
        if _holds_events(str(above)):
            return SubWriter(above, folder.relative_to(above).as_posix())
        if above.parent == above:
            return None
        above = above.parent
    return None


def _within(folder: Path, top: Path) -> bool:
    return folder == top or top in folder.parents


def renamed(rows: pl.DataFrame, split: SubWriter) -> pl.DataFrame:
    """A part's rows under the run's names for their tags (SubWriter.tag; asked once a tag)."""
    tags = rows.get_column("tag").cast(pl.String)
    names = {t: split.tag(t) for t in tags.unique().to_list() if t is not None}
    return rows.with_columns(tags.replace_strict(names, return_dtype=pl.String).cast(rows.schema["tag"]).alias("tag"))
