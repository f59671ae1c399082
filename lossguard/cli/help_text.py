"""What every command's help shares: descriptions and examples printed with the line breaks they
are written with, and the preset names `--rules` takes (for `scan` and `watch`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of a description and of the `Example:` epilog."""


class Later(str):
    """A help text written only when help is shown (argparse formats it with `%`): what it lists
    comes from modules a command's start-up should not import (every command builds every
    parser), e.g. `lossguard read` of one file would otherwise import the rule presets and the
    alert messages for the help of `scan` and `silence`."""

    def __new__(cls, make: Callable[[], str]) -> Later:
        later = super().__new__(cls, "")
        later._make = make
        return later

    def __mod__(self, params: object) -> str:
        return self._make() % params

    def __str__(self) -> str:
        return self._make()

    def __bool__(self) -> bool:
        return True

    def strip(self, chars: str | None = None) -> str:
        return self._make().strip(chars)


def presets() -> str:
    """The rule sets `--rules` takes by name (from `presets`: the rules module would bring polars
    into every command's start-up)."""
    from ..detection.presets import preset_names

    return ", ".join(["default", *preset_names()])
