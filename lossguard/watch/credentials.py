"""Where the daemon's secrets come from besides the environment (a LOSSGUARD_<NAME>_FILE path,
systemd's $CREDENTIALS_DIRECTORY), and the shape a secret must have to be sent as it is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_settings import PydanticBaseSettingsSource

from ..errors import ConfigError
from ..tomlio import read_text

CREDENTIAL_BYTES = 64 << 10
"""A token or a URL is a few hundred bytes: a credential file past 64 KiB is the wrong file."""
SECRET_FILES = ("slack_token", "slack_app_token", "slack_webhook_url", "alertmanager_password", "alertmanager_bearer_token", "notify_urls")


def broken_secret(value: str, *, spaces: bool) -> str | None:
    """Why `value` (stripped) cannot be a secret as given, or None: a control character inside it (a
    line break pasted with it) or, where `spaces` is False (tokens, URLs), a space. Such a value
    would be sent as it is and refused by the server on every call, which the client reports as a
    temporary error, retried forever; refused at load, it is one line."""
    for at, ch in enumerate(value, 1):
        if ord(ch) < 0x20 or ord(ch) == 0x7F or (not spaces and ch.isspace()):
            what = "a control character" if spaces else "a space or a control character"
            return f"holds {what} at character {at} (a line break pasted with it?)"
    return None


class FileSecrets(PydanticBaseSettingsSource):
    """LOSSGUARD_SLACK_TOKEN_FILE=/path, and $CREDENTIALS_DIRECTORY/slack_token (systemd)."""

    def get_field_value(self, field, field_name):  # noqa: ANN001, ANN201 - required by the base class
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        for name in SECRET_FILES:
            path = os.environ.get(f"LOSSGUARD_{name.upper()}_FILE")
            candidate = Path(path) if path else (Path(creds) / name if creds else None)
            if candidate is None or not (path or candidate.exists()):
                continue
            try:  # (as a rules file is: a FIFO or /dev/zero named here is refused, not read)
                value = read_text(candidate, what="a credential file", limit=CREDENTIAL_BYTES).strip()
            except ConfigError as exc:
                raise ConfigError(f"LOSSGUARD_{name.upper()}_FILE: {exc}" if path else str(exc)) from None
            if value:  # an empty credential (the unit's SetCredential= fallback) means "not set"
                found[name] = value
        return found
