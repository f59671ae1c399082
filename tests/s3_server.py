"""A real S3 API on 127.0.0.1 for the object store tests: moto's server (as s3fs's own tests use it),
and in front of it a small proxy that counts the requests lossguard makes and can answer `503
SlowDown` for a while, as a throttling store does. Writers talk to moto directly (their requests are
not counted); lossguard is pointed at the proxy through AWS_ENDPOINT_URL."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message><RequestId>lg</RequestId></Error>")
SECRET = "lg-test-secret-KEY-0123456789abcdef"
"""The secret access key the tests give: it must appear in no log line, error or report."""


class S3Proxy:
    """Forwards to moto, counting requests by method; `fail(n)` answers the next n with 503 SlowDown."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.counts: Counter[str] = Counter()
        self.lines: list[str] = []
        self._failing = 0
        self._passing = 0
        self.failed = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # (keep-alive, as clients use a store)

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:
                    proxy.counts[self.command] += 1
                    proxy.lines.append(f"{self.command} {self.path}")
                    failing = proxy._failing > 0 and proxy._passing <= 0
                    proxy._passing -= 1
                    if failing:
                        proxy._failing -= 1
                        proxy.failed += 1
                if failing:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                conn.request(self.command, self.path, body=body or None, headers={k: v for k, v in self.headers.items()})
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(key, value)
                # (a HEAD's length is the object's, which it does not send)
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # (a close waits one poll)

    def fail(self, n: int, *, after: int = 0) -> None:
        """The next n requests answered 503 SlowDown, once `after` more have been forwarded."""
        with self._lock:
            self._failing, self._passing = n, after

    def reset(self) -> None:
        """The counts started again (the server is the module's: each test counts its own)."""
        with self._lock:
            self.counts.clear()
            self.lines.clear()
            self.failed = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
