"""The settings of the notification URLs ([notify] urls) and of the on_incident command: how the
environment, a credential file and lossguard.toml give them, and the checks made as they load (a
URL apprise cannot send to, a program that is not there, is refused before the daemon starts)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode

from ..redact import mask_service_url, remember_service_url
from .credentials import broken_secret

SecretList = Annotated[list[SecretStr], NoDecode]
"""Notification URLs: one, several separated by commas or lines, or a JSON list; each a secret."""
Command = Annotated[list[str], NoDecode]
"""A command line: a string split as a shell splits words (no shell runs it), or a TOML list."""
NameList = Annotated[list[str], NoDecode]
"""Names the environment gives separated by commas, or as JSON."""
SERVICE_URLS = re.compile(r"[\n\r]+|,\s*(?=[A-Za-z][A-Za-z0-9+.-]{0,31}://)")
"""Between two notification URLs: a line break, or a comma before the next URL's scheme (a comma
inside a URL, `mailto://...?to=a@x.org,b@x.org`, stays in it)."""


def comma_list(value: object, what: str, *, sep: str = ",") -> object:
    """A list setting the environment gives as text: items separated by `sep` (a comma; a path
    list's os.pathsep, whose items keep their spaces), or a JSON list."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list of {what}: {exc.msg} at character {exc.pos}") from None
    if sep != ",":
        return [part for part in text.split(sep) if part]
    return [part.strip() for part in text.split(",") if part.strip()]


class NotifySettings(BaseSettings):
    """The notification URLs and the on_incident command (the daemon's Settings extend it)."""

    notify_urls: SecretList = Field(default_factory=list, description="notification URLs (apprise: discord://, msteams://, tgram://, pagerduty://, mailto://, ntfy://, json://...), each a sink of its own; needs lossguard[notify]; better from a credential file")
    on_incident: Command = Field(default_factory=list, description="a command run once per notice (opened, resolved, stalled...), the notice in its environment (LOSSGUARD_EVENT...) and as JSON on stdin; no shell unless it names one (sh -c '...')")
    on_incident_rules: NameList = Field(default_factory=list, description="the rules whose notices run on_incident (a run's notices by their kind: stalled, resumed); empty: all")
    on_incident_severities: NameList = Field(default_factory=list, description="the severities whose notices run on_incident (info, warning, critical; a run's notices have none and always run it); empty: all")
    on_incident_timeout: float = Field(default=60.0, allow_inf_nan=False, gt=0, le=3600, description="seconds on_incident may take before it is stopped (SIGTERM, then SIGKILL 5 s later)")

    @field_validator("notify_urls", mode="before")
    @classmethod
    def _service_url_list(cls, value: object) -> object:
        """One URL, several separated by commas or lines (LOSSGUARD_NOTIFY_URLS, a credential
        file), or a JSON list; each known to the scrubber before anything can fail on it."""
        if isinstance(value, str) and not value.strip().startswith("["):
            value = [part.strip() for part in SERVICE_URLS.split(value) if part.strip()]
        value = comma_list(value, "URLs")
        for url in value if isinstance(value, list) else ():
            if isinstance(url, (str, SecretStr)):
                remember_service_url(url if isinstance(url, str) else url.get_secret_value())
        return value

    @field_validator("notify_urls")
    @classmethod
    def _service_urls(cls, value: list[SecretStr]) -> list[SecretStr]:
        """Each URL one that apprise can send to (a known scheme, what the service needs, such as
        its token), checked now: one that cannot work would otherwise fail at the first incident."""
        urls = [v.get_secret_value().strip() for v in value]
        if not urls:
            return []
        from ..alerts.notify import url_problem

        for url in urls:
            if problem := broken_secret(url, spaces=False) or url_problem(url):
                raise ValueError(f"{mask_service_url(url)} {problem}")
        if len(set(urls)) != len(urls):
            raise ValueError("lists the same URL twice")
        return [SecretStr(u) for u in urls]

    @field_validator("on_incident", mode="before")
    @classmethod
    def _command(cls, value: object) -> object:
        """A string is split into words as a shell would split it, and then run without one."""
        if not isinstance(value, str):
            return value
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into words: {exc}") from None

    @field_validator("on_incident")
    @classmethod
    def _program(cls, value: list[str]) -> list[str]:
        """The program exists and may be run, found now rather than at 3 a.m. with the first spike."""
        if not value:
            return value
        program = value[0]
        found = program if "/" in program else shutil.which(program)
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            where = "no such executable file" if "/" in program else "not found in PATH"
            raise ValueError(f"{program!r}: {where}")
        return value

    @field_validator("on_incident_rules", "on_incident_severities", mode="before")
    @classmethod
    def _name_list(cls, value: object) -> object:
        return comma_list(value, "names")

    @field_validator("on_incident_severities")
    @classmethod
    def _severities(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in ("info", "warning", "critical"):
                raise ValueError(f"{name!r} is not a severity (info, warning, critical)")
        return value
