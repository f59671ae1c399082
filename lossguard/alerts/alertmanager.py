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
}
REST = 30.0


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
        body = json.dumps(alerts).encode()
        failures = []
        now = self.clock()
        awake = [u for u in self.urls if self._rest_until.get(u, -1e18) <= now] or self.urls
        for url in self.urls:
            if url not in awake:
                failures.append(Delivery(ok=False, error=f"{shown(url)}: resting after a failure", permanent=False))
                continue
            failure = self._post_one(url, body)
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
            return Delivery(ok=True)
        if len(failures) == 1:
            return failures[0]
        permanent = all(f.permanent for f in failures)
        return Delivery(ok=False, error="; ".join(f.error or "" for f in failures), permanent=permanent, fix=failures[0].fix if permanent else None)

    def _post_one(self, url: str, body: bytes) -> Delivery | None:
        request = urllib.request.Request(url + API, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                response.read()
            return None
        except urllib.error.HTTPError as exc:
            text = scrub(exc.read(500).decode("utf-8", "replace").strip())
            permanent = 400 <= exc.code < 500 and exc.code not in (408, 429)
            error = f"{shown(url)}: HTTP {exc.code}" + (f": {text[:200]}" if text else "")
            return Delivery(ok=False, error=scrub(error), permanent=permanent, fix=FIXES.get(exc.code) if permanent else None)
        except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, reset, timeout, TLS, DNS
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            error = scrub(f"{shown(url)}: {type(reason).__name__}: {reason}")
            if isinstance(reason, ssl.SSLCertVerificationError):  # a configuration problem: retrying will not fix it
                return Delivery(ok=False, error=error, permanent=True, fix="the server's certificate is not trusted: set [alertmanager] ca_file")
            return Delivery(ok=False, error=error, permanent=False)
