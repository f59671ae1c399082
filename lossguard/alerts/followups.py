"""What a click does after its ack (the alert updated in place, the clicker's ephemeral line, a plot
drawn and uploaded), on threads of lossguard's own. slack-sdk's Socket Mode client hands envelopes
to one worker; work left on it delays the next envelope's ack, and a slow chat.update (3.9 s seen)
would push that ack past Slack's 3 s, after which Slack sends the envelope again. Here the worker
only commits and acks; a slow Slack API delays nothing but the follow-ups behind it.

Bounded: WORKERS threads and at most PENDING follow-ups waiting; past that one is dropped with a
warning (its click is committed: only the message update or the answer is lost, and the next
click's update says everything the state holds)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from ..escaping import printable
from ..redact import scrub

log = logging.getLogger("lossguard")
WORKERS = 2
PENDING = 32


def unexpected(what: str, exc: BaseException) -> None:
    """An error nobody foresaw, said in one line with its secrets scrubbed (the traceback at debug
    level, where the daemon's formatter scrubs it too)."""
    log.error("%s: %s: %s", what, type(exc).__name__, scrub(printable(str(exc))))
    log.debug("%s", what, exc_info=True)


class FollowUps:
    """`what`: what a piece of work is, in the line that says one was dropped."""

    def __init__(self, *, workers: int = WORKERS, pending: int = PENDING, what: str = "a click's follow-up (the alert's update, the answer)",
                 name: str = "slack-follow-up") -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._what = what
        self._room = threading.BoundedSemaphore(pending)
        self._pending = pending
        self._dropped = 0
        self._futures: set[Future] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, work: Callable[[], None]) -> bool:
        """`work` run soon on a thread of ours (False: dropped, as lossguard stops or too many wait)."""
        # (Submitted from the link's thread and the membership worker's: the count under the lock.)
        if self._closed or not self._room.acquire(blocking=False):
            with self._lock:
                first, self._dropped = not self._dropped, self._dropped + 1
            if first:  # (said once a burst: the count when there is room again)
                log.warning("%s was dropped: %s", self._what, "lossguard is stopping" if self._closed else f"{self._pending} are waiting already")
            return False
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if dropped > 1:
            log.warning("%d times %s was dropped while %d waited", dropped, self._what, self._pending)

        def run() -> None:
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - one follow-up lost, not the thread
                unexpected("a click's follow-up failed", exc)
            finally:
                self._room.release()

        with self._lock:
            try:
                future = self._pool.submit(run)
            except RuntimeError:  # (closed meanwhile)
                self._room.release()
                return False
            self._futures.add(future)
        future.add_done_callback(self._done)
        return True

    def _done(self, future: Future) -> None:
        with self._lock:
            self._futures.discard(future)

    def close(self, timeout: float) -> bool:
        """No more follow-ups; those under way or waiting get up to `timeout` s (then the waiting
        ones are cancelled). True when none is left running."""
        self._closed = True
        with self._lock:
            futures = set(self._futures)
        _, left = wait(futures, timeout=timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        return not any(f.running() for f in left)
