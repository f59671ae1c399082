"""What every command's help shares: descriptions and examples printed with the line breaks they
are written with, and the preset names `--rules` takes (for `scan` and `watch`)."""

from __future__ import annotations

import argparse


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of a description and of the `Example:` epilog."""


def presets() -> str:
    """The rule sets `--rules` takes by name (from `presets`: the rules module would bring polars
    into every command's start-up)."""
    from ..detection.presets import preset_names

    return ", ".join(["default", *preset_names()])
