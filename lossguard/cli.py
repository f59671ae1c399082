"""The `lossguard` command: thin wrappers over the library. Every user error becomes one line on
stderr and exit code 2; a traceback is shown only with --debug."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .errors import LossguardError

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def _add_read(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "read",
        help="print the metrics lossguard understood from logs",
        formatter_class=_Formatter,
        description="Print the canonical table (run, source, step, metric, tag, value, wall_time) read\n"
        "from each log file under PATH, so you can see exactly what lossguard understood.",
        epilog="Example:\n  lossguard read runs/ --format csv > metrics.csv\n  lossguard read train.log --metric loss",
    )
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="log file or folder (read recursively)")
    p.add_argument("--format", choices=["csv", "json", "table"], default="table", help="output format (default: table)")
    p.add_argument("--log-format", dest="log_format", metavar="NAME", help="read every file as this format instead of detecting it")
    p.add_argument("--metric", action="append", help="only these canonical metrics or tags (repeatable)")
    p.add_argument("--config", type=Path, help="lossguard.toml with [aliases] and [[formats]]")
    p.set_defaults(func=_cmd_read)


def _cmd_read(args: argparse.Namespace) -> int:
    from .config import read_options
    from .reader import read_paths
    from .render import write_table

    options = read_options(args.config, fmt=args.log_format)
    if args.log_format:
        options.reader(args.log_format)
    frame, _, problems = read_paths(args.paths, options)
    if args.metric:
        import polars as pl

        frame = frame.filter(pl.col("metric").is_in(args.metric) | pl.col("tag").is_in(args.metric))
    write_table(frame, args.format, sys.stdout)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lossguard",
        formatter_class=_Formatter,
        description="Find loss spikes in ML training logs and say why they happened.",
        epilog="Example:\n  lossguard scan runs/\n  lossguard read runs/exp1 --format csv",
    )
    parser.add_argument("--version", action="version", version=f"lossguard {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_read(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except LossguardError as exc:
        if args.debug:
            raise
        print(f"lossguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
