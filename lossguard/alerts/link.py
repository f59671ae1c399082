"""The daemon's one outbound WebSocket to Slack (Socket Mode), kept open on a thread of its own so
that nothing it does (connecting, waiting out a backoff, a click being applied) ever delays reading
the logs or delivering alerts, which go their own way over the Web API.

It reconnects with exponential backoff and jitter (1 s doubling to a minute) when the connection
drops or cannot be made; a token Slack refuses (invalid, revoked, no app-level token) is said once,
loudly, with its fix, and then tried again only rarely (a fixed credential needs a restart anyway):
alerts keep flowing meanwhile. An error nobody foresaw (a bug here or in slack-sdk) is logged,
scrubbed, shown as `failed` and followed by the same backoff: the thread never dies of it. How it
stands is written to the state for `lossguard status`, with a heartbeat (HEARTBEAT), so a link that
stopped for any reason is seen to have stopped."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from ..escaping import printable
from ..redact import Scrubbed, scrub
from .followups import unexpected

log = logging.getLogger("lossguard")
FIRST_WAIT = 1.0
LONGEST_WAIT = 60.0
REFUSED_WAIT = 900.0
"""After a refused token: the next quiet try (the token may have been reinstalled meanwhile)."""
WATCH_EVERY = 0.2
HEARTBEAT = 30.0
"""How often the link writes that it is alive (`status`: `last heard 12 s ago`)."""


class Link:
    """`connect()` -> an object with open() -> Delivery, connected() and close() (alerts.socket_mode.SocketModeLink);
    `handler`: what takes the envelopes, closed (its click in flight and follow-ups waited for) as the link stops."""

    def __init__(self, connect: Callable[[], object], *, on_status: Callable[[dict], None] = lambda status: None,
                 clock: Callable[[], float] = time.time, handler=None) -> None:  # noqa: ANN001
        self.connect = connect
        self.on_status = on_status
        self.clock = clock
        self.handler = handler
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slack-socket-mode", daemon=True)
        self.status: dict[str, object] = {"state": "connecting"}
        self._refused_said = False
        self._failing = False
        self._beat_at = 0.0

    def start(self) -> Link:
        self.thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """The link stopped, then the click being applied and its follow-ups waited for (up to
        `timeout` s in all): the daemon closes the state after this."""
        deadline = time.monotonic() + timeout
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
        if self.handler is not None:
            self.handler.close(max(0.0, deadline - time.monotonic()))
        if self.thread.ident is not None:
            self._say(state="stopped")

    def _say(self, **status: object) -> None:
        now = self.clock()
        self.status = {**status, "at": now, "beat": now}
        self._beat_at = time.monotonic()
        self._write()

    def _beat(self) -> None:
        """Alive, said every HEARTBEAT s whatever the state: `status` shows how long ago, so a
        link that stopped answering (its thread gone) shows as such, not as it last stood."""
        if time.monotonic() - self._beat_at >= HEARTBEAT:
            self._beat_at = time.monotonic()
            self.status = {**self.status, "beat": self.clock()}
            self._write()

    def _write(self) -> None:
        try:
            self.on_status(self.status)
        except Exception:  # noqa: BLE001 - status is for people; the link goes on without it
            log.debug("the Slack link's status could not be written", exc_info=True)

    def _wait(self, seconds: float) -> bool:
        """Waits `seconds` (True: the link is stopping), beating meanwhile."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.stop.wait(min(left, HEARTBEAT)):
                return True
            self._beat()
        return self.stop.is_set()

    def _run(self) -> None:
        wait = FIRST_WAIT
        while not self.stop.is_set():
            try:
                wait = self._session(wait)
            except Exception as exc:  # noqa: BLE001 - a bug of ours or slack-sdk's costs a reconnect, never the link
                unexpected(f"the Slack Socket Mode link failed, starting again in {wait:.0f} s (alerts are not affected)", exc)
                self._say(state="failed", error=f"{type(exc).__name__}: {scrub(printable(str(exc)))}")
                self._wait(random.uniform(wait / 2, wait))
                wait = min(wait * 2, LONGEST_WAIT)

    def _session(self, wait: float) -> float:
        """One connection, from its opening to its end (or to the wait after it could not be made);
        returns the wait before the next attempt."""
        session = self.connect()
        try:
            opened = session.open()
            if opened.ok:
                self._refused_said = self._failing = False
                log.info("Slack Socket Mode link open: buttons on alerts are taken")
                self._say(state="connected")
                while session.connected() and not self.stop.wait(WATCH_EVERY):
                    self._beat()
                if self.stop.is_set():
                    return FIRST_WAIT
                log.warning("Slack Socket Mode link dropped; reconnecting (alerts are not affected)")
                self._say(state="reconnecting", error="the connection dropped")
                self.stop.wait(random.uniform(0, FIRST_WAIT))
                return FIRST_WAIT
        finally:
            session.close()
        if opened.permanent:
            if not self._refused_said:
                self._refused_said = True
                log.error("Slack refused the app-level token: %s; buttons on alerts do nothing until it is fixed and lossguard restarted "
                          "(alerts keep flowing)", opened.describe())
            self._say(state="refused", error=opened.error, fix=opened.fix)
            self._wait(REFUSED_WAIT)
            return wait
        # (said once an outage: the next tries, every minute at most, only at debug level)
        (log.debug if self._failing else log.warning)("Slack Socket Mode link cannot connect, trying again in %.0f s: %s", wait, opened.describe())
        self._failing = True
        self._say(state="reconnecting", error=opened.error)
        self._wait(random.uniform(wait / 2, wait))
        return min(wait * 2, LONGEST_WAIT)


def slack_link(*, app_token: str, base_url: str, bot, state, status_state, actors: list[str], rules: Callable[[], list[tuple[str, str]]]) -> Link:  # noqa: ANN001
    """The link the daemon keeps when an app token is set: clicks applied through `state` (a
    connection of its own), the link's status written through `status_state` (another)."""
    from .clicks import ClickHandler, status_text
    from .message import CAUSE_TITLES
    from .socket_mode import SocketModeLink

    handler = ClickHandler(state, bot, actors=actors, rules=rules, causes=list(CAUSE_TITLES), status=lambda run: status_text(state, run))
    sdk_log = logging.getLogger("lossguard.slack_sdk")
    if not any(isinstance(f, Scrubbed) for f in sdk_log.filters):  # (it logs what it sends and receives at debug level)
        sdk_log.addFilter(Scrubbed())
    # (its own error lines for a dropped connection: the link says it once)
    sdk_log.setLevel(logging.NOTSET if log.isEnabledFor(logging.DEBUG) else logging.CRITICAL)
    if not actors:
        log.warning("slack_app_token is set but slack_actors is empty: every click on an alert's buttons is refused")
    return Link(lambda: SocketModeLink(app_token, base_url=base_url, on_request=handler, logger=sdk_log), on_status=status_state.set_link,
                handler=handler)
