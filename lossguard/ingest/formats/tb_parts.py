"""Event files of one run written by several writers, each into a folder of its own below the
run's folder: which run such a file is part of, and its tags' names there. Discovery names the
file's run by it, the event-file reader its tags."""

from __future__ import annotations

import os
from collections.abc import Callable
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


def _event_files(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries if e.name.startswith(EVENT_FILE) and e.is_file())
    except OSError:
        return []


def _add_scalars_part(below: str, tags: frozenset[str]) -> bool:
    """Whether a folder `below` a run's writer holds what SummaryWriter.add_scalars writes there:
    only its main tag, which the folder's name is made of (tensorboardX `<main>/<key>`, torch
    `<main with / as _>_<key>`). A folder of a run of its own (a hyperparameter trial's, below a
    logdir whose own event file holds the trials' config) holds other tags. A folder holding no
    scalar yet (a writer flushes its first records after 10 events or 2 minutes) or only `hparam/`
    ones (add_hparams' folder, which HF's TensorBoardCallback makes in every run) is a part, as any
    folder below a writer was before the tags were asked."""
    scalars = [tag for tag in tags if not tag.startswith("hparam/")]
    return not scalars or all(
        below.startswith(tag + "/") or ("/" not in below and below.startswith(tag.replace("/", "_") + "_") and len(below) > len(tag) + 1)
        for tag in scalars
    )


def sub_writer(folder: Path, *, tags_of: Callable[[str], frozenset[str]], top: Path | None = None) -> SubWriter | None:
    """The run an event file in `folder` is part of, when it is one part of a run (None: the folder
    is a run of its own), no higher than `top`. Keras' `validation/`, and its `train/` beside one
    (a `train/` alone is a run so named: YOLO's runs/detect/train); or a folder below one holding a
    writer's event file, as SummaryWriter.add_scalars makes one a key (`loss_train/`, `loss_val/`),
    each a run of its own to TensorBoard; `tags_of(event file)`: the scalar tags of its first
    records, which tell an add_scalars part (its main tag in its folder's name) from a run of its own. As separate runs, the validation's loss was judged as a
    training loss and the training's lost its learning rate's context."""
    above = folder.parent
    if folder.name == KERAS_VALIDATION or (folder.name == KERAS_TRAIN and (above / KERAS_VALIDATION).is_dir()):
        return SubWriter(above, folder.name) if above != folder and (top is None or _within(above, top)) else None
    mine: frozenset[str] | None = None
    for _ in range(WRITER_DEPTH):
        if above == folder or (top is not None and not _within(above, top)):
            return None
        if _event_files(above):
            below = folder.relative_to(above).as_posix()
            if mine is None:
                files = _event_files(folder)
                mine = tags_of(files[0]) if files else frozenset()
            # (The nearest writer above decides: a folder below a run of its own is no part of
            # the logdir above that run.)
            return SubWriter(above, below) if _add_scalars_part(below, mine) else None
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
