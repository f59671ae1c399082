"""A progress line on stderr for scans that take more than a moment, only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total_bytes: int = 0, *, stream: TextIO = sys.stderr, delay: float = 0.5) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.delay = delay
        self.total_bytes = total_bytes
        self.shown = False

    def __call__(self, done: int, total: int, done_bytes: int) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.delay and done < total:
            return
        if not self.shown and done == total and elapsed < self.delay:
            return
        rate = done_bytes / elapsed / 1e6 if elapsed > 0 else 0.0
        width = 24
        filled = int(width * done / total) if total else width
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs, {done_bytes / 1e6:.1f} MB, {rate:.1f} MB/s ")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
