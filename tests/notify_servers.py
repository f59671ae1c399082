"""Local stand-ins for the services behind notification URLs, spoken to by apprise itself: a stdlib
HTTP server recording every request (json://, ntfy://, gotify://, mmost://, rocket:// name its host)
with a status chosen per path, and aiosmtpd's SMTP server for mailto://. Each binds 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict
    body: bytes
    at: float = 0.0
    """When it arrived (monotonic): which of two requests came first."""

    def json(self) -> dict:
        return json.loads(self.body)


class HookServer:
    """Records each request; answers `status[path prefix]` (default 200) after `delay[...]` seconds."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.status: dict[str, int] = {}
        self.delay: dict[str, float] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size)
                with server._lock:
                    server.requests.append(Request(self.command, self.path, dict(self.headers), body, time.monotonic()))
                match = max((p for p in server.status if self.path.startswith(p)), key=len, default=None)
                pause = max((p for p in server.delay if self.path.startswith(p)), key=len, default=None)
                if pause is not None:
                    time.sleep(server.delay[pause])
                code = server.status[match] if match is not None else 200
                answer = json.dumps({"success": code < 300, "id": "1"}).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # (the daemon was killed while it waited for the answer)

            do_POST = do_PUT = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def to(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith(path)]

    def __enter__(self) -> HookServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class MailServer:
    """aiosmtpd's SMTP server on 127.0.0.1: the messages it was handed, parsed."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list = []
        server = self

        class Handler:
            async def handle_DATA(self, _server, _session, envelope) -> str:  # noqa: ANN001
                import email
                from email import policy

                server.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
                return "250 OK"

        with socket.socket() as s:  # (aiosmtpd checks it is up by connecting: it wants the port first)
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def url(self, to: str = "ops@example.com") -> str:
        return f"mailto://localhost:{self.port}?to={to}&from=lossguard@example.com&mode=insecure"

    def __enter__(self) -> MailServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()


def refused_port() -> int:
    """A port nothing listens on (a connection there is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
