"""The one module that talks to apprise: notification URLs (`discord://`, `tgram://`, `mailto://`,
`ntfy://`, `json://`... one each for over a hundred services), each a sink of its own.

A URL is checked when the settings load (`url_problem`): an unknown scheme, or one missing what the
service needs (its token), is refused in one line naming the URL masked. apprise says why only in
its log, so its log lines are caught here, per thread (each sink sends on a thread of its own),
scrubbed and made the Delivery's error; they are never printed as apprise writes them: apprise
names whole URLs, secrets and all, in its debug and error lines (`Could not load Discord URL:
discord://...`). Its logger is kept at WARNING and propagates nothing.

apprise answers a send with True or False. Its plugins end a refusal's log line with the HTTP status
(`error=401.`): a 4xx other than 408 and 429 is permanent (the URL's token or target is wrong: said
once, the notice waits in the outbox for the fix); anything else (a 5xx, a refused connection, a
timeout) is retried ATTEMPTS times with a doubling wait, then the sink's round ends and the next
round tries again. Every sink has its own dispatcher and thread, so a service that hangs or fails
delays no other.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import ConfigError
from ..escaping import printable
from ..redact import MASK, Scrubbed, mask_service_url, remember_service_url, scrub
from . import notify_text
from .delivery import Delivery, Manners, Post
from .pipeline import SEVERITY_RANK
from .plots import Plot

ATTEMPTS = 3
BURST = 3
"""New incidents waiting at once for a URL that go out as one message (Slack's default group size):
a push service rings once, and apprise spaces one URL's messages 5.5 s apart for the services that
name no pace of their own."""
BACKOFF = 0.5
"""Seconds before the second attempt; doubled before each next one (0.5 s, 1 s)."""
EXTRA = "pip install 'lossguard[notify]'"
_STATUS = re.compile(r"error=(\d{3})\b")
"""How apprise's plugins end a refusal's log line."""
PERMANENT_FIX = "the service refused the URL (a wrong token, user or target?): fix the URL in [notify] urls"


class _Heard(logging.Handler):
    """apprise's log lines from the current thread while `listen` is open, scrubbed; never printed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        lines = getattr(self._local, "lines", None)
        if lines is not None:
            lines.append(scrub(printable(record.getMessage())))

    @contextmanager
    def listen(self) -> Iterator[list[str]]:
        self._local.lines = lines = []
        try:
            yield lines
        finally:
            self._local.lines = None


_HEARD = _Heard()


def _apprise():  # noqa: ANN202 - the module, imported on first use (only with URLs configured)
    try:
        import apprise
    except ImportError:
        raise ConfigError(f"notification URLs need apprise: {EXTRA}") from None
    log = logging.getLogger("apprise")
    if _HEARD not in log.handlers:
        log.handlers[:] = [_HEARD]
        log.propagate = False
        log.setLevel(logging.WARNING)  # (its debug lines hold whole URLs: never even formatted)
        # requests' connection pool logs each request line at debug, a query's token with it
        pool = logging.getLogger("urllib3.connectionpool")
        if not any(isinstance(f, Scrubbed) for f in pool.filters):
            pool.addFilter(Scrubbed())
    return apprise


def _reason(heard: list[str]) -> str:
    """What apprise said, as the rest of an error line naming the URL masked."""
    said = [line.replace(MASK, "").strip(" :.") for line in heard]
    specific = [line for line in said if line and not line.startswith(("Unparseable", "Could not load"))]
    return specific[0] if specific else ""


def url_problem(url: str) -> str | None:
    """Why apprise cannot send to `url` (masked nowhere: the caller names it masked), or None."""
    apprise = _apprise()
    remember_service_url(url)
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if not scheme or scheme not in apprise.NotificationManager():
        return f"has an unknown scheme{f' {printable(scheme)!r}' if scheme else ''} (apprise's services and their URLs: https://github.com/caronc/apprise/wiki)"
    with _HEARD.listen() as heard:
        plugin = apprise.Apprise.instantiate(url)
    if plugin is None:
        why = _reason(heard)
        return f"cannot be used: {why}" if why else "is missing what the service needs (see its URL form at https://github.com/caronc/apprise/wiki)"
    return None


def sink_names(urls: list[str]) -> list[str]:
    """A name per URL for the outbox and the logs: `notify-<scheme>`, then `-2`, `-3`... for more of
    one scheme. Kept across restarts while the URLs of a scheme keep their order (a token replaced
    in place keeps its notices waiting for it), and never made of a secret."""
    seen: dict[str, int] = {}
    names = []
    for url in urls:
        scheme = re.sub(r"[^a-z0-9]", "", url.partition("://")[0].lower()) or "url"
        seen[scheme] = seen.get(scheme, 0) + 1
        names.append(f"notify-{scheme}" + (f"-{seen[scheme]}" if seen[scheme] > 1 else ""))
    return names


class NotifySink:
    """One notification URL: each notice one message (no threads: a follow-up names its opening),
    in the service's markup, the incident's picture attached after its alert where the service takes
    attachments."""

    manners = Manners(group_threshold=BURST)

    def __init__(self, url: str, *, name: str, host: str, attempts: int = ATTEMPTS, backoff: float = BACKOFF,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        apprise = _apprise()
        remember_service_url(url)
        with _HEARD.listen() as heard:
            plugin = apprise.Apprise.instantiate(url)
        self.shown = mask_service_url(url)
        if plugin is None:
            raise ConfigError(f"{self.shown} cannot be used: {_reason(heard) or 'apprise refused it'}")
        self._plugin = plugin
        self._types = apprise.NotifyType
        self.name = name
        self.host = host
        self.attempts, self.backoff, self.sleep = attempts, backoff, sleep
        resolve = getattr(plugin, "resolve_format", None)
        chosen = resolve(None) if resolve is not None else plugin.notify_format
        self.format = str(getattr(chosen, "value", chosen))
        """The markup the service reads (apprise's choice for it, or the URL's `format=`)."""
        if self.format not in notify_text.FORMATS:
            self.format = "text"
        self.title_apart = plugin.title_maxlen > 0
        """The service shows a title of its own; else apprise puts it at the top of the body."""
        self.takes_plots = bool(plugin.attachment_support)
        self._lock = threading.Lock()
        """One send at a time: the sender's thread posts alerts, the plotter's pictures, through one
        apprise object (whose pacing and connection state are its own)."""

    def __repr__(self) -> str:
        return f"NotifySink({self.name}, {self.shown})"

    def send(self, post: Post) -> Delivery:
        if post.summary and len(post.entries) > 1:
            notices = [e.notice for e in post.entries]
            title, body = notify_text.burst(notices, fmt_name=self.format, host=self.host, title_apart=self.title_apart)
            worst = max(notices, key=lambda n: SEVERITY_RANK.get(n.severity or "", 0))
            return self._notify(title, body, self._type_of(worst.kind, worst.severity))
        for entry in post.entries:
            title, body = notify_text.render(entry.notice, fmt_name=self.format, host=self.host, opened_at=entry.opened_at,
                                             title_apart=self.title_apart)
            delivery = self._notify(title, body, self._type_of(entry.notice.kind, entry.notice.severity))
            if not delivery.ok:
                return delivery
        return Delivery(ok=True)

    def send_plot(self, plot: Plot) -> Delivery:
        """The incident's PNG as an attachment of a message of its own, after its alert."""
        if not self.takes_plots:
            return Delivery(ok=False, error=f"{self.shown} takes no attachments", permanent=True)
        body = notify_text.plot_caption(plot.title, fmt_name=self.format)
        return self._notify(f"lossguard plot: {plot.title}", body, self._types.INFO, attach=str(plot.path))

    def test(self) -> Delivery:
        """`lossguard alert test`'s message, tried once: the test says at once what is wrong."""
        title, body = notify_text.greeting(fmt_name=self.format, host=self.host)
        return self._once(title, body, self._types.INFO, None)

    def _type_of(self, kind: str, severity: str | None):  # noqa: ANN202 - apprise's NotifyType
        if kind in ("resolved", "resumed"):
            return self._types.SUCCESS
        return {"critical": self._types.FAILURE, "info": self._types.INFO}.get(severity or "", self._types.WARNING)

    def _notify(self, title: str, body: str, kind, *, attach: str | None = None) -> Delivery:  # noqa: ANN001
        """One message, tried up to `attempts` times while the failure is worth another try."""
        delivery = Delivery(ok=False, error="not sent")
        for attempt in range(self.attempts):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            delivery = self._once(title, body, kind, attach)
            if delivery.ok or delivery.permanent:
                return delivery
        return delivery

    def _once(self, title: str, body: str, kind, attach: str | None) -> Delivery:  # noqa: ANN001
        with self._lock, _HEARD.listen() as heard:
            try:
                ok = self._plugin.notify(body=body, title=title, notify_type=kind, body_format=self.format, attach=attach)
            except Exception as exc:  # noqa: BLE001 - apprise's refusal of the message itself (a disabled service)
                return Delivery(ok=False, error=scrub(f"{self.shown}: {type(exc).__name__}: {exc}"), permanent=True, fix=PERMANENT_FIX)
        if ok:
            return Delivery(ok=True)
        said = "; ".join(dict.fromkeys(line for line in heard if line))[:300] or "the service did not take it"
        status = _STATUS.search(said)
        code = int(status.group(1)) if status else None
        permanent = code is not None and 400 <= code < 500 and code not in (408, 429)
        return Delivery(ok=False, error=f"{self.shown}: {said}", permanent=permanent, fix=PERMANENT_FIX if permanent else None)


def notify_sinks(urls: list[str], *, host: str) -> dict[str, NotifySink]:
    """A sink for each URL, by its name (see `sink_names`)."""
    return {name: NotifySink(url, name=name, host=host) for name, url in zip(sink_names(urls), urls)}
