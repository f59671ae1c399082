"""`lossguard status`: what the daemon's state says (files followed, open incidents, undelivered
notifications, silences in force), read while the daemon runs."""

from __future__ import annotations

import argparse
import time

from ..alerts.link import HEARTBEAT
from ..errors import UsageError
from ..escaping import printable
from ..ingest.sources import object_store
from ..redact import scrub
from ..watch.mirrors import OBJECTS
from .exits import EXIT_OK
from .help_text import Formatter
from .silence import silence_line
from .state_access import add_state_options, state_dir_of


STALE = 3 * HEARTBEAT
"""A link not heard from for this long is not running (it writes a heartbeat every HEARTBEAT s)."""


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
    link = summary["slack_link"]
    if link is not None:
        link["silent_for"] = _silent_for(link, time.time())
    objects = state_dir_of(args) / OBJECTS
    for f in summary["files"]:
        f["runs"] = _runs_of(f, f.pop("named", None))
        f["path"] = object_store.shown_path(f["path"], objects)  # (an object's copy: its URL)
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    p = printable
    files, incidents, folded, undelivered, silences = (summary[k] for k in ("files", "open_incidents", "folded_incidents", "undelivered", "silences"))
    _section(f"following {len(files)} file(s)", [
        f"{p(f['runs'])}  {p(f['path'])}  {p(f['format'] or '?')}  byte {f['offset']}{'  (unreadable)' if f['dead'] else ''}" for f in files
    ])
    _section(f"{len(incidents)} open incident(s)", [
        f"{p(inc['run'])}  step {inc['step']}  {p(inc['rule'])}" + (f"  (ranks {p(', '.join(map(str, inc['ranks'])))})" if inc.get("ranks") else "")
        + (f"  (acknowledged by {p(inc['acked_by'])})" if inc.get("acked_by") else "")
        for inc in incidents
    ])
    if summary["history_incidents"]:
        # Not alerts: found in what the logs held when the daemon first started.
        history = summary["history_incidents"]
        _section(f"{sum(h['open'] for h in history)} open in the history read at the first start, not alerted", [
            f"{p(h['run'])}  {p(h['rule'])}  {h['open']}" for h in history
        ])
    if folded:
        # Not alerts: the loss's own noise, said once in the run's noisy notice.
        _section(f"{sum(f['folded'] for f in folded)} firing(s) folded into noisy notices, not alerted", [
            f"{p(f['run'])}  {p(f['rule'])}  {f['folded']} folded into the noisy notice" for f in folded
        ])
    _section(f"{len(undelivered)} undelivered notification(s)", [
        f"#{n['id']} {n['kind']}  attempts {n['attempts']}{'  PERMANENT' if n['permanent'] else ''}  {p(n['error'] or '')}" for n in undelivered
    ])
    _section(f"{len(silences)} silence(s) in force", [silence_line(Silence.from_json(s)) for s in silences])
    if summary["slack_link"] is not None:
        print(_link_line(summary["slack_link"]))
    return EXIT_OK


def _runs_of(file: dict, named: str | None) -> str:
    """The runs a followed file's rows go to: its run, or, for a file whose rows name their runs,
    the name they give under the file's prefix (a W&B log's, kept in its cursor; an MLflow file
    store's metric file's, from its run's meta.yaml), else the prefix with `*` (a database of many
    runs: `exp1/*`, or `*` at the root followed), as `--run` globs take them; never the bare `.`."""
    from pathlib import Path

    from ..ingest.formats import FORMATS
    from ..ingest.table import run_of

    fmt = next((f for f in FORMATS if f.names_runs and f.name == file["format"]), None)
    if fmt is None:
        return str(file["run"])
    if named is None and hasattr(fmt.reader, "named"):  # (a file a metric: its place names its run)
        try:
            named = fmt.reader.named(Path(file["path"])).run
        except OSError:
            named = None
    return run_of(str(file["run"]), named or "*")


def _silent_for(link: dict, now: float) -> float | None:
    """Seconds since the link last said it was alive (it does every HEARTBEAT s while it runs);
    None once it stopped (nothing more is expected of it)."""
    if link.get("state") == "stopped":
        return None
    return max(0.0, round(now - float(link.get("beat") or link.get("at") or 0), 1))


def _link_line(link: dict) -> str:
    """The Socket Mode link (the buttons on alerts) as the daemon last found it, and how long ago
    it was last heard from: a link whose thread or daemon died says so, not how it last stood."""
    import datetime as dt

    since = dt.datetime.fromtimestamp(float(link.get("at") or 0)).astimezone().isoformat(timespec="seconds")
    words = {"connected": "connected: buttons on alerts are taken", "reconnecting": "reconnecting", "refused": "REFUSED by Slack",
             "connecting": "connecting", "failed": "FAILED (an unexpected error, see the daemon's log; starting again)"}.get(
        str(link.get("state")), printable(str(link.get("state"))))
    why = "".join(f": {scrub(printable(str(link[k])))}" for k in ("error", "fix") if link.get(k))
    silent = link.get("silent_for")
    if silent is None:
        heard = ""
    elif silent > STALE:
        heard = f"; NOT HEARD FROM for {silent / 60:.0f} min: the daemon or its link is not running, see its log"
    else:
        heard = f"; last heard {silent:.0f} s ago"
    return f"slack link {words}{why} (since {since}{heard})"


def _section(heading: str, lines: list[str]) -> None:
    """One part of the table: its heading (with a colon when something follows), then each line indented."""
    print(heading + (":" if lines else ""))
    for line in lines:
        print(f"  {line}")
