"""The `lossguard` command: thin wrappers over the library. Every user error becomes one line on
stderr and exit code 2; anything unexpected one line and exit code 3 (never 1, which says "spikes
found"); Ctrl-C exits 130. A traceback is shown only with --debug. What it prints for people has
names from disk made printable and secrets scrubbed (`escaping`, `redact`).

Here are the parser and the one error boundary (`main`); each command group is a module of its own
(`read`, `scan`, `alert`, `watch`, `status`, `outbox`, `silence`, `config_check`, `completion`),
which adds its parser and runs it, importing what it needs only when it runs: `lossguard --help`
stays clear of polars."""

from __future__ import annotations

import argparse
import sys

from ..errors import LossguardError
from ..escaping import printable
from ..redact import scrub
from ..report.output import guarded_stdout
from ..version import __version__
from . import alert, completion, config_check, outbox, read, scan, silence, status, watch
from .completion import completion_script
from .config_file import config_places, discover_config
from .exits import EXIT_FOUND, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .help_text import Formatter
from .silence import ENDED_SHOWN
from .state_access import ROW_ID_MAX

__all__ = [
    "ENDED_SHOWN", "EXIT_FOUND", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "ROW_ID_MAX",
    "build_parser", "completion_script", "config_places", "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lossguard",
        formatter_class=Formatter,
        description="Find loss spikes in ML training logs and say why they happened.",
        epilog="Example:\n  lossguard scan runs/\n  lossguard read runs/exp1 --format csv",
    )
    parser.add_argument("--version", action="version", version=f"lossguard {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (read, scan, alert, watch, status, outbox, silence, config_check):  # the order --help lists them in
        command.add(sub)
    completion.add(sub, parser=parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The one error boundary: from finding the config to the last byte of output, so no failure
    can leave as Python's own exit code 1 ("spikes found")."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        with guarded_stdout():
            if hasattr(args, "config"):
                args.config, args.config_how = discover_config(args.config)
            return args.func(args)
    except LossguardError as exc:
        if args.debug:
            raise
        print(f"lossguard: error: {scrub(printable(str(exc)))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as exc:
        if args.debug:
            raise
        if exc.filename is None:
            return _internal(exc)
        # The environment refused a file the user named (a state folder that cannot be made...).
        print(f"lossguard: error: {scrub(printable(str(exc.filename)))}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - one line, and an exit code that cannot mean "spikes found"
        if args.debug:
            raise
        return _internal(exc)


def _internal(exc: BaseException) -> int:
    print(f"lossguard: internal error: {type(exc).__name__}: {scrub(printable(str(exc)))} (run with --debug for the traceback)", file=sys.stderr)
    return EXIT_INTERNAL
