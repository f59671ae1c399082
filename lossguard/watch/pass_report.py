"""What one pass did, as the daemon logs it and the metrics count it: each step of the pass (its
reads, its judging, its notices) adds to the one report the pass returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import Notice


@dataclass
class PassReport:
    files: int = 0
    rows: int = 0
    walked: bool = False
    """The pass walked the roots (rather than re-checking only the paths inotify named)."""
    unfinished: list[str] = field(default_factory=list)
    """Files with more to read than this pass took (a block of READ_LIMIT, or left over when the pass
    spent its budget): the next pass should come at once. (A file whose read outlasted the budget is
    not among them: its read asks for the pass itself when it is done.)"""
    notices: list[Notice] = field(default_factory=list)
    problems: int = 0
    """Problems the readers met (each logged): the metrics count them."""
