"""Where the daemon's state is for the commands that read or change it (status, outbox, silence)
and those that follow it (watch, scan's digest, config check): the options that name it, the
default folder, and the row IDs such commands take."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from .config_file import configured, home


def state_dir(given: Path | None) -> Path:
    """The state folder given, else systemd's $STATE_DIRECTORY, else the XDG state folder."""
    import os

    if given is not None:
        return given
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    user_home = home()
    base = os.environ.get("XDG_STATE_HOME") or (str(user_home / ".local" / "state") if user_home else None)
    if base is None:
        raise UsageError(
            f"no state directory: HOME is not set and uid {os.getuid()} has no passwd entry; "
            "give --state-dir (or state_dir in the config, or set STATE_DIRECTORY or XDG_STATE_HOME)"
        )
    return Path(base) / "lossguard"


def add_state_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, metavar="DIR", help="the daemon's state directory (default: state_dir in --config, else $STATE_DIRECTORY, else the XDG state dir)")
    p.add_argument("--config", type=Path, help="lossguard.toml naming the state_dir (default: the first found, as `config check` says)")


def state_dir_of(args: argparse.Namespace) -> Path:
    """--state-dir, else the config's state_dir, else the default the daemon uses."""
    if args.state_dir is not None or args.config is None:
        return state_dir(args.state_dir)
    return state_dir(configured(args)[0].state_dir)


ROW_ID_MAX = 2**63 - 1
"""The largest id a state row can have (SQLite's INTEGER PRIMARY KEY); a larger one overflows the query."""


def row_ids(ids: list[int], what: str, listing: str) -> list[int]:
    """IDs as `listing` shows them; one below 1 or past 64 bits names no row (and SQLite could not
    even be asked about it: the query overflows)."""
    beyond = [i for i in ids if not 0 < i <= ROW_ID_MAX]
    if beyond:
        raise no_such(what, beyond, listing)
    return ids


def no_such(what: str, ids: list[int], listing: str) -> UsageError:
    return UsageError(f"no {what} {', '.join(f'#{i}' for i in ids)} (see `{listing}`)")
