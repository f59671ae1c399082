"""The parts of lossguard.toml that reading needs: alias extensions and user-defined line formats.
(Settings for the daemon and Slack live beside these as those features land.)"""

from __future__ import annotations

from pathlib import Path

from .aliases import Aliases
from ..errors import ConfigError
from .formats.custom import LineFormatSpec
from .reader import FORMAT_NAMES, ReadOptions
from ..tomlio import key_line, load_toml
from ..validate import build


def read_options(config: Path | None, *, fmt: str | None = None) -> ReadOptions:
    if config is None:
        return ReadOptions(format=fmt)
    data = load_toml(config)
    aliases = data.get("aliases", {})
    if not isinstance(aliases, dict):
        raise ConfigError(f"{config}: [aliases] must be a table of metric = [tags]")
    formats = data.get("formats", [])
    if not isinstance(formats, list):
        line = key_line(config, "formats")
        raise ConfigError(f"{config}{f':{line}' if line else ''}: formats: must be an array of tables ([[formats]] with name and pattern)")
    specs = []
    for i, raw in enumerate(formats):
        try:
            spec = build(LineFormatSpec, raw)
        except ValueError as exc:
            name = raw.get("name", f"#{i + 1}") if isinstance(raw, dict) else f"#{i + 1}"
            raise ConfigError(f"{config}: [[formats]] {name}: {exc}") from None
        if spec.name in FORMAT_NAMES:
            raise ConfigError(f"{config}: [[formats]] {spec.name}: that name is a built-in format; pick another")
        specs.append(spec)
    return ReadOptions(aliases=Aliases.build(aliases, origin=str(config)), custom=tuple(specs), format=fmt)
