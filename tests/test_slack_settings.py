"""The settings that turn the buttons on: the app-level token goes the way the bot token
goes (environment, its own _FILE, systemd's credentials directory; masked, scrubbed, refused when it
is no xapp- token without being shown), and the actors are Slack IDs."""

from __future__ import annotations

import pytest

from lossguard.errors import ConfigError
from lossguard.redact import scrub
from lossguard.watch.settings import load_settings

APP_TOKEN = "xapp-1-A0SECRETAPP-4242-f00dcafe"
BOT_TOKEN = "xoxb-1111-SECRET"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("LOSSGUARD_SLACK_TOKEN", "LOSSGUARD_SLACK_APP_TOKEN", "LOSSGUARD_SLACK_APP_TOKEN_FILE", "LOSSGUARD_SLACK_ACTORS",
                 "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOSSGUARD_SLACK_TOKEN", BOT_TOKEN)


def test_app_token_from_the_environment_is_masked_and_scrubbed(monkeypatch):
    monkeypatch.setenv("LOSSGUARD_SLACK_APP_TOKEN", APP_TOKEN)
    settings = load_settings()
    assert settings.slack_app_token.get_secret_value() == APP_TOKEN
    assert settings.masked()["slack_app_token"] == "********** (set)"
    assert APP_TOKEN not in repr(settings) and APP_TOKEN not in str(settings.masked())
    assert APP_TOKEN not in scrub(f"apps.connections.open failed for {APP_TOKEN}")


def test_app_token_from_the_systemd_credentials_directory(tmp_path, monkeypatch):
    (tmp_path / "slack_app_token").write_text(APP_TOKEN + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert load_settings().slack_app_token.get_secret_value() == APP_TOKEN


def test_an_empty_app_token_credential_means_no_buttons(tmp_path, monkeypatch):
    (tmp_path / "slack_app_token").write_text("\n")  # what deploy/install.sh creates
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert load_settings().slack_app_token is None


def test_app_token_from_its_own_file(tmp_path, monkeypatch):
    path = tmp_path / "app"
    path.write_text(APP_TOKEN)
    monkeypatch.setenv("LOSSGUARD_SLACK_APP_TOKEN_FILE", str(path))
    assert load_settings().slack_app_token.get_secret_value() == APP_TOKEN


def test_a_bot_token_given_as_the_app_token_is_refused_without_being_shown(monkeypatch):
    monkeypatch.setenv("LOSSGUARD_SLACK_APP_TOKEN", "xoxb-9999-SWAPPEDSECRET")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "LOSSGUARD_SLACK_APP_TOKEN" in str(err.value) and "xapp-" in str(err.value) and "SWAPPEDSECRET" not in str(err.value)


def test_an_app_token_without_a_bot_token_is_refused(monkeypatch):
    monkeypatch.delenv("LOSSGUARD_SLACK_TOKEN")
    monkeypatch.setenv("LOSSGUARD_SLACK_APP_TOKEN", APP_TOKEN)
    with pytest.raises(ConfigError, match="needs a bot token"):
        load_settings()


def test_actors_are_slack_ids_separated_by_commas(monkeypatch):
    monkeypatch.setenv("LOSSGUARD_SLACK_ACTORS", "U012AB3CD, S0614TZR7,W0ABCDEF")
    assert load_settings().slack_actors == ["U012AB3CD", "S0614TZR7", "W0ABCDEF"]


def test_actors_in_the_config_file(tmp_path):
    config = tmp_path / "lossguard.toml"
    config.write_text('[slack]\nactors = ["U012AB3CD"]\n')
    assert load_settings(config).slack_actors == ["U012AB3CD"]


def test_an_actor_given_by_name_is_refused_with_where_to_find_the_id(monkeypatch):
    monkeypatch.setenv("LOSSGUARD_SLACK_ACTORS", "U012AB3CD,@ana")
    with pytest.raises(ConfigError, match="LOSSGUARD_SLACK_ACTORS.*'@ana'.*member ID"):
        load_settings()


def test_without_an_app_token_nobody_acts():
    settings = load_settings()
    assert settings.slack_app_token is None and settings.slack_actors == []


def test_alert_test_says_whether_slack_opens_socket_mode_for_the_app_token(slack, monkeypatch, capsys):
    from lossguard.cli import main

    monkeypatch.setenv("LOSSGUARD_SLACK_APP_TOKEN", APP_TOKEN)
    monkeypatch.setenv("LOSSGUARD_SLACK_BASE_URL", slack.base_url)
    slack.socket_url = "ws://127.0.0.1:9/link/"
    assert main(["alert", "test", "--channel", "#training"]) == 0
    assert "Socket Mode for the buttons (app-level token): opens" in capsys.readouterr().out
    opened = [r for r in slack.requests if r.path == "/api/apps.connections.open"]
    assert opened[0].headers["authorization"] == f"Bearer {APP_TOKEN}"
    slack.socket_url = None  # Slack answers invalid_auth
    assert main(["alert", "test", "--channel", "#training"]) == 2
    err = capsys.readouterr().err
    assert "invalid_auth" in err and "LOSSGUARD_SLACK_APP_TOKEN" in err and APP_TOKEN not in err
