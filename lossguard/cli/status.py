"""`lossguard status`: what the daemon's state says (files followed, open incidents, undelivered
notifications, silences in force), read while the daemon runs."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..escaping import printable
from ..redact import scrub
from .exits import EXIT_OK
from .help_text import Formatter
from .silence import silence_line
from .state_access import add_state_options, state_dir_of


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="what the daemon follows, open incidents, undelivered notifications",
        formatter_class=Formatter,
        description="Read the daemon's state (safe while it runs).",
        epilog="Example:\n  lossguard status --state-dir /var/lib/lossguard",
    )
    add_state_options(p)
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import json

    from ..silences import Silence
    from ..state import read_summary

    path = state_dir_of(args) / "state.db"
    if not path.exists():
        raise UsageError(f"{path}: no state yet (has `lossguard watch` run with this state dir?)")
    summary = read_summary(path)
    for n in summary["undelivered"]:  # (a state written before errors were scrubbed at the source)
        n["error"] = n["error"] and scrub(n["error"])
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    p = printable
    files, incidents, undelivered, silences = (summary[k] for k in ("files", "open_incidents", "undelivered", "silences"))
    _section(f"following {len(files)} file(s)", [
        f"{p(f['run'])}  {p(f['path'])}  {p(f['format'] or '?')}  byte {f['offset']}{'  (unreadable)' if f['dead'] else ''}" for f in files
    ])
    _section(f"{len(incidents)} open incident(s)", [
        f"{p(inc['run'])}  step {inc['step']}  {p(inc['rule'])}" + (f"  (acknowledged by {p(inc['acked_by'])})" if inc.get("acked_by") else "")
        for inc in incidents
    ])
    _section(f"{len(undelivered)} undelivered notification(s)", [
        f"#{n['id']} {n['kind']}  attempts {n['attempts']}{'  PERMANENT' if n['permanent'] else ''}  {p(n['error'] or '')}" for n in undelivered
    ])
    _section(f"{len(silences)} silence(s) in force", [silence_line(Silence.from_json(s)) for s in silences])
    if summary["slack_link"] is not None:
        print(_link_line(summary["slack_link"]))
    return EXIT_OK


def _link_line(link: dict) -> str:
    """The Socket Mode link (the buttons on alerts) as the daemon last found it."""
    import datetime as dt

    since = dt.datetime.fromtimestamp(float(link.get("at") or 0)).astimezone().isoformat(timespec="seconds")
    words = {"connected": "connected: buttons on alerts are taken", "reconnecting": "reconnecting", "refused": "REFUSED by Slack",
             "connecting": "connecting"}.get(str(link.get("state")), str(link.get("state")))
    why = "".join(f": {scrub(printable(str(link[k])))}" for k in ("error", "fix") if link.get(k))
    return f"slack link {words}{why} (since {since})"


def _section(heading: str, lines: list[str]) -> None:
    """One part of the table: its heading (with a colon when something follows), then each line indented."""
    print(heading + (":" if lines else ""))
    for line in lines:
        print(f"  {line}")
