"""The one module that talks to Slack (slack-sdk), and turns its errors into lossguard's.

Delivery answers "did it work, and if not, is it worth trying again": slack-sdk's retry handlers
own the waiting (429 honours Retry-After; 5xx and dropped connections back off with jitter); what is
left after them is classified here. HTTP 200 with `ok: false` is a failure. Errors that retrying
cannot fix (a revoked token, a missing channel) are permanent, with the fix spelled out. Neither the
token nor the webhook URL appears in a message, an exception or a log line: every error text that
leaves this module is scrubbed (`redact`), including what the server said, which a proxy or a
misbehaving server may have filled with the request's Authorization header or URL.
"""

from __future__ import annotations

import socket
import urllib.error
from pathlib import Path

from slack_sdk import WebClient
from slack_sdk.web import SlackResponse
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler, RetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.http_retry.jitter import RandomJitter
from slack_sdk.webhook import WebhookClient

from ..redact import remember, scrub
from .delivery import Delivery
from .message import Message

DEFAULT_BASE_URL = "https://slack.com/api/"

PERMANENT = {
    "invalid_auth": "the token is not valid: check LOSSGUARD_SLACK_TOKEN (or the slack_token credential)",
    "not_authed": "no token was sent: set LOSSGUARD_SLACK_TOKEN (or the slack_token credential)",
    "token_revoked": "the token was revoked: create a new bot token and install it",
    "account_inactive": "the token's user or app is deactivated: reinstall the Slack app",
    "channel_not_found": "the channel does not exist or the bot cannot see it: check LOSSGUARD_SLACK_CHANNEL",
    "not_in_channel": "the bot is not in the channel: invite it with /invite @<bot> in that channel",
    "is_archived": "the channel is archived: unarchive it or pick another channel",
    "missing_scope": "the bot token lacks a scope: add chat:write (and files:write for plots) and reinstall",
    "invalid_token": "the webhook URL is not valid: create a new incoming webhook",
    "no_service": "the webhook was disabled or removed: create a new incoming webhook",
    "no_team": "the webhook's workspace is gone: create a new incoming webhook",
    "action_prohibited": "an admin restricted posting with this webhook",
    "channel_is_archived": "the webhook's channel is archived: create a webhook for another channel",
}


class _ServerErrorRetryHandler(RetryHandler):
    """Any 5xx is worth another try (slack-sdk's own handler only retries 500 and 503)."""

    def _can_retry(self, *, state, request, response=None, error=None) -> bool:  # noqa: ANN001
        return response is not None and 500 <= response.status_code < 600


def retry_handlers(*, retries: int = 4, backoff: float = 0.5) -> list[RetryHandler]:
    interval = BackoffRetryIntervalCalculator(backoff_factor=backoff, jitter=RandomJitter())
    return [
        ConnectionErrorRetryHandler(max_retry_count=retries, interval_calculator=interval,
                                    error_types=[urllib.error.URLError, ConnectionResetError, ConnectionRefusedError, socket.timeout, TimeoutError]),
        RateLimitErrorRetryHandler(max_retry_count=retries),
        _ServerErrorRetryHandler(max_retry_count=retries, interval_calculator=interval),
    ]


def _failure(error: str) -> Delivery:
    return Delivery(ok=False, error=scrub(error), permanent=error in PERMANENT, fix=PERMANENT.get(error))


def _broken(exc: Exception) -> Delivery:
    """No answer (or a request urllib refused to send): worth another try later."""
    return Delivery(ok=False, error=scrub(f"{type(exc).__name__}: {exc}"), permanent=False)


class SlackBot:
    """A bot token: threads, updates of the parent message."""

    def __init__(self, token: str, channel: str, *, base_url: str = DEFAULT_BASE_URL, timeout: int = 10, retries: int = 4, backoff: float = 0.5) -> None:
        if not base_url.endswith("/"):
            base_url += "/"
        remember(token)
        self.channel = channel
        self._client = WebClient(token=token, base_url=base_url, timeout=timeout, retry_handlers=retry_handlers(retries=retries, backoff=backoff))
        # (a lookup is not retried here: a failure is kept a while and the lookup made again after it)
        self._lookups = WebClient(token=token, base_url=base_url, timeout=timeout, retry_handlers=[])

    def __repr__(self) -> str:
        return f"SlackBot(channel={self.channel!r}, token=***)"

    def post(self, message: Message, *, thread_ts: str | None = None, channel: str | None = None) -> Delivery:
        return self._call("chat_postMessage", channel=channel or self.channel, thread_ts=thread_ts, **message.as_kwargs())

    def update(self, message: Message, *, ts: str, channel: str) -> Delivery:
        return self._call("chat_update", channel=channel, ts=ts, **message.as_kwargs())

    def ephemeral(self, text: str, *, channel: str, user: str) -> Delivery:
        """A line only `user` sees, in `channel` (the answer to a click)."""
        return self._call("chat_postEphemeral", channel=channel, user=user, text=text)

    def group_members(self, group: str) -> frozenset[str] | Delivery:
        """The users of a user group (usergroups:read), or why Slack would not say: asked once,
        however it fails (alerts.membership keeps the failure a while)."""
        response = _request(self._lookups, "usergroups_users_list", usergroup=group)
        if isinstance(response, Delivery):
            return response
        users = response.get("users")
        if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
            return Delivery(ok=False, error="the answer holds no list of user IDs", permanent=False)
        return frozenset(users)

    def upload(self, path: Path, *, channel: str, thread_ts: str, title: str) -> Delivery:
        """A file into a thread (files_upload_v2: get an upload URL, send the bytes there, complete
        the upload into the channel and thread). Needs the files:write scope."""
        return self._call("files_upload_v2", file=str(path), filename=path.name, title=title, channel=channel, thread_ts=thread_ts)

    def _call(self, method: str, **kwargs: object) -> Delivery:
        response = _request(self._client, method, **kwargs)
        if isinstance(response, Delivery):
            return response
        return Delivery(ok=True, ts=response.get("ts"), channel=response.get("channel"))


def _request(client: WebClient, method: str, **kwargs: object) -> SlackResponse | Delivery:
    """Slack's answer to one Web API call, or the failure it came to (after the client's retries)."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        return getattr(client, method)(**kwargs)
    except SlackApiError as exc:
        error = exc.response.get("error") if exc.response is not None else None
        status = exc.response.status_code if exc.response is not None else None
        if error:
            return _failure(str(error))
        return Delivery(ok=False, error=f"HTTP {status}" if status else "no answer", permanent=False)
    except (SlackClientError, OSError, ValueError) as exc:  # (URLError is an OSError; ValueError: a URL urllib refuses)
        return _broken(exc)


APP_PERMANENT = {
    "invalid_auth": "the app-level token is not valid: check LOSSGUARD_SLACK_APP_TOKEN (or the slack_app_token credential)",
    "not_authed": "no app-level token was sent: set LOSSGUARD_SLACK_APP_TOKEN (or the slack_app_token credential)",
    "token_revoked": "the app-level token was revoked: generate a new one (the app's Basic Information, App-Level Tokens)",
    "not_allowed_token_type": "that is no app-level token: generate one with connections:write (Basic Information, App-Level Tokens)",
    "missing_scope": "the app-level token lacks connections:write: generate one with that scope",
    "account_inactive": "the app is deactivated: reinstall the Slack app",
}
"""What apps.connections.open answers when retrying will not help, with the fix."""


def _app_failure(exc: SlackApiError) -> Delivery:
    error = str(exc.response.get("error") or "no answer") if exc.response is not None else "no answer"
    return Delivery(ok=False, error=scrub(error), permanent=error in APP_PERMANENT, fix=APP_PERMANENT.get(error))


def check_app_token(app_token: str, *, base_url: str = DEFAULT_BASE_URL) -> Delivery:
    """Whether Slack would open a Socket Mode connection for this app-level token (apps.connections.open,
    whose URL is then left unused): what `alert test` says of the buttons."""
    remember(app_token)
    web = WebClient(base_url=base_url if base_url.endswith("/") else base_url + "/", timeout=10, retry_handlers=retry_handlers(retries=1))
    try:
        web.apps_connections_open(app_token=app_token)
    except SlackApiError as exc:
        return _app_failure(exc)
    except (SlackClientError, OSError, ValueError) as exc:
        return _broken(exc)
    return Delivery(ok=True)


class SlackWebhook:
    """An incoming webhook: the simplest setup; no threads, no updates."""

    def __init__(self, url: str, *, timeout: int = 10, retries: int = 4, backoff: float = 0.5) -> None:
        remember(url)
        self._client = WebhookClient(url, timeout=timeout, retry_handlers=retry_handlers(retries=retries, backoff=backoff))

    def __repr__(self) -> str:
        return "SlackWebhook(url=***)"

    def post(self, message: Message, **_: object) -> Delivery:
        try:
            response = self._client.send(**message.as_kwargs())
        except (SlackClientError, OSError, ValueError) as exc:
            return _broken(exc)
        if response.status_code == 200:
            return Delivery(ok=True)
        body = (response.body or "").strip()
        if body in PERMANENT:
            return _failure(body)
        return Delivery(ok=False, error=f"HTTP {response.status_code}: {scrub(body)[:200]}", permanent=400 <= response.status_code < 500 and response.status_code != 429)


def client_from(settings, *, channel: str | None = None, retries: int = 4) -> SlackBot | SlackWebhook | None:  # noqa: ANN001
    """The Slack client the settings describe: a bot token with a channel first, else an incoming
    webhook; None when neither is configured."""
    channel = channel or settings.slack_channel
    if settings.slack_token is not None and channel:
        return SlackBot(settings.slack_token.get_secret_value(), channel, base_url=settings.slack_base_url, retries=retries)
    if settings.slack_webhook_url is not None:
        return SlackWebhook(settings.slack_webhook_url.get_secret_value(), retries=retries)
    return None
