"""`lossguard outbox`: the notifications the daemon could not deliver, listed, put back in line or
dropped, in its state while it runs."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..escaping import printable
from ..redact import scrub
from .exits import EXIT_OK
from .help_text import Formatter
from .state_access import add_state_options, no_such, row_ids, state_dir_of


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "outbox",
        help="undelivered notifications: list them, retry them, or drop them",
        formatter_class=Formatter,
        description="The daemon keeps every notification it could not deliver. A permanent failure (a revoked\n"
        "token, a channel the bot is not in) waits for your fix; the daemon retries such failures when it\n"
        "restarts or reloads (SIGHUP), `retry` puts them back in line at once, `drop` gives them up.\n"
        "Safe while the daemon runs. Without IDs, retry and drop act on every undelivered entry.",
        epilog="Example:\n  lossguard outbox list --state-dir /var/lib/lossguard\n  lossguard outbox retry 12 13\n  lossguard outbox drop --all",
    )
    p.add_argument("action", choices=["list", "retry", "drop"], help="list: what waits and why; retry: back in line now; drop: give up on them")
    p.add_argument("ids", nargs="*", type=int, metavar="ID", help="outbox entries (as `list` shows them)")
    p.add_argument("--all", action="store_true", help="with drop: every undelivered entry (drop needs IDs or --all)")
    add_state_options(p)
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format of list (default: table)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import json
    import time

    from ..state import State

    if args.action == "drop" and not args.ids and not args.all:
        raise UsageError("outbox drop needs the IDs to drop, or --all")
    row_ids(args.ids, "outbox entry", "lossguard outbox list")
    state = State.attach(state_dir_of(args))
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
            raise no_such("undelivered outbox entry", missing, "lossguard outbox list")
        return EXIT_OK
    finally:
        state.close()
