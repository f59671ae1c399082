"""Bytes -> canonical rows: one small module per log format, plus sniffing (sniff.py).

Each format module declares its `Format` (base.py): its reader, the file names that settle it, and
how its lines (or its head) are recognised. Adding a format is that module and its entry here."""

from __future__ import annotations

from . import comet_offline, composer, csvlog, dictlines, dvclive, fairseq, hf_console, kvlines, megatron, mlflow_db, mlruns, olmo_core, progress_bars, step_split, tfevents, trackio_db, trainer_state, wandb
from .base import Format

FORMATS: tuple[Format, ...] = (
    tfevents.FORMAT,
    wandb.FORMAT,
    trainer_state.FORMAT,
    dvclive.FORMAT,
    mlruns.FORMAT,
    mlflow_db.FORMAT,
    trackio_db.FORMAT,
    comet_offline.FORMAT,
    csvlog.FORMAT,
    composer.FORMAT,
    olmo_core.FORMAT,
    megatron.FORMAT,
    dictlines.JSONL_FORMAT,
    hf_console.FORMAT,
    progress_bars.FORMAT,
    fairseq.FORMAT,
    kvlines.FORMAT,
    step_split.FORMAT,
)
"""In sniffing precedence: a line claimed by several formats counts for the first (Composer's metric
lines, then Megatron's iteration lines, dict lines, then bare `name value` pairs, which many formats'
lines also hold), and so does a tie in the count. (The trackers' formats, settled by their folders
or, for databases, by their tables, count no lines.)"""
