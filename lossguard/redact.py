"""Slack secrets out of every string lossguard shows: a bot token or an incoming webhook's URL must
never reach a log line, an exception message, a report or the terminal, not even when a server
echoes it back in an error (some proxies and gateways answer with the request's Authorization
header or URL).

`scrub` removes what looks like a secret (xox*- tokens, `Bearer ...`, hooks.slack.com webhook
paths) and every secret this process was given (`remember`: settings call it when they load one,
the Slack clients when they are built). It keeps the configured values, not just the patterns,
because a GovSlack or test server's webhook looks like no Slack URL, and an echo may quote only its
path or its last segment.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import SplitResult, unquote, urlsplit

from .escaping import printable

MASK = "***"
MIN_SECRET = 6
"""Shorter pieces are not remembered: masking every "api" in a message would hide more than it saves."""

_PATTERNS = [
    (re.compile(r"\b(xox[a-z]|xapp)-[A-Za-z0-9-]+"), rf"\1-{MASK}"),
    (re.compile(r"\b(Bearer\s+)[^\s'\",;}]+", re.IGNORECASE), rf"\g<1>{MASK}"),
    # services/T.../B.../<secret>: the workspace and app ids stay (they say which webhook it was);
    # actions/ and commands/ are an envelope's response_url, a capability to post for 30 minutes
    (re.compile(r"(hooks\.slack(?:-gov)?\.com(?:\\?/)+(?:services|workflows|triggers|actions|commands)(?:\\?/)+(?:[A-Z0-9]+\\?/){0,2})"
                r"[^\s'\"<>/\\]+"), rf"\g<1>{MASK}"),
    # what an envelope (or any JSON or repr of a dict) holds under a key naming a capability: its
    # response_url wherever it points, the verification token, a trigger_id (opens a modal)
    (re.compile(r"""(\\?["'](?:\w*token|\w*secret|password|response_url|trigger_id|authorization)\\?["']\s*:\s*\\?["'])(?:\\/|[^"'\\])+""",
                re.IGNORECASE), rf"\g<1>{MASK}"),
    (re.compile(r"([?&]ticket=)[^&\s'\"]+"), rf"\g<1>{MASK}"),  # a Socket Mode URL's one-time ticket
]
_known: set[str] = set()


def remember(secret: str) -> None:
    """Mask `secret` in everything scrubbed from now on; for a URL also its path and its last
    segment (the webhook's own secret), which is what an echo of the request line shows."""
    secret = secret.strip()
    pieces = {secret}
    if "/" in secret:
        parts = urlsplit(secret)
        pieces.add(parts.path)
        pieces.add(secret.rstrip("/").rsplit("/", 1)[-1])
    # A secret holding a control character (a line break pasted with it) is shown escaped by an
    # error that quotes it (`'...SECRET\\rx'`): its escaped forms, and its runs between such
    # characters, are masked as well.
    for piece in list(pieces):
        if _BREAKS.search(piece):
            pieces.update((repr(piece)[1:-1], printable(piece), *_BREAKS.split(piece)))
    _known.update(p for p in pieces if len(p) >= MIN_SECRET)


_BREAKS = re.compile(r"[\x00-\x20\x7f]+")


def scrub(text: str) -> str:
    """`text` with every remembered secret and everything shaped like a Slack secret masked."""
    for secret in sorted(_known, key=len, reverse=True):  # a whole URL before its own path
        text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def mask_token(value: str) -> str:
    """A token as an error may name it: its kind (xoxb-, xapp-) and nothing of the rest."""
    kind = re.match(r"(xox[a-z]|xapp)-", value)
    return f"{kind.group(0)}{MASK}" if kind else MASK


def mask_url(url: str) -> str:
    """A webhook URL as it may be shown: scheme, host and path with the last segment (the secret)
    masked; no user info, query or fragment. A URL too broken to split shows only up to its last
    slash."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme and parts.netloc:
        port = _port(parts)
        head, path = f"{parts.scheme}://{parts.hostname or ''}{f':{port}' if port else ''}", parts.path
    else:
        head, path = "", url.split("?", 1)[0].split("#", 1)[0]
    if "/" not in path.strip("/"):
        return f"{head}/{MASK}" if head else MASK
    return f"{head}{path.rstrip('/').rsplit('/', 1)[0]}/{MASK}"


def _port(parts: SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:  # a port that is no number
        return None


class Scrubbed(logging.Filter):
    """A logger's records scrubbed where they are made, so that no handler (the daemon's, a test's,
    an embedding program's) ever holds the secret: for loggers that are handed text lossguard does
    not write (slack-sdk's, which logs what it sends and receives at debug level)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrub(record.getMessage()), None
        return True


def mask_service_url(url: str) -> str:
    """A notification service's URL (apprise's `scheme://...`) as it may be shown: its scheme, and
    its host only where the host is a machine's name (holds a dot, or is localhost) with its port;
    everything else masked. Such URLs keep secrets anywhere: in the user info, the path, the query,
    and in the host itself (`pagerduty://key@apikey`, `discord://webhook_id/token`)."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,31}", scheme):
        return MASK
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not (("." in host or host == "localhost") and re.fullmatch(r"[A-Za-z0-9.:-]+", host)):
        return f"{scheme.lower()}://{MASK}"
    port = _port(parts)
    return f"{scheme.lower()}://{host}{f':{port}' if port else ''}/{MASK}"


def remember_service_url(url: str) -> None:
    """Mask a notification service's URL in everything scrubbed from now on, and each piece of it
    that may be a secret: its user info, its host where `mask_service_url` hides it, every path
    segment and query value (an echo or a library's log line may quote any one of them)."""
    url = url.strip()
    remember(url)
    parts = urlsplit(url)
    shown = mask_service_url(url)
    pieces = [parts.netloc.rpartition("@")[0], parts.username or "", parts.password or "", *parts.path.split("/"),
              *(value for _, _, value in (pair.partition("=") for pair in parts.query.split("&")))]
    if f"://{MASK}" in shown:  # (a bot's id:token, an API key: the pieces around its colons too)
        host = parts.netloc.rpartition("@")[2]
        pieces += [host, *host.split(":")]
    for piece in pieces:
        if len(piece.strip()) >= MIN_SECRET:
            _known.add(piece.strip())
            decoded = unquote(piece.strip())
            if len(decoded) >= MIN_SECRET:
                _known.add(decoded)
