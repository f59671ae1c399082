"""What a click from Slack costs: the time from an envelope sent down the Socket Mode link to its
ack, and to the chat.update that rewrites the alert, median of --clicks clicks (each a new
*Silence this run 1 h*, so each commits a silence), against the tests' local servers: the real
slack-sdk Socket Mode client and WebClient, a real state on disk (synchronous=FULL).

    python tests/perf/bench_click.py [--clicks 20]

The same is measured for a retried envelope (already applied: answered from its row) and for a
refusal (an actor not listed), so the figure of a commit shows beside what it saves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lossguard.alerts.link import slack_link  # noqa: E402
from lossguard.alerts.pipeline import Dispatcher  # noqa: E402
from lossguard.alerts.slack import SlackBot  # noqa: E402
from lossguard.state import State  # noqa: E402
from tests.slack_server import SlackServer  # noqa: E402
from tests.socket_server import SocketServer  # noqa: E402
from tests.test_actions import ANA, envelope  # noqa: E402
from tests.test_pipeline import BASE, Clock, bot_sink, posts, raise_  # noqa: E402


def _update_after(slack: SlackServer, since: int, timeout: float = 15.0) -> float:
    """When the first chat.update after request number `since` reached the server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in slack.requests[since:]:
            if r.path == "/api/chat.update":
                return r.at
        time.sleep(0.0005)
    raise RuntimeError("no chat.update")


def _clicks(slack: SlackServer, socket: SocketServer, key: str, n: int, *, user: str = ANA, same: bool = False) -> tuple[list[float], list[float]]:
    acked, updated = [], []
    for i in range(n):
        eid = "e-same" if same else f"e-{user}-{i}"
        since = len(slack.requests)
        sent = time.monotonic()
        socket.send(envelope("lossguard.silence_run", key=key, choice="1h", user=user, clicked=time.time(), envelope_id=eid))
        count = len(socket.acks_of(eid)) + 1 if same else 1
        socket.wait_ack(eid, count=count)
        acked.append(max(t for t, a in socket.acks if a.get("envelope_id") == eid) - sent)
        if user == ANA:
            updated.append(_update_after(slack, since) - sent)
        time.sleep(0.05)  # (the ephemeral answer goes out before the next click)
    return acked, updated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clicks", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, SlackServer() as slack, SocketServer() as socket:
        slack.socket_url = socket.url
        state = State(Path(tmp) / "state")
        raise_(state, BASE)
        clock = Clock()
        Dispatcher(state, {"slack": bot_sink(slack, buttons=True)}, clock=clock, sleep=clock.sleep, wall=time.time).round()
        key = posts(slack)[-1]["blocks"][-1]["block_id"].removeprefix("lossguard|")
        bot = SlackBot("xoxb-2222-SECRET", "#training", base_url=slack.base_url, retries=0)
        link = slack_link(app_token="xapp-1-A0-1-BENCH", base_url=slack.base_url, bot=bot, state=state.secondary(),
                          status_state=state.secondary(), actors=[ANA], rules=lambda: [("loss-spike", "loss")]).start()
        socket.wait_connected()
        _clicks(slack, socket, key, 2)  # (warm: the first click imports and compiles what the rest reuse)
        acked, updated = _clicks(slack, socket, key, args.clicks)
        again, again_updated = _clicks(slack, socket, key, args.clicks, same=True)
        refused, _ = _clicks(slack, socket, key, args.clicks, user="U0EVE00001")
        link.close()
        state.close()
    ms = lambda xs: f"{statistics.median(xs) * 1e3:7.1f} ms"  # noqa: E731
    print(f"{args.clicks} clicks each, median (envelope sent -> ack | -> alert updated):")
    print(f"  Silence this run 1 h (a silence committed): {ms(acked)} | {ms(updated)}")
    print(f"  the same envelope again (nothing applied):  {ms(again)} | {ms(again_updated)}")
    print(f"  an actor not listed (refused):              {ms(refused)} | (no update)")


if __name__ == "__main__":
    main()
