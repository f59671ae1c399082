"""Which lossguard.toml a command uses (--config, else the first of the places it is looked for) and
what it says: the settings and the read options, the whole file checked by every command."""

from __future__ import annotations

import argparse
from pathlib import Path


def configured(args: argparse.Namespace, *, fmt: str | None = None, **overrides: object):  # noqa: ANN201 - (Settings, ReadOptions)
    """The settings and the read options of the command's config file, the whole file checked
    whichever part of it the command uses: a file that `config check` refuses, every command that
    reads it refuses, with the same message (`scan --config` once ran with `paths = 5` in it)."""
    from ..ingest.config import read_options
    from ..watch.settings import load_settings

    settings = load_settings(args.config, **overrides)
    return settings, read_options(args.config, fmt=fmt)


def read_options_of(args: argparse.Namespace):  # noqa: ANN201 - a ReadOptions
    """What reading needs (`read`, `scan`): from the config file, checked whole, when there is one."""
    from ..ingest.config import read_options

    return configured(args, fmt=args.log_format)[1] if args.config is not None else read_options(None, fmt=args.log_format)


def home() -> Path | None:
    """The user's home folder, or None where there is none to find: HOME unset and a uid with no
    passwd entry (`env -i`, a container run with an arbitrary uid). Path.home() raises there; the
    places under it are then only not there, unless a command has nowhere else to go."""
    import os

    found = os.path.expanduser("~")
    return Path(found) if found != "~" and os.path.isabs(found) else None


def config_places() -> list[Path]:
    """Where a lossguard.toml is looked for when --config is not given, first found wins: the
    current folder, the user's config folder, then the system's (the service's)."""
    import os

    user_home = home()
    xdg = os.environ.get("XDG_CONFIG_HOME") or (str(user_home / ".config") if user_home else None)
    user = [Path(xdg) / "lossguard" / "lossguard.toml"] if xdg else []
    return [Path("lossguard.toml"), *user, Path("/etc/lossguard/lossguard.toml")]


def discover_config(given: Path | None) -> tuple[Path | None, str]:
    """The config file a command uses, and how it was chosen (what `config check` says)."""
    if given is not None:
        return given, "given with --config"
    for place in config_places():
        try:
            found = place.is_file()
        except OSError:  # a folder this user may not enter (a service user's HOME): not there for it
            found = False
        if found:
            return place, "found (./lossguard.toml, then $XDG_CONFIG_HOME/lossguard/, then /etc/lossguard/)"
    return None, "none found in ./lossguard.toml, $XDG_CONFIG_HOME/lossguard/lossguard.toml, /etc/lossguard/lossguard.toml"
