"""No Slack token or webhook URL reaches anything lossguard prints: a malformed webhook URL is
refused at load with its secret masked, and what a server echoes back is scrubbed. The commands run
as real processes against the local Slack-like server; of the refusals at load, one case of each
command runs in a real process, the others in this one (the same line, without an interpreter start)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.redact import mask_url, scrub

from .conftest import run_lossguard_in_process
from .slack_server import Answer

TOKEN = "xoxb-1111-2222-ECHOEDSECRET"
HOOK_SECRET = "Zq8SECRETwebhookPART"


def _lossguard(*args: str, env: dict[str, str], cwd) -> subprocess.CompletedProcess:  # noqa: ANN001
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSGUARD_") and k != "CREDENTIALS_DIRECTORY"}
    return subprocess.run([sys.executable, "-m", "lossguard.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **env}, cwd=cwd)


def _in_process(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """_lossguard's case run in this process, from the same folder (where a lossguard.toml would be found)."""
    with contextlib.chdir(cwd):
        return run_lossguard_in_process(*args, env={"CREDENTIALS_DIRECTORY": None, **env})


@pytest.mark.parametrize("command", [
    pytest.param(["config", "check"], id="config check"),
    pytest.param(["alert", "test"], id="alert test"),
    pytest.param(["watch", "runs"], id="watch"),
])
def test_webhook_url_without_a_scheme_is_refused_at_load_in_one_line_with_its_secret_masked(tmp_path, command):
    url = f"hooks.slack.com/services/T0/B0/{HOOK_SECRET}"
    done = _lossguard(*command, env={"LOSSGUARD_SLACK_WEBHOOK_URL": url}, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "hooks.slack.com/services/T0/B0/***" in done.stderr and "https://" in done.stderr
    assert HOOK_SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("url, reason", [
    pytest.param("http://hooks.slack.com/services/T0/B0/" + HOOK_SECRET, "https", id="plain http to a remote host"),
    pytest.param("https:///services/T0/B0/" + HOOK_SECRET, "host", id="no host"),
    pytest.param("https://hooks.slack.com/", "path", id="no path"),
])
def test_webhook_url_that_cannot_work_is_refused_by_config_check(tmp_path, url, reason):
    run = _lossguard if reason == "https" else _in_process  # (one in a real process)
    done = run("config", "check", env={"LOSSGUARD_SLACK_WEBHOOK_URL": url}, cwd=tmp_path)
    assert done.returncode == 2 and reason in done.stderr
    assert HOOK_SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("broken", ["\r", "\n", "\t", " "], ids=["CR", "LF", "tab", "space"])
def test_a_webhook_url_holding_a_control_character_is_refused_at_load_and_no_piece_of_it_shows(tmp_path, broken):
    # Its secret reached `alert test`'s one-line error unmasked: the HTTP library quoted the path
    # with the control character escaped (`...SECRET\\rx`), which matched no remembered form.
    url = f"https://hooks.slack.com/services/T0/B0/{HOOK_SECRET}{broken}x"
    run = _lossguard if broken == "\r" else _in_process  # (one of each command in a real process)
    for command in (["alert", "test"], ["config", "check"]):
        done = run(*command, env={"LOSSGUARD_SLACK_WEBHOOK_URL": url}, cwd=tmp_path)
        assert done.returncode == 2 and "control character" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert HOOK_SECRET not in done.stdout + done.stderr and HOOK_SECRET[:8] not in done.stdout + done.stderr


def test_a_secret_holding_a_control_character_is_masked_however_an_error_quotes_it():
    from lossguard.redact import remember

    secret = "https://relay.example/services/T0/B0/" + HOOK_SECRET + "\rtail"
    remember(secret)
    for shown in (repr(secret), f"URL can't contain control characters. {repr('/services/T0/B0/' + HOOK_SECRET + chr(13) + 'tail')}", HOOK_SECRET):
        assert HOOK_SECRET not in scrub(shown), scrub(shown)


def test_webhook_on_this_machine_may_use_plain_http(tmp_path, slack):
    done = _lossguard("alert", "test", env={"LOSSGUARD_SLACK_WEBHOOK_URL": slack.webhook_url}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert slack.requests[0].path.startswith("/hooks/")


def test_alert_test_scrubs_a_token_the_server_echoes_in_its_error(tmp_path, slack):
    slack.queue.append(Answer(body=lambda req: {"ok": False, "error": f"bad request; Authorization: {req.headers['authorization']}"}))
    env = {"LOSSGUARD_SLACK_TOKEN": TOKEN, "LOSSGUARD_SLACK_BASE_URL": slack.base_url}
    done = _lossguard("alert", "test", "--channel", "#oncall", env=env, cwd=tmp_path)
    assert slack.requests[0].headers["authorization"] == f"Bearer {TOKEN}"  # the server did get it
    assert done.returncode == 2 and "Authorization: Bearer ***" in done.stderr
    assert "ECHOEDSECRET" not in done.stdout + done.stderr


def test_alert_test_scrubs_a_webhook_path_the_server_echoes_in_its_error(tmp_path, slack):
    slack.queue.append(Answer(status=400, body=lambda req: f"invalid_payload for POST {req.path}"))
    done = _lossguard("alert", "test", env={"LOSSGUARD_SLACK_WEBHOOK_URL": slack.webhook_url}, cwd=tmp_path)
    assert done.returncode == 2 and "invalid_payload for POST ***" in done.stderr
    assert "XXXXSECRETXXXX" not in done.stdout + done.stderr


@pytest.mark.parametrize("text, secret", [
    pytest.param("invalid_auth for xoxb-12-34-abcdef", "abcdef", id="bot token"),
    pytest.param("token=xoxp-9-8-userSECRET;", "userSECRET", id="user token"),
    pytest.param("Authorization: Bearer opaqueSECRET", "opaqueSECRET", id="bearer header"),
    pytest.param("POST https://hooks.slack.com/services/T0/B0/hookSECRET failed", "hookSECRET", id="webhook URL"),
    pytest.param('{"url": "https:\\/\\/hooks.slack.com\\/services\\/T0\\/B0\\/hookSECRET"}', "hookSECRET", id="webhook URL, JSON-escaped"),
    # what a Socket Mode envelope carries: response_url (posts for 30 min), its verification token, trigger_id
    pytest.param('{"response_url": "https://hooks.slack.com/commands/T0/1/r3sp0nseS3cret"}', "r3sp0nseS3cret", id="response_url, JSON"),
    pytest.param("{'response_url': 'https://relay.example/x/r3sp0nseS3cret'}", "r3sp0nseS3cret", id="response_url anywhere, repr"),
    pytest.param('"{\\"token\\": \\"v3rificati0nT0ken\\"}"', "v3rificati0nT0ken", id="token, JSON in JSON"),
    pytest.param('{"trigger_id": "1.2.tr1ggerS3cret"}', "tr1ggerS3cret", id="trigger_id"),
    pytest.param("POST https://hooks.slack.com/actions/T0/1/r3sp0nseS3cret", "r3sp0nseS3cret", id="an actions URL alone"),
    pytest.param("wss://wss-primary.slack.com/link/?ticket=t1ck3tS3cret&app_id=A0", "t1ck3tS3cret", id="a Socket Mode URL's ticket"),
])
def test_scrub_masks_what_is_shaped_like_a_slack_secret_though_never_configured(text, secret):
    assert secret not in scrub(text) and "***" in scrub(text)


@pytest.mark.parametrize("url, shown", [
    pytest.param("hooks.slack.com/services/T0/B0/S3CRET", "hooks.slack.com/services/T0/B0/***", id="no scheme"),
    pytest.param("https://user:pw@hooks.slack.com/services/T0/B0/S3CRET?x=S3CRET", "https://hooks.slack.com/services/T0/B0/***", id="user info and query"),
    pytest.param("S3CRET", "***", id="no slash at all"),
])
def test_mask_url_shows_where_a_webhook_points_but_not_its_secret(url, shown):
    assert mask_url(url) == shown


def test_status_scrubs_a_token_kept_in_an_older_states_outbox_error(tmp_path):
    from lossguard.model import Notice
    from lossguard.state import State

    state = State(tmp_path / "state")
    with state.transaction() as tx:
        tx.enqueue(Notice("stalled", "exp", step=40, minutes=31.0), incident_id=None, sinks=["slack"], now=1.0)
    state.mark_failed(state.pending(sink="slack"), f"temporary error: echoed Authorization: Bearer {TOKEN}", permanent=False)
    state.close()
    for fmt in ("table", "json"):
        done = _lossguard("status", "--state-dir", str(tmp_path / "state"), "--format", fmt, env={}, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Bearer ***" in done.stdout and "ECHOEDSECRET" not in done.stdout


@pytest.mark.parametrize("kind", ["fifo", "device", "too large", "folder"])
@pytest.mark.parametrize("given", ["LOSSGUARD_SLACK_TOKEN_FILE", "CREDENTIALS_DIRECTORY"])
def test_a_credential_that_is_no_small_regular_file_is_refused_in_one_line_without_reading_it(tmp_path, kind, given):
    from .conftest import assert_one_error_line

    creds = tmp_path / "creds"
    creds.mkdir()
    path = creds / "slack_token"
    if kind == "fifo":
        os.mkfifo(path)  # (read, it would wait for a writer forever)
    elif kind == "device":
        path = creds / "zero"
        os.symlink("/dev/zero", path)
        if given == "CREDENTIALS_DIRECTORY":
            path.rename(creds / "slack_token")
            path = creds / "slack_token"
    elif kind == "too large":
        path.write_text("xoxb-" + "1" * (100 << 10))
    else:
        path.mkdir()
    env = {"LOSSGUARD_SLACK_TOKEN_FILE": str(path)} if given != "CREDENTIALS_DIRECTORY" else {"CREDENTIALS_DIRECTORY": str(creds)}
    # A FIFO or a device read by mistake would hang or fill memory: those stay in a process of their own.
    run = _lossguard if kind in ("fifo", "device") else _in_process
    res = run("config", "check", env={**env, "LOSSGUARD_SLACK_CHANNEL": "#t"}, cwd=tmp_path)
    line = assert_one_error_line(res, str(path))
    assert "xoxb-111" not in res.stdout + res.stderr
    assert {"fifo": "not a regular file", "device": "not a regular file", "too large": "too large for a credential file",
            "folder": "is a folder"}[kind] in line


SECRET_TAIL = "Q7SECRETtail99"


@pytest.fixture
def no_settings(monkeypatch):
    for name in [k for k in os.environ if k.startswith("LOSSGUARD_")] + ["CREDENTIALS_DIRECTORY"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("setting, value, env", [
    pytest.param("LOSSGUARD_SLACK_TOKEN", f"xoxb-1111-2222-\n{SECRET_TAIL}", {"LOSSGUARD_SLACK_CHANNEL": "#t"}, id="bot token, line break"),
    pytest.param("LOSSGUARD_SLACK_TOKEN", f"xoxb-1111-2222 {SECRET_TAIL}", {"LOSSGUARD_SLACK_CHANNEL": "#t"}, id="bot token, space"),
    pytest.param("LOSSGUARD_SLACK_APP_TOKEN", f"xapp-1-A0-\r\n{SECRET_TAIL}", {"LOSSGUARD_SLACK_TOKEN": "xoxb-1-ok"}, id="app token, CRLF"),
    pytest.param("LOSSGUARD_ALERTMANAGER_BEARER_TOKEN", f"opaque\t{SECRET_TAIL}", {"LOSSGUARD_ALERTMANAGER_URLS": "https://am:9093"}, id="bearer token, tab"),
    pytest.param("LOSSGUARD_ALERTMANAGER_PASSWORD", f"pass word\n{SECRET_TAIL}",
                 {"LOSSGUARD_ALERTMANAGER_URLS": "https://am:9093", "LOSSGUARD_ALERTMANAGER_USERNAME": "u"}, id="password, line break"),
])
def test_a_secret_holding_a_pasted_line_break_is_refused_at_load_naming_the_setting_and_masked(no_settings, setting, value, env):
    # Sent as given, Slack (or the proxy) refused it on every call, which slack-sdk reported as a
    # temporary error: the daemon retried forever where a refusal at load is one line.
    from lossguard.errors import ConfigError
    from lossguard.watch.settings import load_settings

    for name, given in {**env, setting: value}.items():
        no_settings.setenv(name, given)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    line = str(refused.value)
    assert "\n" not in line and setting in line and "control character" in line and "***" in line
    assert SECRET_TAIL not in line and value.split()[0] not in line.replace("xoxb-***", "").replace("xapp-***", "")  # (nor what came before)


@pytest.mark.parametrize("command, setting, value, env", [
    pytest.param(["config", "check"], "LOSSGUARD_SLACK_TOKEN", f"xoxb-1111-2222-\n{SECRET_TAIL}", {"LOSSGUARD_SLACK_CHANNEL": "#t"},
                 id="config check, bot token"),
    pytest.param(["watch", "runs"], "LOSSGUARD_SLACK_TOKEN", f"xoxb-1111-2222-\n{SECRET_TAIL}", {"LOSSGUARD_SLACK_CHANNEL": "#t"},
                 id="the daemon, bot token"),
    pytest.param(["watch", "runs"], "LOSSGUARD_SLACK_APP_TOKEN", f"xapp-1-A0-\n{SECRET_TAIL}",
                 {"LOSSGUARD_SLACK_TOKEN": "xoxb-1-ok", "LOSSGUARD_SLACK_CHANNEL": "#t"}, id="the daemon, app token"),
])
def test_config_check_and_the_daemon_refuse_a_token_holding_a_line_break_with_exit_2_in_one_masked_line(tmp_path, command, setting, value, env):
    from .conftest import assert_one_error_line

    (tmp_path / "runs").mkdir()
    run = _in_process if setting == "LOSSGUARD_SLACK_APP_TOKEN" else _lossguard  # (one of each command in a real process)
    res = run(*command, env={**env, setting: value}, cwd=tmp_path)
    line = assert_one_error_line(res, setting, "control character")
    assert SECRET_TAIL not in res.stdout + res.stderr and "***" in line


def test_a_password_may_hold_spaces_and_a_token_file_its_trailing_newline(tmp_path, no_settings):
    from lossguard.watch.settings import load_settings

    token = tmp_path / "token"
    token.write_text("xoxb-1111-2222-fine\n")
    for name, value in {"LOSSGUARD_SLACK_TOKEN_FILE": str(token), "LOSSGUARD_SLACK_CHANNEL": "#t", "LOSSGUARD_ALERTMANAGER_URLS": "https://am:9093",
                        "LOSSGUARD_ALERTMANAGER_USERNAME": "u", "LOSSGUARD_ALERTMANAGER_PASSWORD": " correct horse battery "}.items():
        no_settings.setenv(name, value)
    settings = load_settings()
    assert settings.slack_token.get_secret_value() == "xoxb-1111-2222-fine"
    assert settings.alertmanager_password.get_secret_value() == "correct horse battery"
