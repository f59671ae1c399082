"""`lossguard silence`: silences added, listed and expired in the daemon's state, each checked
against what it could match (the rules in force, the causes lossguard names) when it is added."""

from __future__ import annotations

import argparse
import sys

from ..escaping import printable
from .config_file import configured
from .exits import EXIT_OK
from .help_text import Formatter, Later
from .state_access import add_state_options, no_such, row_ids, state_dir_of


ENDED_SHOWN = 100
"""Ended silences `silence list --all` shows by default: the last ones, not the month a state keeps."""


def _count(text: str) -> int:
    """A --limit: a whole number, 0 or more."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number (0 or more)")
    return int(text)


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "silence",
        help="hold alerts back for a while: add, list or expire silences",
        formatter_class=Formatter,
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
    adding = actions.add_parser("add", help="silence matching alerts from now on", formatter_class=Formatter,
                                epilog="Example:\n  lossguard silence add --run 'gpt-7b-*' --for 2h --comment 'restarting from 41k'")
    adding.add_argument("--run", required=True, metavar="GLOB", help="runs whose name matches GLOB ('*': every run)")
    adding.add_argument("--rule", metavar="GLOB", help="only incidents of rules matching GLOB")
    adding.add_argument("--metric", metavar="GLOB", help="only incidents of metrics matching GLOB (loss, grad_norm...)")
    adding.add_argument("--cause", metavar="GLOB", help=Later(lambda: "only incidents whose likely cause matches GLOB (" + ", ".join(_cause_names()) + ")"))
    until = adding.add_mutually_exclusive_group(required=True)
    until.add_argument("--for", dest="duration", metavar="DURATION", help="how long: 90s, 30m, 2h, 1h30m, 1d")
    until.add_argument("--until", metavar="TIME", help="until when: ISO 8601, local time unless a zone is given (2026-12-02T09:00)")
    adding.add_argument("--comment", required=True, help="why (shown in `silence list`, `status` and the report when it ends)")
    listing = actions.add_parser("list", help="the silences in force (with --all: ended ones too)", formatter_class=Formatter,
                                 epilog="Example:\n  lossguard silence list --format json")
    listing.add_argument("--all", action="store_true", help="also the silences that have ended (kept 30 days)")
    listing.add_argument("--limit", type=_count, default=ENDED_SHOWN, metavar="N",
                         help=f"with --all: the N ended last (default: {ENDED_SHOWN}; 0: every one kept)")
    listing.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    expire = actions.add_parser("expire", help="end silences now", formatter_class=Formatter, epilog="Example:\n  lossguard silence expire 3 4")
    expire.add_argument("ids", nargs="+", type=int, metavar="ID", help="silences (as `silence list` shows them)")
    for q in (adding, listing, expire):
        add_state_options(q)
    p.set_defaults(func=_run)


def _rules_in_force(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(name, metric) of the rules in force: what a --rule or --metric must match."""
    from ..detection.rules import load_rules

    rules = load_rules(list(configured(args)[0].rules) or None)
    return [(r.name, r.metric) for r in (*rules.rules, *rules.crashes)]


def _cause_names() -> list[str]:
    from ..alerts.message import CAUSE_TITLES

    return list(CAUSE_TITLES)


def silence_line(s) -> str:  # noqa: ANN001 - a silences.Silence
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
    lines += [f"  {silence_line(s)}{'  (ended)' if s.ended(now) else ''}" for s in shown]
    sys.stdout.write("\n".join(lines + ([f"  ... and {hidden}"] if hidden else [])) + "\n")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    import time

    from dataclasses import asdict

    from ..silences import new_silence, parse_duration, parse_until
    from ..state import State

    now = time.time()
    if args.action == "add":
        ends = now + parse_duration(args.duration) if args.duration is not None else parse_until(args.until, now)
        checked = args.rule is not None or args.metric is not None
        new = new_silence(run=args.run, rule=args.rule, metric=args.metric, cause=args.cause, ends=ends, now=now, comment=args.comment,
                          author=_author(), rules=_rules_in_force(args) if checked else None, causes=_cause_names())
    state = State.attach(state_dir_of(args), create=args.action == "add")
    try:
        if args.action == "add":
            s = state.add_silence(**asdict(new))
            print(f"silence {silence_line(s)} added; expire it early with `lossguard silence expire {s.id}`")
            return EXIT_OK
        if args.action == "list":
            return _list_silences(state, args, now)
        missing = []
        for ident in row_ids(args.ids, "silence", "lossguard silence list --all"):
            s = state.expire_silence(ident, now=now)
            if s is None:
                missing.append(ident)
            else:
                print(f"silence #{s.id} ended (the daemon reports what it held back and is still open at its next delivery)")
        if missing:
            raise no_such("silence", missing, "lossguard silence list --all")
        return EXIT_OK
    finally:
        state.close()
