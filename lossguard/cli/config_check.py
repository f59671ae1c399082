"""`lossguard config check`: the configuration, environment, credentials and rules validated as
every command would read them, then the effective settings shown with secrets masked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..escaping import printable
from .config_file import configured
from .exits import EXIT_OK
from .help_text import Formatter
from .state_access import state_dir


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="check a configuration and show the effective settings",
        formatter_class=Formatter,
        description="`config check` validates the configuration file, the environment (LOSSGUARD_*), the\n"
        "credential files and the rules, then prints the effective settings with secrets masked and\n"
        "the state directory resolved. Exit 0 when valid, 2 with a clear message when not.\n"
        "Without --config, every command uses the first of ./lossguard.toml,\n"
        "$XDG_CONFIG_HOME/lossguard/lossguard.toml (~/.config/...) and /etc/lossguard/lossguard.toml.",
        epilog="Example:\n  lossguard config check --config /etc/lossguard/lossguard.toml",
    )
    p.add_argument("action", choices=["check"], help="check: validate and print the effective settings")
    p.add_argument("--config", type=Path, help="lossguard.toml (default: the first found, see above)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..detection.rules import load_rules

    settings = configured(args)[0]
    rules = load_rules(list(settings.rules) or None)
    shown = {"config file": f"{args.config or '-'} ({args.config_how})", **settings.masked()}
    shown["state_dir"] = f"{state_dir(settings.state_dir)}" + ("" if settings.state_dir else " (default: $STATE_DIRECTORY, else the XDG state dir)")
    width = max(len(k) for k in shown)
    for key, value in shown.items():
        print(f"{key:<{width}}  {printable(str(value))}")
    print(f"{'rules (loaded)':<{width}}  {len(rules.rules) + len(rules.crashes)} from {printable(rules.origin)}")
    missing = [str(p) for p in settings.paths if isinstance(p, Path) and not p.exists()]
    if missing:
        print(f"lossguard: warning: paths that do not exist (yet): {printable(', '.join(missing))}", file=sys.stderr)
    return EXIT_OK
