"""Settings (pydantic-settings): environment variables with flat LOSSGUARD_* names, secrets from
files (systemd's LoadCredential= puts them in $CREDENTIALS_DIRECTORY; any setting also takes a
LOSSGUARD_<NAME>_FILE path), and the [slack] table of lossguard.toml. Secrets are SecretStr: they
print as ********** in every repr, error and `config show`, and are handed to `redact` as they load,
so no later message can show them. A webhook URL is checked here, not at the first alert: a broken
one would otherwise fail inside urllib with the whole URL in the traceback, on every round."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from ..errors import ConfigError
from ..ingest.sources import object_store
from ..redact import mask_service_url, mask_token, mask_url, remember
from ..tomlio import key_line, load_toml
from .credentials import SECRET_FILES, FileSecrets, broken_secret
from .notify_settings import NotifySettings, comma_list

TABLES = ("slack", "alertmanager", "notify")
"""lossguard.toml's tables of settings: `[slack] token` is the setting slack_token."""
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The only hosts a webhook may be reached at over plain http (a local relay, the tests' server)."""


def _http_url(url: str, *, scheme_hint: str) -> tuple[SplitResult | None, str | None]:
    """`url` split, or why it is no http(s) URL with a host (what every URL setting needs first)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is no number
    except ValueError:
        return None, "is not a URL"
    if parts.scheme not in ("https", "http"):
        return None, f"must start with {scheme_hint}"
    if not parts.hostname:
        return None, "has no host"
    return parts, None


def in_clear(parts: SplitResult) -> bool:
    """Plain http to another machine: a secret sent there crosses the network readable."""
    return parts.scheme == "http" and parts.hostname not in LOCAL_HOSTS


def webhook_problem(url: str) -> str | None:
    """Why `url` cannot be an incoming webhook, or None: it must be https (http only to this
    machine), with a host and a path."""
    parts, problem = _http_url(url, scheme_hint="https://")
    if parts is None:
        return problem
    if in_clear(parts):
        return "must use https:// (plain http would send the secret in clear)"
    if not parts.path.strip("/"):
        return "has no path (a webhook URL looks like https://hooks.slack.com/services/T.../B.../...)"
    return broken_secret(url, spaces=False)


class _TomlFile(PydanticBaseSettingsSource):
    """lossguard.toml: the daemon's settings at the top level, Slack's in [slack], Alertmanager's in
    [alertmanager]. ([aliases] and [[formats]] belong to the readers: config.read_options.)"""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field, field_name):  # noqa: ANN001, ANN201
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        data = load_toml(self.path)
        known = set(Settings.model_fields)
        top = {k: v for k, v in data.items() if k not in (*TABLES, "aliases", "formats")}
        unknown = sorted(set(top) - known)
        values = dict(top)
        for table in TABLES:
            section = data.get(table, {})
            if not isinstance(section, dict):
                raise ConfigError(f"{self.path}: [{table}] must be a table")
            unknown += sorted(f"{table}.{k}" for k in section if f"{table}_{k}" not in known)
            values.update({f"{table}_{k}": v for k, v in section.items()})
        if unknown:
            raise ConfigError(f"{self.path}: unknown setting(s): {', '.join(unknown)}")
        for name, value in values.items():
            if reason := _not_toml_typed(name, value):
                raise ConfigError(f"{where_in_file(self.path, name)}: {reason} (got {value!r})")
        return values


_SCALARS = {bool: "a TOML boolean (true or false)", int: "a TOML integer", float: "a TOML number"}


def _not_toml_typed(name: str, value: object) -> str | None:
    """A scalar setting written as TOML can type it: `polling = "yes"` is a string, which pydantic's
    lax mode would read as true (and "10" as 10.0). Environment variables are text and stay lax."""
    wanted = Settings.model_fields[name].annotation
    if wanted not in _SCALARS:
        return None
    fits = isinstance(value, bool) if wanted is bool else isinstance(value, (int, float) if wanted is float else int) and not isinstance(value, bool)
    return None if fits else f"must be {_SCALARS[wanted]}"


def where_in_file(path: Path, name: str) -> str:
    """`file:line: key` for a setting of lossguard.toml (the [slack] ones as slack.key)."""
    table = next((t for t in TABLES if name.startswith(f"{t}_")), None)
    key = name.removeprefix(f"{table}_") if table else name
    line = key_line(path, key, table=table)
    return f"{path}{f':{line}' if line else ''}: {f'{table}.' if table else ''}{key}"


@dataclass(frozen=True)
class Endpoint:
    """Where `/metrics` is served."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Endpoint:
    """`host:port`, `[v6]:port`, or a port alone, which listens on 127.0.0.1 only: metrics name the
    runs, so they are offered to the network only when an address (0.0.0.0:9464) says so."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 address goes in brackets ([::1]:9464)")
    if not host:
        raise ValueError("no host before the port (127.0.0.1:9464; 0.0.0.0:9464 to listen on every address)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("must be host:port with a port from 1 to 65535 (e.g. 127.0.0.1:9464)")
    return Endpoint(host, int(port))


PathList = Annotated[list[Path], NoDecode]
"""A list of paths that the environment may give as one path, as PATH does (a:b), or as JSON."""
RootList = Annotated[list[Annotated[Path | str, BeforeValidator(object_store.root)]], NoDecode]
"""PathList where an object store's URL (s3://bucket/prefix) stays a string: a Path would make it s3:/bucket."""
UrlList = Annotated[list[str], NoDecode]
"""A list of URLs that the environment may give as one URL, several separated by commas, or as JSON."""
IdList = Annotated[list[str], NoDecode]
"""Slack IDs the environment gives separated by commas (U012AB3CD,S0614TZR7), or as JSON."""
SLACK_ID = re.compile(r"^[UWS][A-Z0-9]{2,}$")
"""A user (U..., W... on Enterprise Grid) or a user group (S...): what Slack sends with a click."""
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _without_userinfo(url: str) -> str:
    """A URL as an error may show it: what comes before an @ in its authority is a secret."""
    head, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{head}{sep}{authority.rpartition('@')[2]}{slash}{path}" if sep else url.rpartition("@")[2]


def alertmanager_url_problem(url: str) -> str | None:
    """Why `url` cannot be an Alertmanager's address, or None: http(s), a host, no user info (the
    credentials have settings of their own, kept secret), no query."""
    parts, problem = _http_url(url, scheme_hint="http:// or https://")
    if parts is None:
        return problem
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials: set [alertmanager] username and password (or bearer_token) instead"
    if parts.query or parts.fragment:
        return "must not have a query or fragment (give the Alertmanager's address, e.g. http://am1:9093)"
    return None

DAY = 86400.0


class SlackRoute(BaseModel):
    """Where a notification goes: the first route whose severities and run glob match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: str
    severity: list[Literal["info", "warning", "critical"]] = Field(default_factory=lambda: ["info", "warning", "critical"])
    runs: str = "*"

    def matches(self, severity: str | None, run: str) -> bool:
        return (severity is None or severity in self.severity) and fnmatchcase(run, self.runs)


class Settings(NotifySettings):
    model_config = SettingsConfigDict(env_prefix="LOSSGUARD_", extra="ignore", frozen=True)

    paths: RootList = Field(default_factory=list, description="runs folders (or log files) to follow, or object store prefixes (s3://bucket/prefix, gs://, az://)")
    rules: PathList = Field(default_factory=list, description="rules files, folders or preset names; empty: the packaged defaults")
    state_dir: Path | None = Field(default=None, description="daemon state; default $STATE_DIRECTORY, else $XDG_STATE_HOME/lossguard")
    poll_interval: float = Field(default=10.0, allow_inf_nan=False, gt=0, le=DAY, description="seconds between rescans with --polling or of a root on a network filesystem (NFS, Lustre, CIFS, FUSE: found in /proc/self/mountinfo)")
    polling: bool = Field(default=False, description="rescans only, no inotify")
    rescan_interval: float = Field(default=300.0, allow_inf_nan=False, gt=0, le=DAY, description="seconds between the safety-net rescans of roots that inotify watches")
    threads: int = Field(default=1, ge=1, le=1024, description="polars threads in the daemon: its passes work on small batches, where a pool costs more CPU than it saves; more only speeds up reading a large backlog at start")
    stall_after: float = Field(default=30.0, allow_inf_nan=False, ge=0, le=DAY / 60 * 7, description="minutes without a new step before a run is reported stalled (0: never)")
    crash_after: float = Field(default=2.0, allow_inf_nan=False, gt=0, le=DAY / 60, description="minutes a run's output must stay quiet before an error at its end is reported as the crash that ended it")
    jsonl: Path | None = Field(default=None, description="also append every notification to this JSON-lines file")
    plots: bool = Field(default=True, description="draw the curves around each new incident (PNG under <state_dir>/plots): uploaded into its Slack thread with a bot token, named by the JSON-lines and console sinks")
    log_level: str = Field(default="info", pattern="^(debug|info|warning|error)$", description="daemon log level")
    metrics_listen: str | None = Field(default=None, description="serve Prometheus metrics on http://HOST:PORT/metrics (a port alone: 127.0.0.1)")
    metrics_textfile: Path | None = Field(default=None, description="write the metrics to this .prom file for node_exporter's textfile collector")
    metrics_run_ttl: float = Field(default=DAY, allow_inf_nan=False, gt=0, le=DAY * 30, description="seconds after its last new step that a run's series are dropped from the metrics")
    slack_token: SecretStr | None = Field(default=None, description="Slack bot token (xoxb-...); better from a credential file")
    slack_app_token: SecretStr | None = Field(default=None, description="Slack app-level token (xapp-...) with connections:write: buttons on alerts, taken through Socket Mode; better from a credential file")
    slack_actors: IdList = Field(default_factory=list, description="Slack user IDs (U...) or user-group IDs (S...) who may act on alerts from Slack; empty: nobody")
    slack_channel: str | None = Field(default=None, description="channel for the bot token's messages")
    slack_webhook_url: SecretStr | None = Field(default=None, description="Slack incoming webhook URL, instead of a bot token")
    slack_base_url: str = Field(default="https://slack.com/api/", description="Slack Web API base URL (GovSlack, tests)")
    slack_routes: list[SlackRoute] = Field(default_factory=list, description="per severity / run glob channels, first match wins; else `channel`")
    slack_group_threshold: int = Field(default=3, ge=2, description="this many new incidents waiting at once go out as one message, details in its thread")
    slack_run_cooldown: float = Field(default=600.0, allow_inf_nan=False, ge=0, le=DAY, description="seconds after a run's alert during which its new incidents go into that alert's thread")
    slack_min_interval: float = Field(default=1.0, allow_inf_nan=False, ge=0, le=3600, description="seconds between two messages to one channel (Slack allows about one a second)")
    alertmanager_urls: UrlList = Field(default_factory=list, description="every Alertmanager replica (each gets every alert, as its HA docs require); empty: no Alertmanager")
    alertmanager_resend_interval: float = Field(default=60.0, allow_inf_nan=False, ge=1, le=3600, description="seconds between re-sends of the firing alerts (keep it well under Alertmanager's resolve_timeout, 5 min by default)")
    alertmanager_extra_labels: dict[str, str] = Field(default_factory=dict, description="labels added to every alert (e.g. cluster, team)")
    alertmanager_host: str | None = Field(default=None, description="the host label; default this machine's hostname")
    alertmanager_username: str | None = Field(default=None, description="basic auth user (a proxy in front of Alertmanager)")
    alertmanager_password: SecretStr | None = Field(default=None, description="basic auth password; better from a credential file")
    alertmanager_bearer_token: SecretStr | None = Field(default=None, description="bearer token, instead of basic auth; better from a credential file")
    alertmanager_ca_file: Path | None = Field(default=None, description="CA certificate(s) to trust for https Alertmanager URLs")

    @field_validator("paths", "rules", mode="before")
    @classmethod
    def _path_list(cls, value: object) -> object:
        """One path (LOSSGUARD_PATHS=/data/runs, or `paths = "/data/runs"`), several as $PATH
        writes them (a:b), or a JSON list."""
        if isinstance(value, str) and not value.strip().startswith("["):
            return object_store.split_paths(value.strip())  # (s3://b: no separator)
        return comma_list(value, "paths", sep=os.pathsep)

    @field_validator("metrics_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else str(parse_listen(value))

    @field_validator("metrics_textfile")
    @classmethod
    def _textfile(cls, value: Path | None) -> Path | None:
        if value is not None and value.suffix != ".prom":
            raise ValueError("must end in .prom (node_exporter's textfile collector reads only those)")
        return value

    @field_validator("slack_actors", mode="before")
    @classmethod
    def _id_list(cls, value: object) -> object:
        """One ID or several separated by commas (LOSSGUARD_SLACK_ACTORS=U012AB3CD,S0614TZR7), or a JSON list."""
        return comma_list(value, "IDs")

    @field_validator("slack_actors")
    @classmethod
    def _actors(cls, value: list[str]) -> list[str]:
        """An ID as Slack writes it: a name (@ana) or a typo would let nobody act, found out at 3 a.m."""
        ids = [v.strip() for v in value]
        for ident in ids:
            if not SLACK_ID.match(ident):
                raise ValueError(f"{ident!r} is not a Slack user ID (U...) or user-group ID (S...): find it in the profile's menu, 'Copy member ID'")
        return ids

    @field_validator("slack_app_token")
    @classmethod
    def _app_token(cls, value: SecretStr | None) -> SecretStr | None:
        """An app-level token, not the bot's (the two are easily swapped: each fails in its own way)."""
        if value is None:
            return value
        token = value.get_secret_value().strip()
        remember(token)
        if not token:
            return None
        if not token.startswith("xapp-"):
            raise ValueError("must be an app-level token (xapp-...: the app's Basic Information, App-Level Tokens, with connections:write)")
        if problem := broken_secret(token, spaces=False):
            raise ValueError(f"{mask_token(token)} {problem}")
        return SecretStr(token)

    @field_validator("slack_token", "alertmanager_password", "alertmanager_bearer_token")
    @classmethod
    def _secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """Known to the scrubber from the moment it is read, so no later error text can show it;
        its ends stripped (a credential file's newline) and what is left refused when it holds a
        control character (a password may hold spaces, a token not)."""
        if value is None:
            return value
        secret = value.get_secret_value()
        remember(secret)
        secret = secret.strip()
        if problem := broken_secret(secret, spaces=info.field_name == "alertmanager_password"):
            raise ValueError(f"{mask_token(secret)} {problem}")
        return SecretStr(secret)

    @field_validator("slack_webhook_url")
    @classmethod
    def _webhook(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        url = value.get_secret_value().strip()
        remember(url)
        problem = webhook_problem(url)
        if problem:
            raise ValueError(f"{mask_url(url)} {problem}")
        return SecretStr(url)

    @field_validator("slack_base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        """The bot token goes to this URL with every call: https, or plain http to this machine only."""
        parts, problem = _http_url(value.strip(), scheme_hint="https://")
        if parts is not None and in_clear(parts):
            problem = "must use https:// (plain http would send the bot token in clear)"
        if problem:
            raise ValueError(problem)
        return value.strip()

    @field_validator("alertmanager_urls", mode="before")
    @classmethod
    def _url_list(cls, value: object) -> object:
        """One URL, several separated by commas (LOSSGUARD_ALERTMANAGER_URLS=http://a:9093,http://b:9093),
        or a JSON list."""
        return comma_list(value, "URLs")

    @field_validator("alertmanager_urls")
    @classmethod
    def _am_urls(cls, value: list[str]) -> list[str]:
        urls = [u.strip().rstrip("/") for u in value]
        for url in urls:
            if problem := alertmanager_url_problem(url):
                raise ValueError(f"{_without_userinfo(url)} {problem}")
        if len(set(urls)) != len(urls):
            raise ValueError("lists the same URL twice")
        return urls

    @field_validator("alertmanager_extra_labels")
    @classmethod
    def _extra_labels(cls, value: dict[str, str]) -> dict[str, str]:
        from ..alerts.labels import RESERVED

        for name in value:
            if not LABEL_NAME.match(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a label name (letters, digits and _, not starting with a digit or __)")
            if name in RESERVED:
                raise ValueError(f"{name!r} is set by lossguard itself ({', '.join(RESERVED)}); for the host label use [alertmanager] host")
        return value

    @field_validator("alertmanager_ca_file")
    @classmethod
    def _ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value}: no such file")
        return value

    @model_validator(mode="after")
    def _am_auth(self) -> Settings:
        basic = self.alertmanager_username is not None or self.alertmanager_password is not None
        if basic and self.alertmanager_bearer_token is not None:
            raise ValueError("alertmanager: give basic auth (username, password) or a bearer_token, not both")
        if self.alertmanager_password is not None and self.alertmanager_username is None:
            raise ValueError("alertmanager: a password without a username")
        if basic or self.alertmanager_bearer_token is not None:
            for url in self.alertmanager_urls:
                if in_clear(urlsplit(url)):
                    raise ValueError(f"alertmanager: {url} must use https:// (plain http would send the credentials in clear)")
        return self

    @model_validator(mode="after")
    def _app_needs_bot(self) -> Settings:
        """A click is answered by updating the alert and replying to the clicker: a bot's calls (a webhook can do neither)."""
        if self.slack_app_token is not None and self.slack_token is None:
            raise ValueError("slack: an app_token (buttons) needs a bot token too (slack_token, xoxb-...): it updates the alert a click acts on")
        return self

    @field_validator("slack_channel")
    @classmethod
    def _channel(cls, value: str | None) -> str | None:
        return value.strip() if value else value

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):  # noqa: ANN001, ANN206
        return (init_settings, env_settings, FileSecrets(settings_cls), _TomlFile(settings_cls, _CONFIG_PATH.get("path")))

    def masked(self) -> dict[str, object]:
        """The effective settings for people: secrets shown only as set or not."""
        out: dict[str, object] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                out[name] = "********** (set)"
            elif name == "notify_urls":
                out[name] = [mask_service_url(v.get_secret_value()) for v in value]
            elif value is None and name in SECRET_FILES:
                out[name] = "(not set)"
            elif isinstance(value, Path):
                out[name] = str(value)
            elif isinstance(value, list):
                out[name] = [v.model_dump() if isinstance(v, BaseModel) else str(v) for v in value]
            else:
                out[name] = value
        return out


_CONFIG_PATH: dict[str, Path | None] = {"path": None}


def load_settings(config: Path | None = None, **overrides: object) -> Settings:
    """Settings from (in order of precedence) `overrides` (the command line), LOSSGUARD_* variables,
    secret files, and the config file."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if given and config is not None:
        # The file checked whole first, as every command checks it: a value the command line
        # overrides is never validated below (`watch runs/ --config` ran with `paths = 5` in it).
        load_settings(config)
    _CONFIG_PATH["path"] = config
    try:
        return Settings(**given)
    except ValidationError as exc:
        reasons = "; ".join(_reason(e, given=given, config=config) for e in exc.errors())
        raise ConfigError(f"invalid settings: {reasons}") from None
    except SettingsError as exc:
        # pydantic-settings' own failure to decode a variable (LOSSGUARD_SLACK_ROUTES not JSON).
        field = re.search(r'field "(\w+)"', str(exc))
        where = _env_name(field.group(1)) if field else "LOSSGUARD_*"
        raise ConfigError(f"invalid settings: {where}: not valid JSON") from None
    finally:
        _CONFIG_PATH["path"] = None


def _env_name(field: str) -> str:
    return f"LOSSGUARD_{field.upper()}"


def _reason(error: Any, *, given: dict[str, object], config: Path | None) -> str:
    """One pydantic error as `where: field: why`, where is the source that gave the value, in the
    order they take precedence: the command line, the environment, a credential file, the config."""
    if not error["loc"]:  # a check across settings: its message names them
        return error["msg"].removeprefix("Value error, ")
    field, rest = str(error["loc"][0]), error["loc"][1:]
    detail = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)
    why = error["msg"].removeprefix("Value error, ")
    if "input" in error and not isinstance(error["input"], (dict, list)) and field not in (*SECRET_FILES, "alertmanager_urls", "slack_actors", "notify_urls"):
        shown = repr(error["input"])
        why += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    if field in given:
        return f"--{field.replace('_', '-')}{detail}: {why}"
    env = {k.upper() for k in os.environ}
    if _env_name(field) in env:
        return f"{_env_name(field)}{detail}: {why}"
    if f"{_env_name(field)}_FILE" in env:
        return f"{_env_name(field)}_FILE: {why}"
    if config is not None:
        return f"{where_in_file(config, field)}{detail}: {why}"
    return f"{field}{detail}: {why}"
