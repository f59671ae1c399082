"""HF Transformers `trainer_state.json`: a whole JSON document, rewritten at every checkpoint, whose
`log_history` only ever grows. The cursor counts entries handed out; a half-written file (the
Trainer writing it right now) is not an error until a final read."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

from .. import bounds, table
from ..cursor import Cursor
from ..problems import Problem
from .base import Format, Parsed
from .dictlines import SUMMARY_KEYS

import polars as pl


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


class TrainerStateFormat:
    name = "hf_trainer_state"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        # One JSON document: read whole whatever the limit (HF keeps it to the logged steps, small),
        # up to bounds.MAX_DOCUMENT: parsed, a document takes ten times its size.
        source = str(path)
        try:
            raw = bounds.read_capped(path, limit=bounds.MAX_DOCUMENT)
        except bounds.TooLarge as exc:  # (it only grows: not read again)
            return Parsed(table.empty_raw(), cursor, (Problem(source, f"a trainer_state.json {exc}: not read"),), dead=True)
        try:
            doc = bounds.json_value(raw)
            history = doc["log_history"]
            if not isinstance(history, list):
                raise TypeError("log_history is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            if not final:
                return Parsed(table.empty_raw(), cursor)
            return Parsed(table.empty_raw(), cursor, (Problem(source, f"not a readable trainer_state.json: {exc}"),))
        problems: list[Problem] = []
        start = cursor.index
        if len(history) < start:
            problems.append(Problem(source, "log_history is shorter than before (a new run in this folder?); read again from its start"))
            start = 0
        elif start and cursor.mark is not None and _digest(history[start - 1]) != cursor.mark:
            # A later checkpoint read on from an earlier one's cursor (the daemon carries it over)
            # whose history differs there: a resume from an older checkpoint that logged other
            # values. Its whole history is the run's next timeline.
            problems.append(Problem(source, f"log_history differs from the checkpoint read before at entry {start}; read again from its start"))
            start = 0
        steps: list[int] = []
        tags: list[str] = []
        values: list[float] = []
        for entry in history[start:]:
            if not isinstance(entry, dict) or any(k in entry for k in SUMMARY_KEYS):
                continue
            step = _number(entry.get("step"))
            if step is None or math.isnan(step):
                continue
            for key, value in entry.items():
                number = _number(value)
                if key == "step" or number is None:
                    continue
                steps.append(int(step))
                tags.append(key)
                values.append(number)
        rows = pl.DataFrame({"step": steps, "tag": tags, "value": values}, schema={"step": pl.Int64(), "tag": pl.String(), "value": pl.Float64()})
        last = steps[-1] if steps else cursor.last_step
        mark = _digest(history[-1]) if history else None
        return Parsed(table.conform_raw(rows), cursor.advance(offset=len(raw), index=len(history), last_step=last, mark=mark), tuple(problems))


def _digest(entry: object) -> str:
    """What a log_history entry holds, short: the later checkpoint's copy of the entry a read
    stopped after must be the same entry for its read to go on from there."""
    return hashlib.blake2b(json.dumps(entry, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


TRAINER_STATE = TrainerStateFormat()


def _is_trainer_state(path: Path, head: Callable[[], bytes]) -> bool:
    """A trainer_state.json copied out under another name: JSON whose head names `log_history`."""
    return path.suffix.lower() == ".json" and b'"log_history"' in head()


FORMAT = Format(reader=TRAINER_STATE, names=("trainer_state.json",), head=_is_trainer_state)
