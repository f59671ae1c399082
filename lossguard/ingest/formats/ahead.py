"""Reading the next block while this one parses.

A line format's read spends a block's time in two halves: turning its bytes into lines worth parsing
(reading, cutting, the binary check, the prefilter), which no cursor decides, and parsing them, which
starts from the cursor the block before left. The first half of block k+1 can run while block k
parses: polars and numpy release the GIL, and the machines lossguard runs on have a second core.

Items come out in order and exactly as a plain loop would give them; an error preparing item k+1 is
raised where the loop would have met it (after item k is done with), and the thread is gone before
the read returns, however it ends (closing the generator joins it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")

_END = object()


def read_ahead(items: Iterator[T], prepare: Callable[[T], U], *, worth_it: Callable[[U], bool]) -> Iterator[U]:
    """`prepare(item)` for each of `items`, the next one prepared on a background thread while the
    caller works on the current one. The first is prepared on the caller's thread, and the thread is
    started only if `worth_it(first)` says more are likely (a daemon's read of a few new lines, many
    a second, pays for no thread). `items` and `prepare` run on one thread at a time, never both."""

    def step() -> object:
        try:
            item = next(items)
        except StopIteration:
            return _END
        return prepare(item)

    try:
        first = step()
        if first is _END:
            return
        if not worth_it(first):  # type: ignore[arg-type]
            yield first  # type: ignore[misc]
            while (item := step()) is not _END:
                yield item  # type: ignore[misc]
            return
        with ThreadPoolExecutor(1, thread_name_prefix="lossguard-read-ahead") as pool:
            pending: Future[object] = pool.submit(step)
            current = first
            try:
                while True:
                    yield current  # type: ignore[misc]
                    current = pending.result()
                    if current is _END:
                        return
                    pending = pool.submit(step)
            finally:
                # Leaving early (an error, the caller stopped): let the step under way finish (the pool
                # waits for it) and drop its result, so nothing touches `items` after this.
                pending.cancel()
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
