"""The one module that talks to Alertmanager (`POST /api/v2/alerts`, with the standard library's
urllib), and turns what goes wrong into a Delivery.

Alertmanager's client contract (docs/clients.md): identity is the label set, so what changes about
an incident (its cause, its value) lives in annotations; firing alerts are posted again every
30 s - 3 min, or Alertmanager resolves them by itself (`resolve_timeout`); a resolution is the same
labels with `endsAt` in the past; and in HA every replica gets every alert (replicas gossip
silences and notification logs, never alerts), never through a load balancer.

Several URLs: a post is accepted when at least one replica accepted it. Waiting for all would let
one dead replica hold every alert back from the living ones (the outbox keeps order and stops at
a temporary failure). A replica that missed a post gets the firing alerts at the next re-send; one
that missed a resolution resolves the alert by itself at its resolve_timeout. When none accepted,
the failure is permanent only if every replica refused for good (a 4xx other than 429: a bad
password, a URL that is no Alertmanager); an unreachable one or a 5xx is worth another try.
A replica that failed for a moment is left out of the posts for REST seconds while another one
works: a host that is down and drops packets costs the whole timeout per post, which would make a
backlog crawl for the living replicas.

Many alerts go in bounded batches (`batches`: MAX_ALERTS alerts, MAX_BYTES of JSON), each its own
request: Alertmanager refuses a whole body for one malformed alert (400), and a proxy before it
refuses a body over its limit (413; nginx's default is 1 MB, ~700 of our alerts). One request of
everything would then fail every re-send, and Alertmanager resolve every alert of the box. A batch
every replica refused for its content is split in halves, down to the one alert refused, so the
others still fire; a temporary failure of every replica stops the batches left (they would wait
out the same timeout), and the next re-send tries them all again.

Neither the password nor the bearer token appears in a message: every error text is scrubbed, and
a replica is named by its URL without user info.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ..redact import remember, scrub
from .delivery import Delivery

log = logging.getLogger("lossguard")
API = "/api/v2/alerts"
FIXES = {
    401: "Alertmanager (or the proxy before it) wants credentials: set [alertmanager] username/password or bearer_token",
    403: "the credentials were refused: check [alertmanager] username/password or bearer_token",
    404: "no Alertmanager API at this URL: give the Alertmanager's address (with its --web.route-prefix, if any)",
    400: "Alertmanager refused the alerts as malformed",
    413: "the body is too large for Alertmanager or the proxy before it",
}
REST = 30.0
SPLIT = (400, 413)
"""Refusals of a body's content: a part of it may well pass."""
MAX_ALERTS = 100
MAX_BYTES = 256 * 1024
"""A batch's bounds: well under the 1 MB a proxy commonly takes, and each request short."""


def shown(url: str) -> str:
    """A replica's URL as logs show it: no user info, query or fragment."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path.rstrip('/')}"


class AlertmanagerClient:
    """Posts alerts to every replica. `timeout` bounds each request; retrying is the outbox's job
    (a temporary failure leaves the entry for the next round)."""

    def __init__(
        self, urls: Sequence[str], *, username: str | None = None, password: str | None = None,
        bearer_token: str | None = None, ca_file: Path | None = None, timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json", "User-Agent": "lossguard"}
        if bearer_token:
            remember(bearer_token)
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        elif username is not None or password:
            remember(password or "")
            pair = base64.b64encode(f"{username or ''}:{password or ''}".encode()).decode()
            remember(pair)
            self._headers["Authorization"] = f"Basic {pair}"
        self._context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
        # No proxy from the environment: Alertmanager is reached directly (its HA docs forbid
        # anything in between), and a proxy would see the credentials.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self._context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self._context))
        self._opener = urllib.request.build_opener(*handlers)
        self._down: set[str] = set()
        self._rest_until: dict[str, float] = {}
        self.clock = clock

    def __repr__(self) -> str:
        return f"AlertmanagerClient(urls={[shown(u) for u in self.urls]!r})"

    def post(self, alerts: list[dict]) -> Delivery:
        """Every replica gets `alerts`; accepted when one of them took it (see the module's doc)."""
        return self._post(json.dumps(alerts).encode())[0]

    def post_batches(self, alerts: list[dict], *, count: int = MAX_ALERTS, size: int = MAX_BYTES) -> list[tuple[list[dict], Delivery]]:
        """`alerts` in bounded batches, each with how it went (see the module's doc). A batch refused
        for its content is split until the alert refused stands alone; batches after a temporary
        failure of every replica are not sent (none of them is in the answer)."""
        done: list[tuple[list[dict], Delivery]] = []
        todo = batches(alerts, count=count, size=size)
        while todo:
            batch = todo.pop(0)
            delivery, content = self._post(json.dumps(batch).encode())
            if content and len(batch) > 1:
                todo[:0] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
                continue
            done.append((batch, delivery))
            if not delivery.ok and not delivery.permanent:
                break
        return done

    def _post(self, body: bytes) -> tuple[Delivery, bool]:
        """How posting `body` to the replicas went, and whether every one of them refused its
        content (SPLIT): then a part of it may pass."""
        failures, codes = [], set()
        now = self.clock()
        awake = [u for u in self.urls if self._rest_until.get(u, -1e18) <= now] or self.urls
        for url in self.urls:
            if url not in awake:
                failures.append(Delivery(ok=False, error=f"{shown(url)}: resting after a failure", permanent=False))
                continue
            failure, code = self._post_one(url, body)
            codes.add(code)
            if failure is None:
                self._rest_until.pop(url, None)
                if url in self._down:
                    self._down.discard(url)
                    log.info("alertmanager %s accepts alerts again", shown(url))
            else:
                failures.append(failure)
                if not failure.permanent:
                    self._rest_until[url] = now + REST
                if url not in self._down and len(self.urls) > 1:
                    self._down.add(url)
                    log.warning("an alertmanager replica failed, %s; sending to the others (re-sends catch it up when it is back)", failure.describe())
        if len(failures) < len(self.urls):
            return Delivery(ok=True), False
        content = codes <= set(SPLIT)
        if len(failures) == 1:
            return failures[0], content
        permanent = all(f.permanent for f in failures)
        return Delivery(ok=False, error="; ".join(f.error or "" for f in failures), permanent=permanent, fix=failures[0].fix if permanent else None), content

    def _post_one(self, url: str, body: bytes) -> tuple[Delivery | None, int | None]:
        """None when `url` took `body`, else why not; and the HTTP status it answered, if any."""
        request = urllib.request.Request(url + API, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                response.read()
            return None, None
        except urllib.error.HTTPError as exc:
            text = scrub(exc.read(500).decode("utf-8", "replace").strip())
            permanent = 400 <= exc.code < 500 and exc.code not in (408, 429)
            error = f"{shown(url)}: HTTP {exc.code}" + (f": {text[:200]}" if text else "")
            return Delivery(ok=False, error=scrub(error), permanent=permanent, fix=FIXES.get(exc.code) if permanent else None), exc.code
        except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, reset, timeout, TLS, DNS
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            error = scrub(f"{shown(url)}: {type(reason).__name__}: {reason}")
            if isinstance(reason, ssl.SSLCertVerificationError):  # a configuration problem: retrying will not fix it
                return Delivery(ok=False, error=error, permanent=True, fix="the server's certificate is not trusted: set [alertmanager] ca_file"), None
            return Delivery(ok=False, error=error, permanent=False), None


def batches(alerts: list[dict], *, count: int = MAX_ALERTS, size: int = MAX_BYTES) -> list[list[dict]]:
    """`alerts` in order, cut into lists of at most `count` alerts and `size` bytes of JSON each (an
    alert bigger than `size` alone goes alone)."""
    out: list[list[dict]] = []
    batch: list[dict] = []
    used = 2  # the list's brackets
    for alert in alerts:
        weight = len(json.dumps(alert).encode()) + 2  # (and the ", " joining it)
        if batch and (len(batch) >= count or used + weight > size):
            out.append(batch)
            batch, used = [], 2
        batch.append(alert)
        used += weight
    if batch:
        out.append(batch)
    return out
