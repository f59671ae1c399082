"""A problem found while reading: reported once, naming the file and the line or byte offset, and
never raised out of a reader, so one bad file cannot stop the others from being read."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    source: str
    message: str
    line: int | None = None
    offset: int | None = None
    unfinished: bool = False
    """The file's last record is not whole yet, everything before it was read: a file still being
    written (a live W&B run always ends inside a record), or one cut off. Said, but not a file that
    could not be read: `scan --strict` does not fail on it."""

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
        elif self.offset is not None:
            where += f" @ byte {self.offset}"
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "line": self.line, "offset": self.offset, "message": self.message}


KEEP_PER_FOLDER = 3


def summarised(problems: Iterable[Problem], *, keep: int = KEEP_PER_FOLDER) -> list[Problem]:
    """The problems with those of one kind (the same message) in one folder cut to the first `keep`,
    then one line saying how many more: 50,000 empty files are a fact about their folder, not 50,000
    warnings to scroll past."""
    out: list[Problem | None] = []
    seen: dict[tuple[str, str], int] = {}
    slot: dict[tuple[str, str], int] = {}
    unfinished: dict[tuple[str, str], bool] = {}
    for problem in problems:
        key = (os.path.dirname(problem.source), problem.message)
        seen[key] = seen.get(key, 0) + 1
        unfinished[key] = unfinished.get(key, True) and problem.unfinished
        if seen[key] <= keep:
            out.append(problem)
        elif key not in slot:
            slot[key] = len(out)
            out.append(None)
    for key, at in slot.items():
        folder, message = key
        out[at] = Problem(folder or ".", f"... and {seen[key] - keep:,} more file(s) in this folder: {message}", unfinished=unfinished[key])
    return [p for p in out if p is not None]
