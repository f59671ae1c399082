"""`lossguard read`: the canonical table lossguard read from logs, so one can see what it understood."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from ..escaping import printable
from .config_file import read_options_of
from .exits import EXIT_OK
from .help_text import Formatter


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "read",
        help="print the metrics lossguard understood from logs",
        formatter_class=Formatter,
        description="Print the canonical table (run, source, step, metric, tag, value, wall_time) read\n"
        "from each log file under PATH, so you can see exactly what lossguard understood.",
        epilog="Example:\n  lossguard read runs/ --format csv > metrics.csv\n  lossguard read train.log --metric loss",
    )
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="log file or folder (read recursively)")
    p.add_argument("--format", choices=["csv", "json", "table"], default="table", help="output format (default: table)")
    p.add_argument("--log-format", dest="log_format", metavar="NAME", help="read every file as this format instead of detecting it")
    p.add_argument("--metric", action="append", help="only these canonical metrics or tags (repeatable)")
    p.add_argument("--config", type=Path, help="lossguard.toml with [aliases] and [[formats]]")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..ingest.reader import read_paths, steps_placed
    from ..report.rows import BLOCKWISE, BlockWriter, write_mapping, write_table

    options = read_options_of(args)
    if args.log_format:
        options.reader(args.log_format)
    if args.format in BLOCKWISE:
        # Written as it is read, a block at a time (memory bounded by a block, not by the logs), on a
        # thread of its own while the next block is read.
        with BlockWriter(args.format, sys.stdout, metrics=args.metric, behind=True) as writer:
            _, results, problems = read_paths(args.paths, options, each=writer.write)
            if writer.rows or (results and not problems):
                writer.close()
        rows = writer.rows
    else:
        frame, results, problems = read_paths(args.paths, options)
        rows = frame.height
    if not results and not problems:  # (as scan says it: an empty folder is no log of any kind)
        raise UsageError(f"no training logs found under {', '.join(printable(str(p)) for p in args.paths)}")
    if not rows and problems:
        for problem in problems:
            print(f"warning: {printable(str(problem))}", file=sys.stderr)
        raise UsageError(f"nothing readable under {', '.join(printable(str(p)) for p in args.paths)}")
    if args.format not in BLOCKWISE:
        if frame.height:
            write_mapping(frame, sys.stdout, steps_placed(results))
        if args.metric:
            import polars as pl

            frame = frame.filter(pl.col("metric").is_in(args.metric) | pl.col("tag").is_in(args.metric))
        write_table(frame, args.format, sys.stdout)
    for problem in problems:
        print(f"warning: {printable(str(problem))}", file=sys.stderr)
    return EXIT_OK
