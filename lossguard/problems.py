"""A problem found while reading: reported once, naming the file and the line or byte offset, and
never raised out of a reader, so one bad file cannot stop the others from being read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    source: str
    message: str
    line: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
        elif self.offset is not None:
            where += f" @ byte {self.offset}"
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "line": self.line, "offset": self.offset, "message": self.message}
