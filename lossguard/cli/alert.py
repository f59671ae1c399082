"""`lossguard alert test`: a test message to Slack and to every notification URL, and a test alert
to every Alertmanager replica, each said delivered or why not, so a sink is known to work before the first spike needs it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from ..escaping import printable
from ..redact import scrub
from .config_file import configured
from .exits import EXIT_OK, EXIT_USAGE
from .help_text import Formatter


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "alert",
        help="alert sinks: send a test message to Slack and the notification URLs, a test alert to Alertmanager",
        formatter_class=Formatter,
        description="`alert test` posts a test message with the configured Slack bot token (LOSSGUARD_SLACK_TOKEN +\n"
        "LOSSGUARD_SLACK_CHANNEL) or webhook (LOSSGUARD_SLACK_WEBHOOK_URL), and a test alert (alertname\n"
        "LossguardTest, severity info, resolved by itself after 5 minutes) to every configured Alertmanager\n"
        "replica, and a test message to every notification URL ([notify] urls, LOSSGUARD_NOTIFY_URLS), and\n"
        "(with an app-level token) asks Slack for a Socket Mode connection, and says exactly what\n"
        "went wrong where it fails. Exit 0 when every one took it; 2 when one\n"
        "refused it or nothing is configured (exit 1 means \"spikes found\" everywhere in lossguard).",
        epilog="Example:\n  LOSSGUARD_SLACK_TOKEN=xoxb-... lossguard alert test --channel '#training'\n"
        "  lossguard alert test --config /etc/lossguard/lossguard.toml",
    )
    p.add_argument("action", choices=["test"], help="what to do")
    p.add_argument("--channel", help="channel to post to (default: LOSSGUARD_SLACK_CHANNEL)")
    p.add_argument("--config", type=Path, help="lossguard.toml with a [slack] table")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import socket

    from ..alerts.message import build_test
    from ..alerts.slack import SlackBot, client_from

    settings = configured(args)[0]
    channel = args.channel or settings.slack_channel
    if settings.slack_token is not None and not channel:
        raise UsageError("a bot token needs a channel: --channel or LOSSGUARD_SLACK_CHANNEL")
    sink = client_from(settings, channel=channel, retries=2)
    if sink is None and not settings.alertmanager_urls and not settings.notify_urls:
        raise UsageError(
            "no alert sink is configured: set LOSSGUARD_SLACK_TOKEN and LOSSGUARD_SLACK_CHANNEL, or LOSSGUARD_SLACK_WEBHOOK_URL, "
            "or [alertmanager] urls, or [notify] urls"
        )
    failed = False
    if sink is not None:
        target = f"channel {printable(channel)}" if isinstance(sink, SlackBot) else "the incoming webhook"
        delivery = sink.post(build_test(host=socket.gethostname(), channel=channel))
        failed |= _said(delivery, f"test message to Slack {target}")
    if settings.slack_app_token is not None:  # (the buttons: Slack must open Socket Mode for the app token)
        from ..alerts.slack import check_app_token

        failed |= _said(check_app_token(settings.slack_app_token.get_secret_value(), base_url=settings.slack_base_url),
                        "Socket Mode for the buttons (app-level token)", ok="opens")
    if settings.alertmanager_urls:
        import time

        from ..alerts.alertmanager import shown
        from ..alerts.labels import test_alert
        from ..alerts.sinks import alertmanager_client

        alert = test_alert(now=time.time(), host=settings.alertmanager_host or socket.gethostname(), extra=settings.alertmanager_extra_labels)
        for url in settings.alertmanager_urls:  # each replica on its own: one that refuses is named
            failed |= _said(alertmanager_client(settings, [url]).post([alert]), f"test alert to Alertmanager {shown(url)}")
    if settings.notify_urls:
        from ..alerts.notify import notify_sinks

        for each in notify_sinks([u.get_secret_value() for u in settings.notify_urls], host=socket.gethostname()).values():
            failed |= _said(each.test(), f"test message to {each.name} ({each.shown})")
    return EXIT_USAGE if failed else EXIT_OK


def _said(delivery, what: str, *, ok: str = "delivered") -> bool:  # noqa: ANN001
    """Print how a test delivery went; True when it failed."""
    if delivery.ok:
        print(f"{what}: {ok}")
        return False
    print(f"lossguard: {what} failed: {scrub(printable(delivery.describe()))}", file=sys.stderr)
    return True
