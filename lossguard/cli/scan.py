"""`lossguard scan`: the audit of every run under a folder, its report, and the backtest of two rule
sets (--compare-rules); with --slack-digest, the report's summary posted to Slack as well."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..ingest.sources import object_store
from ..errors import LossguardError, UsageError
from ..escaping import printable
from ..redact import scrub
from ..report.output import write_file
from .config_file import configured, read_options_of
from .exits import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from .help_text import Formatter, Later, presets
from .state_access import state_dir


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="audit every run under a folder: spikes and their likely causes",
        formatter_class=Formatter,
        description="Find every run under PATH, read its logs, apply the spike rules and say why each\n"
        "spike most likely happened.\n\n"
        "Exit codes: 0 no spike found; 1 spikes found; 2 usage error, bad rules or config, a file\n"
        "that cannot be written, or (with --strict) a file that could not be read; 3 internal error\n"
        "(a bug: please report it, with --debug's traceback); 130 interrupted (Ctrl-C).",
        epilog="Example:\n  lossguard scan runs/\n  lossguard scan runs/ --format json --output report.json\n"
        "  lossguard scan s3://bucket/runs   # pip install 'lossguard[s3]'\n"
        "  lossguard scan runs/ --rules olmo-core\n  lossguard scan runs/ --compare-rules rules/default.toml llm-foundry",
    )
    p.add_argument("paths", nargs="*", type=object_store.root, metavar="PATH", help="folder of runs, run folder or log file, or an object store prefix: s3://bucket/prefix, gs://, az:// (default: `paths` in --config)")
    p.add_argument("--rules", action="append", type=Path, metavar="FILE_OR_DIR", help=Later(lambda: f"rules file, folder of them, or a preset: {presets()} (repeatable; default: default)"))
    p.add_argument("--format", choices=["table", "json", "markdown", "html"], default="table", help="report format (default: table)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--run", metavar="GLOB", help="only runs whose name matches GLOB")
    p.add_argument("--metric", metavar="NAME", help="only spikes of this metric (loss, eval_loss, grad_norm...)")
    p.add_argument("--since", type=int, metavar="STEP", help="only spikes that start at or after STEP")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="runs read in parallel (default: the cores available, for scans large enough to gain from it)")
    p.add_argument("--strict", action="store_true", help="exit 2 if any file could not be read (a growing file's last record not yet whole is said, but is not that)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no warnings on stderr")
    p.add_argument("--config", type=Path, help="lossguard.toml with [aliases] and [[formats]]")
    p.add_argument("--log-format", dest="log_format", metavar="NAME", help="read every file as this format instead of detecting it")
    p.add_argument("--compare-rules", nargs=2, type=Path, metavar=("A", "B"), help="backtest: what rules A and B flag differently, per run")
    p.add_argument("--slack-digest", action="store_true", help="also post a digest of the scan to Slack (when configured)")
    p.set_defaults(func=_run)


def _post_digest(result, args: argparse.Namespace) -> None:  # noqa: ANN001
    """The nightly report's summary in Slack: one message, the runs with spikes and their top cause,
    leaving out what the daemon's silences cover (its state_dir, from the same config)."""
    import socket

    from ..alerts.message import digest
    from ..alerts.slack import client_from
    from ..report.scan_report import summary

    settings = configured(args)[0]
    sink = client_from(settings)
    if sink is None:
        print("lossguard: warning: --slack-digest, but Slack is not configured; no digest posted", file=sys.stderr)
        return
    runs, silenced = _unsilenced(result, state_dir(settings.state_dir) / "state.db")
    message = digest(host=socket.gethostname(), totals=summary(result), runs=runs, silenced=silenced)
    delivery = sink.post(message)
    if not delivery.ok:
        print(f"lossguard: warning: Slack digest not delivered: {scrub(printable(delivery.describe()))}", file=sys.stderr)


def _unsilenced(result, state_db: Path):  # noqa: ANN001, ANN202
    """Each run's incidents that no silence in force covers (the daemon's, from its state), and how
    many were left out: the digest honours `lossguard silence` as the daemon does."""
    import time

    from ..model import Notice
    from ..silences import covering
    from ..state import read_silences

    try:
        silences = read_silences(state_db, now=time.time()) if state_db.is_file() else []
    except LossguardError as exc:  # the digest still goes out, every spike in it
        print(f"lossguard: warning: cannot read the silences ({scrub(printable(str(exc)))}); the digest lists every spike", file=sys.stderr)
        silences = []
    now, runs, silenced = time.time(), [], 0
    for rep in result.runs:
        kept = tuple(i for i in rep.incidents if covering(silences, Notice("opened", rep.run, i), now) is None)
        silenced += len(rep.incidents) - len(kept)
        runs.append((rep.run, kept))
    return runs, silenced


def _run(args: argparse.Namespace) -> int:
    options = read_options_of(args)
    if args.log_format:
        options.reader(args.log_format)  # an unknown name is a usage error before anything is read
    if not args.paths:
        settings = configured(args)[0]
        args.paths = list(settings.paths)
        args.rules = args.rules or list(settings.rules) or None
        if not args.paths:
            raise UsageError("nothing to scan: give PATH arguments or `paths` in --config")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    results = _scanned(args, options)
    _refuse_empty(results, args)
    result = results[0]
    text = _report_text(results, args)
    if args.output:
        write_file(args.output, text)
        if not args.quiet:
            findings = sum(len(r.incidents) for r in result.runs)
            print(f"lossguard: wrote the {args.format} report to {printable(str(args.output))} "
                  f"({len(result.runs)} run(s), {findings} finding(s))", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if args.slack_digest:
        _post_digest(result, args)
    problems = result.all_problems
    # A run with no loss to judge is as much a gap as a file that could not be read: said where the
    # problems are said, and a failure under --strict.
    unjudged = [f"{rep.run}: {note.message}" for rep in result.runs for note in rep.analysis.unjudged]
    if (problems or unjudged) and not args.quiet and (args.output or args.format != "table"):
        for line in (*map(str, problems), *unjudged):
            print(f"warning: {printable(line)}", file=sys.stderr)
    if not result.runs:
        print("lossguard: error: no file under the given paths could be read", file=sys.stderr)
        return EXIT_USAGE
    if args.strict and (unjudged or any(not p.unfinished for p in problems)):
        return EXIT_USAGE  # (a growing file's last record, not yet whole, was no file that could not be read)
    return EXIT_FOUND if any(r.incidents for r in result.runs) else EXIT_OK


def _scanned(args: argparse.Namespace, options) -> list:  # noqa: ANN001 - a ReadOptions; ScanResults
    """The scan with the rules in force, or one per rule set compared (--compare-rules A B), each
    with only the spikes --metric and --since keep."""
    from dataclasses import replace

    from ..detection.rules import load_rules
    from ..report.audit import scan
    from .progress import Progress

    show_progress = sys.stderr.isatty() and not args.quiet
    rule_sets = [load_rules([p]) for p in args.compare_rules] if args.compare_rules else [load_rules(args.rules)]
    results = []
    for rules in rule_sets:
        progress = Progress() if show_progress else None
        try:
            result = scan(args.paths, rules=rules, options=options, run_glob=args.run, jobs=args.jobs, progress=progress)
        finally:
            if progress:
                progress.close()
        if args.metric or args.since is not None:
            keep = lambda i: (not args.metric or i.metric == args.metric) and (args.since is None or i.step >= args.since)  # noqa: E731
            runs = tuple(replace(r, analysis=replace(r.analysis, incidents=tuple(filter(keep, r.incidents)))) for r in result.runs)
            result = replace(result, runs=runs)
        results.append(result)
    return results


def _refuse_empty(results: list, args: argparse.Namespace) -> None:
    """A scan that found nothing to judge because of what it was asked (a --run glob that matches no
    run, no logs at all, a --metric nothing logs or judges) is a usage error, said with what is there."""
    result = results[0]
    if args.run and not result.runs:
        names = result.names
        shown = ", ".join(printable(n) for n in names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
        raise UsageError(f"no run matches {printable(args.run)!r} (runs found: {shown or 'none'})")
    if not result.runs and not result.all_problems:
        where = ", ".join(map(str, args.paths))
        if result.files:  # (a tracker's store of runs that logged no metric yet: found, nothing in it)
            raise UsageError(f"no metric logged yet under {where}: {result.files} log file(s) found, none holding a training metric")
        raise UsageError(f"no training logs found under {where}")
    if args.metric:
        known = {m for r in results for rep in r.runs for m in rep.analysis.metrics} | {rule.metric for r in results for rule in r.rules.rules}
        if args.metric not in known:
            raise UsageError(f"no run logs a metric {printable(args.metric)!r} and no rule judges one (metrics found: {', '.join(sorted(known))})")


def _report_text(results: list, args: argparse.Namespace) -> str:
    """The report in --format, or with --compare-rules what the two rule sets flag differently."""
    import os

    from ..report import compare as cmp
    from ..report import scan_report as report

    if args.compare_rules:
        rows = cmp.compare(results[0], results[1])
        names = [results[0].rules.origin, results[1].rules.origin]
        if args.format == "json":
            import json

            return json.dumps(cmp.to_json(rows, *names), indent=2) + "\n"
        return cmp.to_text(rows, *names)
    colour = args.output is None and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    return report.render(results[0], args.format, colour=colour)
