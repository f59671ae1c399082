"""Slack delivery through the real slack-sdk, against a local server that answers like Slack; we
assert on what the server received, not on our own calls."""

from __future__ import annotations

import time

import pytest

from lossguard.alerts.message import build
from lossguard.alerts.slack import SlackBot, SlackWebhook
from lossguard.cli import main
from lossguard.detection.engine import analyse_run
from lossguard.detection.rules import default_rules

from . import synth
from .conftest import PROXY_VARIABLES
from .slack_server import Answer

TOKEN = "xoxb-0000-SECRET-TOKEN"


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _message():
    inc = analyse_run(synth.long_frame("gradient_explosion"), default_rules(), run="exp/7b").incidents[0]
    return build(inc, host="gpu-node-3", source="/runs/exp/7b/train.log", spark=(1.0, 1.1, 5.0, 1.0))


def test_post_sends_token_channel_text_and_blocks(slack):
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01)
    delivery = bot.post(_message())
    assert delivery.ok and delivery.ts == "1700000000.000001"
    (req,) = slack.requests
    assert req.path == "/api/chat.postMessage"
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.body["channel"] == "#training"
    assert "exp/7b" in req.body["text"] and "step 701" in req.body["text"]
    assert req.body["blocks"][0]["type"] == "header"


def test_thread_reply_and_parent_update_carry_the_thread_ts(slack):
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01)
    parent = bot.post(_message())
    bot.post(_message(), thread_ts=parent.ts)
    bot.update(_message(), ts=parent.ts, channel="C0TEST")
    assert slack.requests[1].body["thread_ts"] == parent.ts
    assert slack.requests[2].path == "/api/chat.update" and slack.requests[2].body["ts"] == parent.ts


def test_rate_limit_waits_for_retry_after_then_delivers(slack):
    slack.queue.append(Answer(status=429, body={"ok": False, "error": "ratelimited"}, headers={"Retry-After": "1"}))
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01)
    start = time.monotonic()
    assert bot.post(_message()).ok
    assert time.monotonic() - start >= 1.0
    assert len(slack.requests) == 2


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_error_then_ok_is_retried(slack, status):
    slack.queue.append(Answer(status=status, body={"ok": False, "error": "fatal_error"}))
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01)
    assert bot.post(_message()).ok
    assert len(slack.requests) == 2


def test_connection_reset_is_retried(slack):
    slack.queue.append(Answer(drop=True))
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01)
    assert bot.post(_message()).ok
    assert len(slack.requests) == 2


@pytest.mark.parametrize("error", ["invalid_auth", "not_authed", "token_revoked", "channel_not_found", "not_in_channel", "is_archived", "missing_scope"])
def test_ok_false_permanent_errors_are_not_retried_and_say_the_fix(slack, error):
    slack.queue.append(Answer(status=200, body={"ok": False, "error": error}))
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01)
    delivery = bot.post(_message())
    assert not delivery.ok and delivery.permanent and delivery.error == error and delivery.fix
    assert len(slack.requests) == 1
    assert TOKEN not in delivery.describe()


def test_ok_false_unknown_error_is_temporary(slack):
    slack.queue.append(Answer(status=200, body={"ok": False, "error": "internal_error"}))
    delivery = SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01).post(_message())
    assert not delivery.ok and not delivery.permanent


def test_slow_server_times_out_as_a_temporary_failure(slack):
    slack.queue.extend([Answer(delay=2.5)] * 3)
    bot = SlackBot(TOKEN, "#training", base_url=slack.base_url, timeout=1, retries=1, backoff=0.01)
    delivery = bot.post(_message())
    assert not delivery.ok and not delivery.permanent
    assert TOKEN not in delivery.describe()


def test_webhook_posts_and_classifies_its_errors(slack):
    hook = SlackWebhook(slack.webhook_url, backoff=0.01)
    assert hook.post(_message()).ok
    assert slack.requests[0].path.startswith("/hooks/") and slack.requests[0].body["blocks"]
    slack.queue.append(Answer(status=404, body="no_service"))
    failed = hook.post(_message())
    assert failed.permanent and failed.error == "no_service" and "webhook" in failed.fix
    assert "XXXXSECRETXXXX" not in failed.describe() and "XXXXSECRETXXXX" not in repr(hook)


def test_alert_test_command_reports_success_and_failure(slack, monkeypatch, capsys):
    monkeypatch.setenv("LOSSGUARD_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("LOSSGUARD_SLACK_BASE_URL", slack.base_url)
    assert main(["alert", "test", "--channel", "#oncall"]) == 0
    assert "test message to Slack channel #oncall: delivered" in capsys.readouterr().out
    assert slack.requests[-1].body["channel"] == "#oncall"
    slack.queue.append(Answer(body={"ok": False, "error": "not_in_channel"}))
    assert main(["alert", "test", "--channel", "#oncall"]) == 2  # refused: a config error, never "spikes found"
    err = capsys.readouterr().err
    assert "not_in_channel" in err and "/invite" in err and TOKEN not in err


def test_alert_test_without_configuration_is_a_usage_error(monkeypatch, capsys):
    for name in ("LOSSGUARD_SLACK_TOKEN", "LOSSGUARD_SLACK_WEBHOOK_URL", "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["alert", "test"]) == 2
    assert "no alert sink is configured" in capsys.readouterr().err


def test_token_from_the_systemd_credentials_directory_is_used_and_masked(tmp_path, monkeypatch):
    from lossguard.watch.settings import load_settings

    (tmp_path / "slack_token").write_text(TOKEN + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("LOSSGUARD_SLACK_TOKEN", raising=False)
    settings = load_settings()
    assert settings.slack_token.get_secret_value() == TOKEN
    assert TOKEN not in repr(settings) and TOKEN not in str(settings.masked())
    assert settings.masked()["slack_token"] == "********** (set)"


def test_scan_posts_a_digest_to_slack(slack, monkeypatch, capsys):
    from .conftest import FIXTURES

    monkeypatch.setenv("LOSSGUARD_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("LOSSGUARD_SLACK_CHANNEL", "#nightly")
    monkeypatch.setenv("LOSSGUARD_SLACK_BASE_URL", slack.base_url)
    assert main(["scan", str(FIXTURES / "runs"), "--quiet", "--format", "markdown", "--slack-digest"]) == 1
    (req,) = slack.requests
    assert req.body["channel"] == "#nightly"
    assert "12 finding(s) in 6 of 8 run(s): 10 spikes, 1 NaN, 1 Inf" in req.body["text"] and "megatron-grad-explosion" in req.body["text"]
    assert TOKEN not in capsys.readouterr().err


def test_the_scan_digest_leaves_out_what_the_daemons_silences_cover(slack, monkeypatch, tmp_path):
    from lossguard.state import State

    from .conftest import FIXTURES

    monkeypatch.setenv("LOSSGUARD_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("LOSSGUARD_SLACK_CHANNEL", "#nightly")
    monkeypatch.setenv("LOSSGUARD_SLACK_BASE_URL", slack.base_url)
    monkeypatch.setenv("LOSSGUARD_STATE_DIR", str(tmp_path / "state"))
    state = State(tmp_path / "state")
    now = __import__("time").time()
    state.add_silence(run="megatron-*", rule=None, metric=None, cause=None, starts=now, ends=now + 60, comment="known", author="ana")
    state.add_silence(run="*", rule=None, metric=None, cause=None, starts=now - 60, ends=now - 1, comment="over", author="ana")
    state.close()
    assert main(["scan", str(FIXTURES / "runs"), "--quiet", "--format", "json", "--slack-digest"]) == 1
    (req,) = slack.requests
    assert "megatron-grad-explosion" not in req.body["text"] and "finding(s) in 6 of 8 run(s)" in req.body["text"]
    assert "finding(s) silenced, not listed" in req.body["text"]


def test_a_state_that_cannot_be_read_costs_the_digest_its_filter_not_the_digest(slack, monkeypatch, tmp_path, capsys):
    from .conftest import FIXTURES

    monkeypatch.setenv("LOSSGUARD_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("LOSSGUARD_SLACK_CHANNEL", "#nightly")
    monkeypatch.setenv("LOSSGUARD_SLACK_BASE_URL", slack.base_url)
    monkeypatch.setenv("LOSSGUARD_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.db").write_bytes(b"not a database" * 100)
    assert main(["scan", str(FIXTURES / "runs"), "--quiet", "--format", "json", "--slack-digest"]) == 1
    (req,) = slack.requests
    assert "megatron-grad-explosion" in req.body["text"]
    assert "cannot read the silences" in capsys.readouterr().err
