"""Socket Mode's side, on 127.0.0.1, for the real slack-sdk client to connect to (as slack-sdk's own
tests run a mock Socket Mode server): a WebSocket server whose URL the Slack-like HTTP server hands
out from apps.connections.open. Every connection is greeted with `hello`, as Slack does; the test
sends envelopes (`interactive` block_actions, `slash_commands`) down the newest connection, and
every message the client sends back (its acks) is recorded with when it came. `burst` sends
thousands at once; `send_raw` what is no envelope.

The standard library has no WebSocket server: this uses `websockets` (its threaded, synchronous
server), a test dependency only."""

from __future__ import annotations

import json
import threading
import time

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve


class SocketServer:
    def __init__(self) -> None:
        self.acks: list[tuple[float, dict]] = []
        self.connections: list[ServerConnection] = []
        self.sent: dict[str, float] = {}
        """envelope_id -> when it was last sent."""
        self.refuse = False
        """Answer every new connection's handshake 503 (Slack's side gone)."""
        self._server = serve(self._handle, "127.0.0.1", 0, process_request=self._gate)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self._server.socket.getsockname()[1]}/link/?ticket=t-1&app_id=A0TEST"

    def _gate(self, connection: ServerConnection, request):  # noqa: ANN001, ANN202
        return connection.respond(503, "Socket Mode is down\n") if self.refuse else None

    def _handle(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        ws.send(json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0TEST"},
                            "debug_info": {"host": "applink-test", "approximate_connection_time": 18060}}))
        try:
            for raw in ws:
                self.acks.append((time.monotonic(), json.loads(raw)))
        except ConnectionClosed:
            pass

    def live(self) -> list[ServerConnection]:
        return [c for c in self.connections if c.state.name == "OPEN"]

    def wait_connected(self, count: int = 1, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.connections) < count or not self.live():
            if time.monotonic() > deadline:
                raise AssertionError(f"no Socket Mode connection (had {len(self.connections)})")
            time.sleep(0.02)

    def send(self, envelope: dict) -> None:
        self.sent[envelope["envelope_id"]] = time.monotonic()
        self.live()[-1].send(json.dumps(envelope))

    def burst(self, envelopes: list[dict]) -> None:
        """Every envelope sent down the newest connection at once, each a frame of its own, as fast
        as the socket takes them (Slack delivering a backlog after an outage)."""
        ws = self.live()[-1]
        for envelope in envelopes:
            self.sent[envelope["envelope_id"]] = time.monotonic()
            ws.send(json.dumps(envelope))

    def send_raw(self, text: str | bytes) -> None:
        """A frame as it is given: text that is no envelope, or binary."""
        self.live()[-1].send(text)

    def acks_of(self, envelope_id: str) -> list[dict]:
        return [a for _, a in self.acks if a.get("envelope_id") == envelope_id]

    def wait_ack(self, envelope_id: str, count: int = 1, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while len(self.acks_of(envelope_id)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"no ack of {envelope_id}")
            time.sleep(0.01)
        return self.acks_of(envelope_id)[-1]

    def drop(self) -> None:
        """Every connection closed, as when Slack's side restarts."""
        for c in self.live():
            c.close()

    def __enter__(self) -> SocketServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.refuse = True
        self.drop()
        self._server.shutdown()
