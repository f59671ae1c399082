"""A local server on 127.0.0.1 that answers like Slack's Web API and incoming webhooks, for the real
slack-sdk to talk to (as slack-sdk's own tests do). Each test queues the answers it wants; the server
records every request (path, headers, body) so tests assert on what Slack would have received."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs


@dataclass
class Answer:
    status: int = 200
    body: dict | str | Callable[[Request], dict | str] | None = None
    """What to answer; a callable builds it from the request (a server that echoes what it got)."""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    """Close the connection without answering (a reset)."""


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict
    at: float = 0.0


class SlackServer:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.queue: list[Answer] = []
        self._ts = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length).decode()
                ctype = self.headers.get("Content-Type", "")
                if "json" in ctype:
                    body = json.loads(raw) if raw else {}
                else:
                    body = {k: v[0] for k, v in parse_qs(raw).items()}
                    if "blocks" in body:
                        body["blocks"] = json.loads(body["blocks"])
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                server.requests.append(request)
                answer = server.queue.pop(0) if server.queue else Answer()
                if answer.delay:
                    time.sleep(answer.delay)
                if answer.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                payload = answer.body(request) if callable(answer.body) else answer.body
                if payload is None:
                    payload = server._default(self.path, body)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _default(self, path: str, body: dict) -> dict | str:
        if path.startswith("/hooks/"):
            return "ok"
        self._ts += 1
        return {"ok": True, "channel": body.get("channel", "C0TEST"), "ts": f"1700000000.{self._ts:06d}"}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/api/"

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hooks/T000/B000/XXXXSECRETXXXX"

    def __enter__(self) -> SlackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
