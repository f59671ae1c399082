"""Settings (pydantic-settings): environment variables with flat LOSSGUARD_* names, secrets from
files (systemd's LoadCredential= puts them in $CREDENTIALS_DIRECTORY; any setting also takes a
LOSSGUARD_<NAME>_FILE path), and the [slack] table of lossguard.toml. Secrets are SecretStr: they
print as ********** in every repr, error and `config show`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ConfigError
from .tomlio import load_toml

SECRET_FILES = ("slack_token", "slack_webhook_url")


class _FileSecrets(PydanticBaseSettingsSource):
    """LOSSGUARD_SLACK_TOKEN_FILE=/path, and $CREDENTIALS_DIRECTORY/slack_token (systemd)."""

    def get_field_value(self, field, field_name):  # noqa: ANN001, ANN201 - required by the base class
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        for name in SECRET_FILES:
            path = os.environ.get(f"LOSSGUARD_{name.upper()}_FILE")
            candidate = Path(path) if path else (Path(creds) / name if creds else None)
            if candidate is None or not candidate.is_file():
                if path:
                    raise ConfigError(f"LOSSGUARD_{name.upper()}_FILE: {path}: no such file")
                continue
            try:
                found[name] = candidate.read_text("utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"{candidate}: cannot read: {exc.strerror or exc}") from None
        return found


class _TomlSlack(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field, field_name):  # noqa: ANN001, ANN201
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        slack = load_toml(self.path).get("slack", {})
        if not isinstance(slack, dict):
            raise ConfigError(f"{self.path}: [slack] must be a table")
        return {f"slack_{k}": v for k, v in slack.items()}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOSSGUARD_", extra="ignore", frozen=True)

    slack_token: SecretStr | None = None
    slack_channel: str | None = None
    slack_webhook_url: SecretStr | None = None
    slack_base_url: str = "https://slack.com/api/"

    @field_validator("slack_channel")
    @classmethod
    def _channel(cls, value: str | None) -> str | None:
        return value.strip() if value else value

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):  # noqa: ANN001, ANN206
        return (init_settings, env_settings, _FileSecrets(settings_cls), _TomlSlack(settings_cls, _CONFIG_PATH.get("path")))

    def masked(self) -> dict[str, object]:
        """The effective settings for people: secrets shown only as set or not."""
        out: dict[str, object] = {}
        for name, value in self.model_dump().items():
            if isinstance(value, SecretStr):
                out[name] = "********** (set)"
            elif value is None and name in SECRET_FILES:
                out[name] = "(not set)"
            else:
                out[name] = value
        return out


_CONFIG_PATH: dict[str, Path | None] = {"path": None}


def load_settings(config: Path | None = None) -> Settings:
    _CONFIG_PATH["path"] = config
    try:
        return Settings()
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid settings: {reasons}") from None
    finally:
        _CONFIG_PATH["path"] = None
