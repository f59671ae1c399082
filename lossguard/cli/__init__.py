"""The `lossguard` command: thin wrappers over the library. Every user error becomes one line on
stderr and exit code 2; anything unexpected one line and exit code 3 (never 1, which says "spikes
found"); Ctrl-C exits 130. A traceback is shown only with --debug. What it prints for people has
names from disk made printable and secrets scrubbed (`escaping`, `redact`)."""

from __future__ import annotations

import argparse
import sys
from fnmatch import fnmatchcase
from pathlib import Path

from ..version import __version__
from ..errors import LossguardError, UsageError
from ..escaping import printable
from ..report.output import guarded_stdout, write_file
from ..redact import scrub

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def _config(args: argparse.Namespace, *, fmt: str | None = None, **overrides: object):  # noqa: ANN202 - (Settings, ReadOptions)
    """The settings and the read options of the command's config file, the whole file checked
    whichever part of it the command uses: a file that `config check` refuses, every command that
    reads it refuses, with the same message (`scan --config` once ran with `paths = 5` in it)."""
    from ..ingest.config import read_options
    from ..watch.settings import load_settings

    settings = load_settings(args.config, **overrides)
    return settings, read_options(args.config, fmt=fmt)


def _read_options(args: argparse.Namespace):  # noqa: ANN202 - a ReadOptions
    """What reading needs (`read`, `scan`): from the config file, checked whole, when there is one."""
    from ..ingest.config import read_options

    return _config(args, fmt=args.log_format)[1] if args.config is not None else read_options(None, fmt=args.log_format)


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
    from ..ingest.reader import read_paths, steps_placed
    from ..report.rows import BLOCKWISE, BlockWriter, write_mapping, write_table

    options = _read_options(args)
    if args.log_format:
        options.reader(args.log_format)
    if args.format in BLOCKWISE:
        # Written as it is read, a block at a time (memory bounded by a block, not by the logs), on a
        # thread of its own while the next block is read.
        with BlockWriter(args.format, sys.stdout, metrics=args.metric, behind=True) as writer:
            _, _, problems = read_paths(args.paths, options, each=writer.write)
            if writer.rows or not problems:
                writer.close()
        rows = writer.rows
    else:
        frame, results, problems = read_paths(args.paths, options)
        rows = frame.height
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


def _presets() -> str:
    """The rule sets `--rules` takes by name (from `presets`: the rules module would bring polars
    into every command's start-up)."""
    from ..detection.presets import preset_names

    return ", ".join(["default", *preset_names()])


def _add_scan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="audit every run under a folder: spikes and their likely causes",
        formatter_class=_Formatter,
        description="Find every run under PATH, read its logs, apply the spike rules and say why each\n"
        "spike most likely happened.\n\n"
        "Exit codes: 0 no spike found; 1 spikes found; 2 usage error, bad rules or config, a file\n"
        "that cannot be written, or (with --strict) a file that could not be read; 3 internal error\n"
        "(a bug: please report it, with --debug's traceback); 130 interrupted (Ctrl-C).",
        epilog="Example:\n  lossguard scan runs/\n  lossguard scan runs/ --format json --output report.json\n"
        "  lossguard scan runs/ --rules olmo-core\n  lossguard scan runs/ --compare-rules rules/default.toml llm-foundry",
    )
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="folder of runs, run folder or log file (default: `paths` in --config)")
    p.add_argument("--rules", action="append", type=Path, metavar="FILE_OR_DIR", help=f"rules file, folder of them, or a preset: {_presets()} (repeatable; default: default)")
    p.add_argument("--format", choices=["table", "json", "markdown", "html"], default="table", help="report format (default: table)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--run", metavar="GLOB", help="only runs whose name matches GLOB")
    p.add_argument("--metric", metavar="NAME", help="only spikes of this metric (loss, eval_loss, grad_norm...)")
    p.add_argument("--since", type=int, metavar="STEP", help="only spikes that start at or after STEP")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="runs read in parallel (default: the cores available, for scans large enough to gain from it)")
    p.add_argument("--strict", action="store_true", help="exit 2 if any file could not be read")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no warnings on stderr")
    p.add_argument("--config", type=Path, help="lossguard.toml with [aliases] and [[formats]]")
    p.add_argument("--log-format", dest="log_format", metavar="NAME", help="read every file as this format instead of detecting it")
    p.add_argument("--compare-rules", nargs=2, type=Path, metavar=("A", "B"), help="backtest: what rules A and B flag differently, per run")
    p.add_argument("--slack-digest", action="store_true", help="also post a digest of the scan to Slack (when configured)")
    p.set_defaults(func=_cmd_scan)


def _post_digest(result, args: argparse.Namespace) -> None:  # noqa: ANN001
    """The nightly report's summary in Slack: one message, the runs with spikes and their top cause,
    leaving out what the daemon's silences cover (its state_dir, from the same config)."""
    import socket

    from ..alerts.message import digest
    from ..alerts.slack import client_from
    from ..report.scan_report import summary

    settings = _config(args)[0]
    sink = client_from(settings)
    if sink is None:
        print("lossguard: warning: --slack-digest, but Slack is not configured; no digest posted", file=sys.stderr)
        return
    runs, silenced = _unsilenced(result, _state_dir(settings.state_dir) / "state.db")
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


def _cmd_scan(args: argparse.Namespace) -> int:
    import os
    from dataclasses import replace

    from ..report import compare as cmp
    from ..report import scan_report as report
    from .progress import Progress
    from ..detection.rules import load_rules
    from ..report.audit import scan

    options = _read_options(args)
    if args.log_format:
        options.reader(args.log_format)  # an unknown name is a usage error before anything is read
    if not args.paths:
        settings = _config(args)[0]
        args.paths = list(settings.paths)
        args.rules = args.rules or list(settings.rules) or None
        if not args.paths:
            raise UsageError("nothing to scan: give PATH arguments or `paths` in --config")
    jobs = args.jobs
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs must be at least 1")
    show_progress = sys.stderr.isatty() and not args.quiet
    rule_sets = [load_rules([p]) for p in args.compare_rules] if args.compare_rules else [load_rules(args.rules)]
    results = []
    for rules in rule_sets:
        progress = Progress() if show_progress else None
        try:
            result = scan(args.paths, rules=rules, options=options, run_glob=args.run, jobs=jobs, progress=progress)
        finally:
            if progress:
                progress.close()
        if args.metric or args.since is not None:
            keep = lambda i: (not args.metric or i.metric == args.metric) and (args.since is None or i.step >= args.since)  # noqa: E731
            runs = tuple(replace(r, analysis=replace(r.analysis, incidents=tuple(filter(keep, r.incidents)))) for r in result.runs)
            result = replace(result, runs=runs)
        results.append(result)
    result = results[0]
    if args.run and not result.runs:
        from ..ingest.discover import collect

        names = sorted({f.run for f in collect(args.paths, globs=options.globs)[0]})
        shown = ", ".join(printable(n) for n in names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
        raise UsageError(f"no run matches {printable(args.run)!r} (runs found: {shown or 'none'})")
    if not result.runs and not result.all_problems:
        raise UsageError(f"no training logs found under {', '.join(map(str, args.paths))}")
    if args.metric:
        known = {m for r in results for rep in r.runs for m in rep.analysis.metrics} | {rule.metric for r in results for rule in r.rules.rules}
        if args.metric not in known:
            raise UsageError(f"no run logs a metric {printable(args.metric)!r} and no rule judges one (metrics found: {', '.join(sorted(known))})")
    if args.compare_rules:
        rows = cmp.compare(results[0], results[1])
        names = [results[0].rules.origin, results[1].rules.origin]
        if args.format == "json":
            import json

            text = json.dumps(cmp.to_json(rows, *names), indent=2) + "\n"
        else:
            text = cmp.to_text(rows, *names)
    else:
        colour = args.output is None and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        text = report.render(result, args.format, colour=colour)
    if args.output:
        write_file(args.output, text)
    else:
        sys.stdout.write(text)
    if args.slack_digest:
        _post_digest(result, args)
    problems = result.all_problems
    if problems and not args.quiet and (args.output or args.format != "table"):
        for problem in problems:
            print(f"warning: {printable(str(problem))}", file=sys.stderr)
    if not result.runs:
        print("lossguard: error: no file under the given paths could be read", file=sys.stderr)
        return EXIT_USAGE
    if args.strict and problems:
        return EXIT_USAGE
    return EXIT_FOUND if any(r.incidents for r in results[0].runs) else EXIT_OK


def _add_alert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "alert",
        help="alert sinks: send a test message to Slack and a test alert to Alertmanager",
        formatter_class=_Formatter,
        description="`alert test` posts a test message with the configured Slack bot token (LOSSGUARD_SLACK_TOKEN +\n"
        "LOSSGUARD_SLACK_CHANNEL) or webhook (LOSSGUARD_SLACK_WEBHOOK_URL), and a test alert (alertname\n"
        "LossguardTest, severity info, resolved by itself after 5 minutes) to every configured Alertmanager\n"
        "replica, and says exactly what went wrong where it fails. Exit 0 when every one took it; 2 when one\n"
        "refused it or nothing is configured (exit 1 means \"spikes found\" everywhere in lossguard).",
        epilog="Example:\n  LOSSGUARD_SLACK_TOKEN=xoxb-... lossguard alert test --channel '#training'\n"
        "  lossguard alert test --config /etc/lossguard/lossguard.toml",
    )
    p.add_argument("action", choices=["test"], help="what to do")
    p.add_argument("--channel", help="channel to post to (default: LOSSGUARD_SLACK_CHANNEL)")
    p.add_argument("--config", type=Path, help="lossguard.toml with a [slack] table")
    p.set_defaults(func=_cmd_alert)


def _cmd_alert(args: argparse.Namespace) -> int:
    import socket

    from ..alerts.message import build_test
    from ..alerts.slack import SlackBot, client_from

    settings = _config(args)[0]
    channel = args.channel or settings.slack_channel
    if settings.slack_token is not None and not channel:
        raise UsageError("a bot token needs a channel: --channel or LOSSGUARD_SLACK_CHANNEL")
    sink = client_from(settings, channel=channel, retries=2)
    if sink is None and not settings.alertmanager_urls:
        raise UsageError(
            "no alert sink is configured: set LOSSGUARD_SLACK_TOKEN and LOSSGUARD_SLACK_CHANNEL, or LOSSGUARD_SLACK_WEBHOOK_URL, "
            "or [alertmanager] urls"
        )
    failed = False
    if sink is not None:
        target = f"channel {printable(channel)}" if isinstance(sink, SlackBot) else "the incoming webhook"
        delivery = sink.post(build_test(host=socket.gethostname(), channel=channel))
        failed |= _said(delivery, f"test message to Slack {target}")
    if settings.alertmanager_urls:
        import time

        from ..alerts.alertmanager import shown
        from ..alerts.labels import test_alert
        from ..alerts.sinks import alertmanager_client

        alert = test_alert(now=time.time(), host=settings.alertmanager_host or socket.gethostname(), extra=settings.alertmanager_extra_labels)
        for url in settings.alertmanager_urls:  # each replica on its own: one that refuses is named
            failed |= _said(alertmanager_client(settings, [url]).post([alert]), f"test alert to Alertmanager {shown(url)}")
    return EXIT_USAGE if failed else EXIT_OK


def _said(delivery, what: str) -> bool:  # noqa: ANN001
    """Print how a test delivery went; True when it failed."""
    if delivery.ok:
        print(f"{what}: delivered")
        return False
    print(f"lossguard: {what} failed: {scrub(printable(delivery.describe()))}", file=sys.stderr)
    return True


def _home() -> Path | None:
    """The user's home folder, or None where there is none to find: HOME unset and a uid with no
    passwd entry (`env -i`, a container run with an arbitrary uid). Path.home() raises there; the
    places under it are then only not there, unless a command has nowhere else to go."""
    import os

    home = os.path.expanduser("~")
    return Path(home) if home != "~" and os.path.isabs(home) else None


def config_places() -> list[Path]:
    """Where a lossguard.toml is looked for when --config is not given, first found wins: the
    current folder, the user's config folder, then the system's (the service's)."""
    import os

    home = _home()
    xdg = os.environ.get("XDG_CONFIG_HOME") or (str(home / ".config") if home else None)
    user = [Path(xdg) / "lossguard" / "lossguard.toml"] if xdg else []
    return [Path("lossguard.toml"), *user, Path("/etc/lossguard/lossguard.toml")]


def _discover_config(given: Path | None) -> tuple[Path | None, str]:
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


def _state_dir(given: Path | None) -> Path:
    import os

    if given is not None:
        return given
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    home = _home()
    base = os.environ.get("XDG_STATE_HOME") or (str(home / ".local" / "state") if home else None)
    if base is None:
        raise UsageError(
            f"no state directory: HOME is not set and uid {os.getuid()} has no passwd entry; "
            "give --state-dir (or state_dir in the config, or set STATE_DIRECTORY or XDG_STATE_HOME)"
        )
    return Path(base) / "lossguard"


def _add_watch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="follow live runs and alert on spikes (the daemon)",
        formatter_class=_Formatter,
        description="Follow every run under PATH as it grows and raise each spike once: to Slack when\n"
        "configured (LOSSGUARD_SLACK_*), else to the log; --jsonl adds a JSON-lines file of notifications.\n"
        "History found at the first start is read for the windows but not alerted (use `scan` for it).\n"
        "SIGTERM/SIGINT stop it cleanly; SIGHUP reloads the rules.",
        epilog="Example:\n  lossguard watch /data/runs --state-dir /var/lib/lossguard\n  lossguard watch runs/ --polling --poll-interval 5   # NFS/Lustre",
    )
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="runs folders (default: `paths` in the config)")
    p.add_argument("--rules", action="append", type=Path, metavar="FILE_OR_DIR", help=f"rules file, folder of them, or a preset: {_presets()} (repeatable; default: `rules` in the config, else default)")
    p.add_argument("--config", type=Path, help="lossguard.toml (see deploy/lossguard.toml)")
    p.add_argument("--state-dir", type=Path, help="default: $STATE_DIRECTORY, else the XDG state dir")
    p.add_argument("--poll-interval", type=float, metavar="SECONDS", help="seconds between rescans when polling (--polling, or a root on NFS/Lustre/CIFS/FUSE; default 10)")
    p.add_argument("--polling", action="store_true", default=None, help="no inotify at all, only rescans every --poll-interval (roots on network filesystems are polled anyway)")
    p.add_argument("--stall-after", type=float, metavar="MINUTES", help="alert when a run makes no step for this long (0: never; default 30)")
    p.add_argument("--jsonl", type=Path, metavar="FILE", help="also append every notification to FILE as JSON lines")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics on http://HOST:PORT/metrics (a port alone: 127.0.0.1)")
    p.add_argument("--metrics-textfile", type=Path, metavar="FILE", help="write the metrics to FILE for node_exporter's textfile collector (*.prom)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="what the daemon logs (default: info)")
    p.set_defaults(func=_cmd_watch)


def _cmd_watch(args: argparse.Namespace) -> int:
    import logging
    import os

    from ..watch.settings import load_settings

    # The file checked whole as `_config` checks it, in two steps: the read options bring polars in.
    settings = load_settings(
        args.config, paths=args.paths or None, rules=args.rules, state_dir=args.state_dir, poll_interval=args.poll_interval,
        polling=args.polling, stall_after=args.stall_after, jsonl=args.jsonl, log_level=args.log_level,
        metrics_listen=args.metrics_listen, metrics_textfile=args.metrics_textfile,
    )
    # Before polars is imported: its pool is sized once, from the environment (which still wins).
    os.environ.setdefault("POLARS_MAX_THREADS", str(settings.threads))
    # A pass queries a few hundred new rows, where the streaming engine polars picks by default is
    # the slower one (its async executor wakes for each query): the spike rule over 520 points takes
    # 3.0 ms there, 0.9 ms in memory.
    os.environ.setdefault("POLARS_ENGINE_AFFINITY", "in-memory")

    from ..alerts.slack import client_from
    from ..ingest.config import read_options
    from ..watch.daemon import Daemon, setup_logging
    from ..detection.rules import load_rules
    from ..alerts.sinks import ConsoleSink, JsonlSink, SlackSink, alertmanager_sink
    if not settings.paths:
        raise UsageError("nothing to watch: give PATH arguments or `paths` in the config")
    for path in settings.paths:
        if not path.exists():
            raise UsageError(f"{path}: no such folder to watch (create it first, or fix the path)")
        if not (path.is_dir() or path.is_file()):
            raise UsageError(f"{path}: not a folder or a regular file")
    setup_logging(settings.log_level)
    logger = logging.getLogger("lossguard")
    options = read_options(args.config)
    rules = list(settings.rules) or None
    load_rules(rules)  # refuse bad rules before starting
    sinks: dict = {}
    manners = dict(
        routes=tuple(settings.slack_routes), min_interval=settings.slack_min_interval,
        run_cooldown=settings.slack_run_cooldown, group_threshold=settings.slack_group_threshold,
    )
    client = client_from(settings)
    if client is not None:
        sinks["slack"] = SlackSink(client, **manners, state_dir=_state_dir(settings.state_dir).resolve())
    if settings.alertmanager_urls:
        sinks["alertmanager"] = alertmanager_sink(settings)
    if not sinks:
        sinks["console"] = ConsoleSink(logger.warning)
    if settings.jsonl:
        sinks["jsonl"] = JsonlSink(settings.jsonl)
    daemon = Daemon(
        list(settings.paths),
        rules_loader=lambda: load_rules(rules),
        state_dir=_state_dir(settings.state_dir),
        sinks=sinks,
        options=options,
        poll_interval=settings.poll_interval,
        polling=settings.polling,
        rescan_interval=settings.rescan_interval,
        stall_after=settings.stall_after * 60,
        metrics=_metrics(settings),
        plots=settings.plots,
    )
    return daemon.run()


def _metrics(settings):  # noqa: ANN001, ANN202
    """How the daemon builds its metrics once its state is open, or None when neither is asked for."""
    if not (settings.metrics_listen or settings.metrics_textfile):
        return None
    from ..watch.metrics import Metrics
    from ..watch.settings import parse_listen

    listen = parse_listen(settings.metrics_listen) if settings.metrics_listen else None
    return lambda path, sinks: Metrics(path, sinks=sinks, listen=listen, textfile=settings.metrics_textfile, run_ttl=settings.metrics_run_ttl)


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="what the daemon follows, open incidents, undelivered notifications",
        formatter_class=_Formatter,
        description="Read the daemon's state (safe while it runs).",
        epilog="Example:\n  lossguard status --state-dir /var/lib/lossguard",
    )
    _add_state_options(p)
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    p.set_defaults(func=_cmd_status)


def _add_state_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, metavar="DIR", help="the daemon's state directory (default: state_dir in --config, else $STATE_DIRECTORY, else the XDG state dir)")
    p.add_argument("--config", type=Path, help="lossguard.toml naming the state_dir (default: the first found, as `config check` says)")


def _state_dir_of(args: argparse.Namespace) -> Path:
    """--state-dir, else the config's state_dir, else the default the daemon uses."""
    if args.state_dir is not None or args.config is None:
        return _state_dir(args.state_dir)
    return _state_dir(_config(args)[0].state_dir)


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from ..silences import Silence
    from ..state import read_summary

    path = _state_dir_of(args) / "state.db"
    if not path.exists():
        raise UsageError(f"{path}: no state yet (has `lossguard watch` run with this state dir?)")
    summary = read_summary(path)
    for n in summary["undelivered"]:  # (a state written before errors were scrubbed at the source)
        n["error"] = n["error"] and scrub(n["error"])
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    p = printable
    print(f"following {len(summary['files'])} file(s){':' if summary['files'] else ''}")
    for f in summary["files"]:
        print(f"  {p(f['run'])}  {p(f['path'])}  {p(f['format'] or '?')}  byte {f['offset']}{'  (unreadable)' if f['dead'] else ''}")
    print(f"{len(summary['open_incidents'])} open incident(s){':' if summary['open_incidents'] else ''}")
    for inc in summary["open_incidents"]:
        print(f"  {p(inc['run'])}  step {inc['step']}  {p(inc['rule'])}")
    print(f"{len(summary['undelivered'])} undelivered notification(s){':' if summary['undelivered'] else ''}")
    for n in summary["undelivered"]:
        print(f"  #{n['id']} {n['kind']}  attempts {n['attempts']}{'  PERMANENT' if n['permanent'] else ''}  {p(n['error'] or '')}")
    print(f"{len(summary['silences'])} silence(s) in force{':' if summary['silences'] else ''}")
    for s in summary["silences"]:
        print(f"  {_silence_line(Silence.from_json(s))}")
    return EXIT_OK


def _add_outbox(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "outbox",
        help="undelivered notifications: list them, retry them, or drop them",
        formatter_class=_Formatter,
        description="The daemon keeps every notification it could not deliver. A permanent failure (a revoked\n"
        "token, a channel the bot is not in) waits for your fix; the daemon retries such failures when it\n"
        "restarts or reloads (SIGHUP), `retry` puts them back in line at once, `drop` gives them up.\n"
        "Safe while the daemon runs. Without IDs, retry and drop act on every undelivered entry.",
        epilog="Example:\n  lossguard outbox list --state-dir /var/lib/lossguard\n  lossguard outbox retry 12 13\n  lossguard outbox drop --all",
    )
    p.add_argument("action", choices=["list", "retry", "drop"], help="list: what waits and why; retry: back in line now; drop: give up on them")
    p.add_argument("ids", nargs="*", type=int, metavar="ID", help="outbox entries (as `list` shows them)")
    p.add_argument("--all", action="store_true", help="with drop: every undelivered entry (drop needs IDs or --all)")
    _add_state_options(p)
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format of list (default: table)")
    p.set_defaults(func=_cmd_outbox)


def _cmd_outbox(args: argparse.Namespace) -> int:
    import json
    import time

    from ..state import State

    if args.action == "drop" and not args.ids and not args.all:
        raise UsageError("outbox drop needs the IDs to drop, or --all")
    _row_ids(args.ids, "outbox entry", "lossguard outbox list")
    state = State.attach(_state_dir_of(args))
    try:
        ids = args.ids or None
        if args.action == "list":
            entries = state.undelivered(ids)
            if args.format == "json":
                print(json.dumps([e.__dict__ for e in entries], indent=2))
                return EXIT_OK
            print(f"{len(entries)} undelivered notification(s)")
            for e in entries:
                age = max(0.0, time.time() - e.created) / 60
                why = ("PERMANENT: " if e.permanent else "") + (e.error or "not tried yet")
                print(f"  #{e.id}  {e.sink}  {e.kind}  {printable(e.run)}  {age:.0f} min old  attempts {e.attempts}  {scrub(printable(why))}")
            return EXIT_OK
        missing = sorted(set(args.ids) - {e.id for e in state.undelivered(ids)}) if ids else []
        done = state.retry(ids) if args.action == "retry" else state.drop(ids)
        verb = "back in line" if args.action == "retry" else "dropped"
        print(f"{done} notification(s) {verb}" + ("" if args.action == "drop" else " (the daemon sends them at its next round)"))
        if missing:  # (delivered already, or never there: as `silence expire` says of an id it does not know)
            raise _no_such("undelivered outbox entry", missing, "lossguard outbox list")
        return EXIT_OK
    finally:
        state.close()


ROW_ID_MAX = 2**63 - 1
"""The largest id a state row can have (SQLite's INTEGER PRIMARY KEY); a larger one overflows the query."""


def _row_ids(ids: list[int], what: str, listing: str) -> list[int]:
    """IDs as `listing` shows them; one below 1 or past 64 bits names no row (and SQLite could not
    even be asked about it: the query overflows)."""
    beyond = [i for i in ids if not 0 < i <= ROW_ID_MAX]
    if beyond:
        raise _no_such(what, beyond, listing)
    return ids


def _no_such(what: str, ids: list[int], listing: str) -> UsageError:
    return UsageError(f"no {what} {', '.join(f'#{i}' for i in ids)} (see `{listing}`)")


def _add_silence(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "silence",
        help="hold alerts back for a while: add, list or expire silences",
        formatter_class=_Formatter,
        description="A silence holds back the daemon's notifications (Slack, console, JSON lines) for the runs,\n"
        "rules, metrics or likely causes it names (shell globs), from now until --for or --until. The\n"
        "daemon still records every incident; one still open when the silence ends is reported then,\n"
        "once. Safe while the daemon runs: it honours a new silence at its next delivery. Alertmanager\n"
        "has silences of its own (amtool silence add); lossguard's do not hide alerts from it.",
        epilog="Example:\n  lossguard silence add --run 'gpt-7b-*' --for 2h --comment 'restarting from 41k'\n"
        "  lossguard silence add --run exp1 --rule loss-spike --until 2026-12-02T09:00 --comment 'known bad shard'\n"
        "  lossguard silence list\n  lossguard silence expire 3",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="silence matching alerts from now on", formatter_class=_Formatter,
                             epilog="Example:\n  lossguard silence add --run 'gpt-7b-*' --for 2h --comment 'restarting from 41k'")
    add.add_argument("--run", required=True, metavar="GLOB", help="runs whose name matches GLOB ('*': every run)")
    add.add_argument("--rule", metavar="GLOB", help="only incidents of rules matching GLOB")
    add.add_argument("--metric", metavar="GLOB", help="only incidents of metrics matching GLOB (loss, grad_norm...)")
    add.add_argument("--cause", metavar="GLOB", help="only incidents whose likely cause matches GLOB (" + ", ".join(_cause_names()) + ")")
    until = add.add_mutually_exclusive_group(required=True)
    until.add_argument("--for", dest="duration", metavar="DURATION", help="how long: 90s, 30m, 2h, 1h30m, 1d")
    until.add_argument("--until", metavar="TIME", help="until when: ISO 8601, local time unless a zone is given (2026-12-02T09:00)")
    add.add_argument("--comment", required=True, help="why (shown in `silence list`, `status` and the report when it ends)")
    listing = actions.add_parser("list", help="the silences in force (with --all: ended ones too)", formatter_class=_Formatter,
                                 epilog="Example:\n  lossguard silence list --format json")
    listing.add_argument("--all", action="store_true", help="also the silences that have ended (kept 30 days)")
    listing.add_argument("--limit", type=_count, default=ENDED_SHOWN, metavar="N",
                         help=f"with --all: the N ended last (default: {ENDED_SHOWN}; 0: every one kept)")
    listing.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    expire = actions.add_parser("expire", help="end silences now", formatter_class=_Formatter, epilog="Example:\n  lossguard silence expire 3 4")
    expire.add_argument("ids", nargs="+", type=int, metavar="ID", help="silences (as `silence list` shows them)")
    for q in (add, listing, expire):
        _add_state_options(q)
    p.set_defaults(func=_cmd_silence)


def _check_rule_matchers(args: argparse.Namespace) -> None:
    """A silence whose --rule or --metric matches nothing in the rules in force would never hold
    anything back: a typo, said now rather than found out at the next page."""
    from ..detection.rules import load_rules

    rules = load_rules(list(_config(args)[0].rules) or None).rules
    for flag, given, known in (("--rule", args.rule, [r.name for r in rules]), ("--metric", args.metric, sorted({r.metric for r in rules}))):
        if given is not None and not any(fnmatchcase(k, given) for k in known):
            raise UsageError(f"{flag} {given!r} matches none of the rules in force ({', '.join(known)})")


def _cause_names() -> list[str]:
    from ..alerts.message import CAUSE_TITLES

    return list(CAUSE_TITLES)


def _silence_line(s) -> str:  # noqa: ANN001 - a silences.Silence
    import datetime as dt

    until = dt.datetime.fromtimestamp(s.end).astimezone().isoformat(timespec="minutes")
    by = f"by {printable(s.author)}: " if s.author else ""
    return f"#{s.id}  {printable(s.matchers())}  until {until}  ({by}{printable(s.comment)})"


def _author() -> str:
    """Who adds a silence: the user behind sudo, else this one; a uid with no passwd entry (a
    container's arbitrary uid) has no name, and is named by its number."""
    import getpass
    import os

    try:
        return os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):  # (KeyError up to Python 3.12, OSError since)
        return f"uid {os.getuid()}"


ENDED_SHOWN = 100
"""Ended silences `silence list --all` shows by default: the last ones, not the month a state keeps."""


def _count(text: str) -> int:
    """A --limit: a whole number, 0 or more."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number (0 or more)")
    return int(text)


def _list_silences(state, args: argparse.Namespace, now: float) -> int:  # noqa: ANN001 - a state.State
    """`silence list`: those in force; with --all, then the last ended ones (--limit), and how many
    more the state keeps. One write to stdout: a print per line cost more than the query."""
    import json

    shown, more = state.silences(now=now), 0
    if args.all:
        ended, total = state.ended_silences(now=now, limit=args.limit or None)
        shown, more = sorted(shown + ended, key=lambda s: s.id), total - len(ended)
    hidden = f"{more} older ended silence(s) not shown (`--limit 0` lists every one)" if more else ""
    if args.format == "json":
        sys.stdout.write(json.dumps([s.to_json() for s in shown], indent=2) + "\n")
        if hidden:
            print(f"lossguard: {hidden}", file=sys.stderr)
        return EXIT_OK
    lines = [f"{len(shown)} silence(s){' (ended ones too)' if args.all else ' in force'}{':' if shown else ''}"]
    lines += [f"  {_silence_line(s)}{'  (ended)' if s.ended(now) else ''}" for s in shown]
    sys.stdout.write("\n".join(lines + ([f"  ... and {hidden}"] if hidden else [])) + "\n")
    return EXIT_OK


def _cmd_silence(args: argparse.Namespace) -> int:
    import time

    from ..silences import parse_duration, parse_until
    from ..state import State

    now = time.time()
    if args.action == "add":
        ends = now + parse_duration(args.duration) if args.duration is not None else parse_until(args.until, now)
        cause = args.cause
        if cause is not None and not any(fnmatchcase(c, cause) for c in _cause_names()):
            raise UsageError(f"--cause {cause!r} matches no cause lossguard names (causes: {', '.join(_cause_names())})")
        if not args.comment.strip():
            raise UsageError("--comment is empty: say why, for whoever is on call next")
        if args.rule is not None or args.metric is not None:
            _check_rule_matchers(args)
    state = State.attach(_state_dir_of(args), create=args.action == "add")
    try:
        if args.action == "add":
            s = state.add_silence(run=args.run, rule=args.rule, metric=args.metric, cause=args.cause, starts=now, ends=ends,
                                  comment=args.comment.strip(), author=_author())
            print(f"silence {_silence_line(s)} added; expire it early with `lossguard silence expire {s.id}`")
            return EXIT_OK
        if args.action == "list":
            return _list_silences(state, args, now)
        missing = []
        for ident in _row_ids(args.ids, "silence", "lossguard silence list --all"):
            s = state.expire_silence(ident, now=now)
            if s is None:
                missing.append(ident)
            else:
                print(f"silence #{s.id} ended (the daemon reports what it held back and is still open at its next delivery)")
        if missing:
            raise _no_such("silence", missing, "lossguard silence list --all")
        return EXIT_OK
    finally:
        state.close()


def _add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="check a configuration and show the effective settings",
        formatter_class=_Formatter,
        description="`config check` validates the configuration file, the environment (LOSSGUARD_*), the\n"
        "credential files and the rules, then prints the effective settings with secrets masked and\n"
        "the state directory resolved. Exit 0 when valid, 2 with a clear message when not.\n"
        "Without --config, every command uses the first of ./lossguard.toml,\n"
        "$XDG_CONFIG_HOME/lossguard/lossguard.toml (~/.config/...) and /etc/lossguard/lossguard.toml.",
        epilog="Example:\n  lossguard config check --config /etc/lossguard/lossguard.toml",
    )
    p.add_argument("action", choices=["check"], help="check: validate and print the effective settings")
    p.add_argument("--config", type=Path, help="lossguard.toml (default: the first found, see above)")
    p.set_defaults(func=_cmd_config)


def _cmd_config(args: argparse.Namespace) -> int:
    from ..detection.rules import load_rules

    settings = _config(args)[0]
    rules = load_rules(list(settings.rules) or None)
    shown = {"config file": f"{args.config or '-'} ({args.config_how})", **settings.masked()}
    shown["state_dir"] = f"{_state_dir(settings.state_dir)}" + ("" if settings.state_dir else " (default: $STATE_DIRECTORY, else the XDG state dir)")
    width = max(len(k) for k in shown)
    for key, value in shown.items():
        print(f"{key:<{width}}  {printable(str(value))}")
    print(f"{'rules (loaded)':<{width}}  {len(rules.rules)} from {printable(rules.origin)}")
    missing = [str(p) for p in settings.paths if not p.exists()]
    if missing:
        print(f"lossguard: warning: paths that do not exist (yet): {printable(', '.join(missing))}", file=sys.stderr)
    return EXIT_OK


def _add_completion(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        formatter_class=_Formatter,
        description="Print a script that completes lossguard's commands and options in your shell.",
        epilog='Example:\n  source <(lossguard completion bash)        # or add it to ~/.bashrc\n'
        '  lossguard completion zsh > "${fpath[1]}/_lossguard"',
    )
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    p.set_defaults(func=_cmd_completion)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """Drawn from the parser itself, so it never goes stale: commands at the first word, each
    command's options after it, files and folders otherwise."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = sorted(sub.choices)
    cases = []
    for name in commands:
        options = sorted(o for a in sub.choices[name]._actions for o in a.option_strings)
        cases.append(f'        {name}) opts="{" ".join(options)}" ;;')
    body = "\n".join(cases)
    script = f"""_lossguard() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} opts
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{" ".join(commands)} --help --version --debug" -- "$cur"))
        return
    fi
    case "${{COMP_WORDS[1]}}" in
{body}
        *) opts="" ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _lossguard lossguard
"""
    if shell == "zsh":
        script = "#compdef lossguard\nautoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def _cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(build_parser(), args.shell))
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
    _add_scan(sub)
    _add_alert(sub)
    _add_watch(sub)
    _add_status(sub)
    _add_outbox(sub)
    _add_silence(sub)
    _add_config(sub)
    _add_completion(sub)
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
                args.config, args.config_how = _discover_config(args.config)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
