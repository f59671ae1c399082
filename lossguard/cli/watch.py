"""`lossguard watch`: the daemon started from the command line, its settings (config file, then
flags) checked and its sinks built before it follows anything."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..ingest.sources import object_store
from ..errors import UsageError
from .help_text import Formatter, Later, presets
from .state_access import state_dir


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="follow live runs and alert on spikes (the daemon)",
        formatter_class=Formatter,
        description="Follow every run under PATH as it grows and raise each spike once: to Slack when\n"
        "configured (LOSSGUARD_SLACK_*), to notification URLs ([notify] urls), else to the log; --jsonl adds a\n"
        "JSON-lines file of notifications; on_incident runs a command for each notice.\n"
        "History found at the first start is read for the windows but not alerted (use `scan` for it).\n"
        "SIGTERM/SIGINT stop it cleanly; SIGHUP reloads the rules.",
        epilog="Example:\n  lossguard watch /data/runs --state-dir /var/lib/lossguard\n  lossguard watch runs/ --polling --poll-interval 5   # NFS/Lustre",
    )
    p.add_argument("paths", nargs="*", type=object_store.root, metavar="PATH", help="runs folders, or object store prefixes (s3://bucket/prefix, gs://, az://: polled every --poll-interval; default: `paths` in the config)")
    p.add_argument("--rules", action="append", type=Path, metavar="FILE_OR_DIR", help=Later(lambda: f"rules file, folder of them, or a preset: {presets()} (repeatable; default: `rules` in the config, else default)"))
    p.add_argument("--config", type=Path, help="lossguard.toml (see deploy/lossguard.toml)")
    p.add_argument("--state-dir", type=Path, help="default: $STATE_DIRECTORY, else the XDG state dir")
    p.add_argument("--poll-interval", type=float, metavar="SECONDS", help="seconds between rescans when polling (--polling, or a root on NFS/Lustre/CIFS/FUSE; default 10)")
    p.add_argument("--polling", action="store_true", default=None, help="no inotify at all, only rescans every --poll-interval (roots on network filesystems are polled anyway)")
    p.add_argument("--stall-after", type=float, metavar="MINUTES", help="alert when a run makes no step for this long (0: never; default 30)")
    p.add_argument("--crash-after", type=float, metavar="MINUTES", help="report the error a run's output ends in once it has been quiet this long (default 2)")
    p.add_argument("--jsonl", type=Path, metavar="FILE", help="also append every notification to FILE as JSON lines")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics on http://HOST:PORT/metrics (a port alone: 127.0.0.1)")
    p.add_argument("--metrics-textfile", type=Path, metavar="FILE", help="write the metrics to FILE for node_exporter's textfile collector (*.prom)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="what the daemon logs (default: info)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import logging
    import os

    from ..watch.settings import load_settings

    # The file checked whole as `configured` checks it, in two steps: the read options bring polars in.
    settings = load_settings(
        args.config, paths=args.paths or None, rules=args.rules, state_dir=args.state_dir, poll_interval=args.poll_interval,
        polling=args.polling, stall_after=args.stall_after, crash_after=args.crash_after, jsonl=args.jsonl, log_level=args.log_level,
        metrics_listen=args.metrics_listen, metrics_textfile=args.metrics_textfile,
    )
    # Before polars is imported: its pool is sized once, from the environment (which still wins).
    os.environ.setdefault("POLARS_MAX_THREADS", str(settings.threads))
    # A pass queries a few hundred new rows, where the streaming engine polars picks by default is
    # the slower one (its async executor wakes for each query): the spike rule over 520 points takes
    # 3.0 ms there, 0.9 ms in memory.
    os.environ.setdefault("POLARS_ENGINE_AFFINITY", "in-memory")

    from ..ingest.config import read_options
    from ..watch.daemon import Daemon, setup_logging
    from ..detection.rules import load_rules
    if not settings.paths:
        raise UsageError("nothing to watch: give PATH arguments or `paths` in the config")
    for path in settings.paths:
        if isinstance(path, str):
            continue  # (an object store's URL: its extra and its name are checked as the daemon is built)
        if not path.exists():
            raise UsageError(f"{path}: no such folder to watch (create it first, or fix the path)")
        if not (path.is_dir() or path.is_file()):
            raise UsageError(f"{path}: not a folder or a regular file")
    setup_logging(settings.log_level)
    logger = logging.getLogger("lossguard")
    options = read_options(args.config)
    rules = list(settings.rules) or None
    load_rules(rules)  # refuse bad rules before starting
    sinks, slack_app = _sinks(settings, logger)
    daemon = Daemon(
        list(settings.paths),
        rules_loader=lambda: load_rules(rules),
        state_dir=state_dir(settings.state_dir),
        sinks=sinks,
        options=options,
        poll_interval=settings.poll_interval,
        polling=settings.polling,
        rescan_interval=settings.rescan_interval,
        stall_after=settings.stall_after * 60,
        crash_after=settings.crash_after * 60,
        metrics=_metrics(settings),
        plots=settings.plots,
        slack_app=slack_app,
    )
    return daemon.run()


def _sinks(settings, logger):  # noqa: ANN001, ANN202
    """The sinks the settings name, by name, and the Slack app's Socket Mode settings (None: no
    buttons on alerts)."""
    from ..alerts.slack import SlackBot, client_from
    from ..alerts.sinks import ConsoleSink, JsonlSink, SlackSink, alertmanager_sink

    sinks: dict = {}
    manners = dict(
        routes=tuple(settings.slack_routes), min_interval=settings.slack_min_interval,
        run_cooldown=settings.slack_run_cooldown, group_threshold=settings.slack_group_threshold,
    )
    client = client_from(settings)
    slack_app = None
    if isinstance(client, SlackBot) and settings.slack_app_token is not None:  # (the buttons, and Socket Mode to take their clicks)
        slack_app = dict(app_token=settings.slack_app_token.get_secret_value(), base_url=settings.slack_base_url, bot=client_from(settings),
                         actors=list(settings.slack_actors))
    if client is not None:
        sinks["slack"] = SlackSink(client, **manners, state_dir=state_dir(settings.state_dir).resolve(), buttons=slack_app is not None,
                                   plot_button=not settings.plots)
    if settings.alertmanager_urls:
        sinks["alertmanager"] = alertmanager_sink(settings)
    if settings.notify_urls:
        import socket

        from ..alerts.notify import notify_sinks

        sinks.update(notify_sinks([u.get_secret_value() for u in settings.notify_urls], host=socket.gethostname()))
    if not sinks:
        sinks["console"] = ConsoleSink(logger.warning)
    if settings.jsonl:
        sinks["jsonl"] = JsonlSink(settings.jsonl)
    if settings.on_incident:  # (an action, not a channel people read: the console still speaks without one)
        from ..alerts.on_incident import NAME, action_sink

        sinks[NAME] = action_sink(settings)
    return sinks, slack_app


def _metrics(settings):  # noqa: ANN001, ANN202
    """How the daemon builds its metrics once its state is open, or None when neither is asked for."""
    if not (settings.metrics_listen or settings.metrics_textfile):
        return None
    from ..watch.metrics import Metrics
    from ..watch.settings import parse_listen

    listen = parse_listen(settings.metrics_listen) if settings.metrics_listen else None
    return lambda path, sinks: Metrics(path, sinks=sinks, listen=listen, textfile=settings.metrics_textfile, run_ttl=settings.metrics_run_ttl)
