"""The daemon's object store roots: each a mirror (ingest.sources.object_store) under the state
folder, brought up to date before each walk, and backed off while its store fails.

A store is polled, never watched: inotify sees no bucket. A sync costs the prefix's listing (a
request a thousand objects) and a ranged GET per object that changed, so an idle prefix of a hundred
runs costs one or two requests a poll. A store that throttles (503 SlowDown, 429) or fails is asked
again after a delay that doubles up to BACKOFF_MAX, and said once when it starts failing and once
when it answers again, not at every poll; the other roots are followed meanwhile, and the copies
stay as they were (nothing read is lost, nothing is read twice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LossguardError
from ..ingest.sources import object_store
from ..ingest.sources.object_store import Mirror, StoreError

BACKOFF_MAX = 300.0
"""Seconds at most between two tries of a store that keeps failing (or refuses: a fix in its
credentials or policy is found within this, without a restart)."""
RETRIES = 1
"""Attempts of one request within a sync: no retry by the client itself (botocore's, s3fs'), whose
sleeps would hold up the pass; the next attempt is a later poll's, at the backoff's pace."""
OBJECTS = "objects"
"""The state folder's subfolder holding the mirrors."""


@dataclass
class _Health:
    failing: str | None = None
    """What the store said when it began failing (said once), None while it answers."""
    delay: float = 0.0
    next_try: float = 0.0
    answered: bool = False
    """Whether one sync of this process listed the store and fetched every object it listed."""


class Mirrors:
    """The URL roots of a daemon, their copies and how each store is doing."""

    def __init__(self, urls: Sequence[str], *, state_dir: Path, poll_interval: float, jobs: int = 8,
                 log: Callable[[str], None], warn: Callable[[str], None]) -> None:
        self.poll_interval = poll_interval
        self.log, self.warn = log, warn
        self.mirrors = [Mirror(u, cache=object_store.cache_for(u, state_dir / OBJECTS), jobs=jobs, retries=RETRIES) for u in urls]
        self._health = [_Health() for _ in self.mirrors]
        for mirror in self.mirrors:
            mirror.prepare()

    @classmethod
    def of(cls, roots: Sequence[Path | str], **options: Any) -> Mirrors | None:
        """The mirrors of the URLs among a daemon's roots, None when it has none."""
        urls = [str(r) for r in roots if object_store.is_url(r)]
        return cls(urls, **options) if urls else None

    def show_in(self, logger: logging.Logger) -> None:
        """Every record a logger's handlers write shows the objects' URLs, not their copies' paths."""
        for handler in logger.handlers:
            handler.addFilter(_Shown(self.shown))

    def local(self, url: str) -> Path:
        """The folder (or file) the follower reads for a URL root."""
        return next(m.local() for m in self.mirrors if m.url == object_store.normal(url))

    def answered(self, root: Path) -> bool:
        """Whether a root the daemon reads was read whole in this process: a mirror once one sync
        listed its store and fetched all it listed (until then its copy may hold nothing, or part,
        of what the store holds); any other root, always."""
        return all(health.answered for mirror, health in zip(self.mirrors, self._health) if mirror.local() == root)

    def shown(self, text: str) -> str:
        for mirror in self.mirrors:
            text = mirror.shown(text)
        return text

    def sync(self, now: float) -> None:
        """Each mirror whose store is due, brought up to date; a failure costs that store's mirror
        this poll only (its copies are as the last sync left them)."""
        for mirror, health in zip(self.mirrors, self._health):
            if now < health.next_try:
                continue
            try:
                report = mirror.sync()
            except StoreError as exc:
                self._failed(mirror, health, exc, now)
                continue
            except (OSError, LossguardError) as exc:  # (the copy's side: a full disk, a folder in the way)
                self._failed(mirror, health, StoreError(f"{mirror.url}: cannot write its copy: {exc}", transient=True), now)
                continue
            for key in report.skipped:
                self.warn(f"{key}: skipped: a key that names no file a folder can hold")
            if report.failed:
                self._failed(mirror, health, report.failed[0], now)
                continue
            if health.failing is not None:
                self.log(f"{mirror.url}: the store answers again")
            health.failing, health.delay, health.next_try, health.answered = None, 0.0, 0.0, True
            if report.fetched or report.appended or report.rewritten or report.removed:
                logging.getLogger(__name__).debug("%s: %d new, %d grown, %d rewritten, %d removed object(s), %d bytes",
                                                  mirror.url, report.fetched, report.appended, report.rewritten, report.removed, report.bytes)

    def _failed(self, mirror: Mirror, health: _Health, exc: StoreError, now: float) -> None:
        health.delay = min(BACKOFF_MAX, max(self.poll_interval, health.delay * 2)) if exc.transient else BACKOFF_MAX
        health.next_try = now + health.delay
        if health.failing is None:
            health.failing = str(exc)
            kind = "is unavailable or throttling" if exc.transient else "refuses"
            self.warn(f"{exc} ({mirror.url} {kind}: asked again with backoff, up to every {BACKOFF_MAX:.0f} s; "
                      "said once until it answers; the other paths are followed meanwhile)")


def local_roots(roots: Sequence[Path | str], mirrors: Mirrors | None) -> tuple[list[Path], list[Path]]:
    """What the daemon reads for each root (a URL's mirror), and the roots inotify may watch: not a
    mirror, which changes only when a pass syncs it."""
    read = [mirrors.local(str(r)) if mirrors is not None and object_store.is_url(r) else Path(r) for r in roots]
    return read, [Path(r) for r in roots if not object_store.is_url(r)]


class _Shown(logging.Filter):
    """A record's paths into an object store's mirror shown as the objects' URLs, whoever logged it."""

    def __init__(self, shown: Callable[[str], str]) -> None:
        super().__init__()
        self.shown = shown

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.shown(record.getMessage()), None
        return True
