"""How long a Slack post accepted by Slack stays unrecorded: the window in which a kill -9 posts it
again at the next start (docs/daemon.md, "Exactly-once intent, at-least-once delivery").

    python tests/perf/bench_duplicate_window.py [--posts 300] [--locked 2.0]

Against the local server that answers like Slack (tests/slack_server.py), through the real
slack-sdk and a real state file: each post's window runs from the moment the server has the
request to the commit that records it (the server's answer travelling back, slack-sdk's parsing,
the commit). With --locked, an outside BEGIN IMMEDIATE holds the state's write lock that long
during one post: the record waits behind it, and the window grows by the wait.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lossguard.alerts.pipeline import Dispatcher  # noqa: E402
from lossguard.alerts.sinks import SlackSink  # noqa: E402
from lossguard.alerts.slack import SlackBot  # noqa: E402
from lossguard.model import Incident, Notice  # noqa: E402
from lossguard.state import State  # noqa: E402
from tests.slack_server import SlackServer  # noqa: E402

INC = Incident(run="exp", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=20, peak_step=20, value=9.0, baseline=2.0, threshold=4.0)


def windows(posts: int, locked: float) -> list[float]:
    """Each post's window in seconds (the last one with the lock held by another connection)."""
    out: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, SlackServer() as slack:
        state = State(Path(tmp) / "state")
        with state.transaction() as tx:
            for step in range(posts):
                ident = tx.add_incident(replace(INC, step=20 + step), source="x", quiet=False, now=1.0)
                tx.enqueue(Notice("opened", "exp", INC, source="x"), incident_id=ident, sinks=["slack"], now=1.0)
        sink = SlackSink(SlackBot("xoxb-bench", "#c", base_url=slack.base_url, retries=0), min_interval=0, group_threshold=10**6)
        mark_sent = state.mark_sent

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003
            if locked and len(out) == posts - 1:
                hold(state.path, locked)
            mark_sent(*args, **kwargs)
            out.append(time.monotonic() - slack.requests[-1].at)

        state.mark_sent = timed
        Dispatcher(state, {"slack": sink}).round()
        state.close()
    return out


def hold(path: Path, seconds: float) -> None:
    """Another connection takes the write lock now and keeps it `seconds` (a pass's long walk)."""
    ready = threading.Event()

    def run() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        ready.set()
        time.sleep(seconds)
        db.execute("COMMIT")
        db.close()

    threading.Thread(target=run, daemon=True).start()
    ready.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=300)
    parser.add_argument("--locked", type=float, default=0.0)
    args = parser.parse_args()
    got = windows(args.posts, args.locked)
    calm = sorted(got[:-1] if args.locked else got)
    ms = [w * 1000 for w in calm]
    print(f"{len(ms)} posts: window p50 {statistics.median(ms):.2f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.2f} ms, max {ms[-1]:.2f} ms")
    if args.locked:
        print(f"with the write lock held {args.locked:.1f} s by another connection: {got[-1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
