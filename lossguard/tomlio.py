"""TOML parsing in one place, so every file error reads the same: file, line, what is wrong."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import ConfigError


def load_toml_text(text: str, *, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None


def load_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return load_toml_text(text, origin=str(path))


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


def key_line(path: Path, key: str, *, table: str | None = None) -> int | None:
    """The line (from 1) where `key` is set in `table` (None: the top level), or where `table.key` opens
    as a table of its own; None when the file says it nowhere we can see (dotted keys, inline tables).
    tomllib keeps no positions: error messages find the line by reading it again."""
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    assign = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    full = f"{table}.{key}" if table else key
    current = None
    for number, line in enumerate(lines, 1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            if current == full:
                return number
        elif current == table and assign.match(line):
            return number
    return None
