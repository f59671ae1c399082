"""How a daemon pass spends its time, so that no single file holds up the other runs' alerts.

A read is pure (a file and a cursor in, rows and the next cursor out), so one that may be slow (a
file never read before, or one whose last read was slow) runs on a thread of its own while the pass
waits for it only as long as its budget allows. If it is not done by then the pass goes on without
that run and commits the others; the read finishes beside the passes, asks for a pass, and the
next pass that meets the file takes its result. Reads known to be quick stay on the pass's thread,
where they cost nothing extra. A file slow to read is also read in smaller blocks next time (and in
larger ones again once it is quick), so its own run makes steady progress. Polars cannot be
interrupted mid-read, which is why the wait, not the read, is what is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ingest.cursor import Cursor
from ..ingest.reader import ReadResult

PASS_BUDGET = 0.25
"""Seconds of reading after which a pass leaves the runs it has not read to the next pass, which
comes at once and reads them first; also the longest a pass waits for one file."""
MIN_BLOCK = 64 << 10
"""The smallest block a slow file is read in: a file whose block took longer than the budget is
read in half as many bytes next time (down to this), and in twice as many once it is quick again."""
QUICK = PASS_BUDGET / 4
"""A read that took at most this long is quick: the file's next read stays on the pass's thread,
unless more than INLINE_BYTES are waiting (a quiet file that just got a burst, or a new file)."""
INLINE_BYTES = 1 << 20


@dataclass
class Flight:
    """A read running on its own thread; the pass that started it may have stopped waiting."""

    start: str
    """The cursor (as JSON) the read started from: its result is only good for that cursor."""
    result: ReadResult | None = None
    error: BaseException | None = None
    took: float = 0.0
    finished: bool = False
    abandoned: bool = False
    """The pass stopped waiting: the read asks for a pass when it is done."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Decides between the two ends: the pass gives up, or the read finishes, whichever is first."""
    done: threading.Event = field(default_factory=threading.Event)

    def outcome(self) -> ReadResult:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class Budget:
    """Per pass: the order runs are read in and how long the pass may wait; per file: how long its
    last read took, its block size, and any read still running."""

    def __init__(self, *, limit: int, budget: float = PASS_BUDGET, clock: Callable[[], float] = time.monotonic,
                 wake: Callable[[str], None] = lambda path: None) -> None:
        self.limit = limit
        self.budget = budget
        self.clock = clock
        self.wake = wake
        """Asks for a pass over `path` (the daemon's inotify entry): a read left running is done."""
        self.costs: dict[str, float] = {}
        self.blocks: dict[str, int] = {}
        self.flights: dict[str, Flight] = {}
        self.deferred: set[str] = set()
        """Runs the last pass left unread: read first in this one, so none waits forever."""
        self._started = 0.0

    # --- the pass ------------------------------------------------------------------------------
    def order(self, runs: dict[str, list[tuple[str, int]]]) -> list[str]:
        """Runs to read (each with its files and the bytes waiting in them): left-over ones first,
        then those with little waiting, cheapest first; runs with a read still running wait."""
        self._started = self.clock()
        ready = [r for r, files in runs.items() if not any(self.busy(p) for p, _ in files)]

        def key(run: str) -> tuple:
            files = runs[run]
            return (run not in self.deferred, sum(n for _, n in files) > INLINE_BYTES, sum(self.costs.get(p, 0.0) for p, _ in files), run)

        return sorted(ready, key=key)

    def spent(self) -> bool:
        return self.clock() - self._started > self.budget

    def left(self) -> float:
        return max(0.0, self.budget - (self.clock() - self._started))

    def busy(self, path: str) -> bool:
        flight = self.flights.get(path)
        return flight is not None and not flight.finished

    # --- one file ------------------------------------------------------------------------------
    def block(self, path: str) -> int:
        return self.blocks.get(path, self.limit)

    def read(self, path: str, cursor: Cursor, pending: int, job: Callable[[int], ReadResult]) -> ReadResult | None:
        """`job(block)` reads the file from `cursor` (`pending` bytes are waiting); None: the read
        still runs (the run waits)."""
        start = cursor.to_json()
        flight = self.flights.pop(path, None)
        if flight is not None and flight.start == start:
            return self._done(path, cursor, flight.outcome(), flight.took)
        block = self.block(path)
        if self.costs.get(path, float("inf")) <= QUICK and pending <= INLINE_BYTES:
            begun = self.clock()
            res = job(block)
            return self._done(path, cursor, res, self.clock() - begun)
        flight = Flight(start)
        threading.Thread(target=self._fly, args=(path, flight, job, block), daemon=True, name="lossguard-read").start()
        flight.done.wait(self.left())
        with flight.lock:
            if not flight.finished:
                flight.abandoned = True
                self.flights[path] = flight
                return None
        return self._done(path, cursor, flight.outcome(), flight.took)

    def together(self, path: str, pending: int) -> bool:
        """Whether the file may be read with others in one batch, on the pass's thread: little is
        waiting in it and its last read (if any) was quick; no read of it is running or waiting."""
        return path not in self.flights and pending <= INLINE_BYTES and self.costs.get(path, 0.0) <= QUICK

    def took(self, path: str, cursor: Cursor, res: ReadResult, took: float) -> None:
        """A read done outside `read` (a batch's share of its time)."""
        self._done(path, cursor, res, took)

    def _fly(self, path: str, flight: Flight, job: Callable[[int], ReadResult], block: int) -> None:
        begun = time.monotonic()
        try:
            flight.result = job(block)
        except BaseException as exc:  # noqa: BLE001 - handed to the pass that takes the result
            flight.error = exc
        flight.took = time.monotonic() - begun
        with flight.lock:
            flight.finished = True
            wake = flight.abandoned
        flight.done.set()
        if wake:
            self.wake(path)

    def _done(self, path: str, cursor: Cursor, res: ReadResult, took: float) -> ReadResult:
        self.costs[path] = took
        consumed = res.cursor.offset - cursor.offset
        block = self.block(path)
        if took > self.budget and consumed > MIN_BLOCK:
            self.blocks[path] = max(MIN_BLOCK, min(block, consumed) // 2)
        elif path in self.blocks and took <= QUICK:
            grown = block * 2
            if grown >= self.limit:
                del self.blocks[path]
            else:
                self.blocks[path] = grown
        return res

    def forget(self, path: str) -> None:
        """The file is gone from the followed set."""
        self.costs.pop(path, None)
        self.blocks.pop(path, None)
        self.flights.pop(path, None)
