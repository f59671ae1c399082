"""The real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1 with a free port, temp
storage and no clustering, as Alertmanager's own tests start it; and a webhook receiver on
localhost that records what Alertmanager notifies. Tests skip (saying why) only where the binary
is absent."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
needs_alertmanager = pytest.mark.skipif(BINARY is None, reason="the alertmanager binary is not installed (apt install prometheus-alertmanager)")


def free_port() -> int:
    """A port nothing listens on now. Only for what cannot listen on port 0 itself (lossguard's
    metrics_listen takes 1-65535) or for an address meant to refuse: a port chosen here and bound
    later could be taken meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LISTENING = re.compile(rb'msg="Listening on" address=127\.0\.0\.1:(\d+)')


def listening_port(proc: subprocess.Popen, log: Path, *, since: int = 0, timeout: float = 60) -> int:
    """The port a Prometheus-family server started with `--web.listen-address=127.0.0.1:0` bound,
    from its info line `msg="Listening on" address=...` in `log` (after byte `since`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, "rb") as fh:
            fh.seek(since)
            found = LISTENING.search(fh.read())
        if found:
            return int(found.group(1))
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.02)
    raise AssertionError(f"{log.name}: no 'Listening on' line in {timeout:g} s")


class _Local:
    """A server on 127.0.0.1 (a free port) whose `answer(path, body)` gives each POST's status."""

    path = ""

    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                status = server.answer(self.path, self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, path: str, body: bytes) -> int:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{self.path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Webhook(_Local):
    """Records each notification Alertmanager posts (its JSON body)."""

    path = "/hook"

    def __init__(self) -> None:
        self.received: list[dict] = []
        super().__init__()

    def answer(self, path: str, body: bytes) -> int:
        self.received.append(json.loads(body))
        return 200


def config(webhook_url: str, *, group_wait: str = "2s") -> str:
    return f"""
route:
  receiver: hook
  group_by: [run]
  group_wait: {group_wait}
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {webhook_url}
        send_resolved: true
inhibit_rules:
  - source_matchers: [alertname="LossNonFinite"]
    target_matchers: [alertname="LossSpike"]
    equal: [run]
"""


class Alertmanager:
    """Listens on a port the kernel picks (port 0) the first time, read back from its log; a restart
    takes the same port again, as the daemon was told it: no port is chosen before it is bound, so
    side-by-side tests (pytest -n) never race for one."""

    def __init__(self, tmp: Path, webhook_url: str, *, port: int | None = None) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.config = tmp / "alertmanager.yml"
        self.config.write_text(config(webhook_url))
        self.port = port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "start() it first: its port is the one it bound"
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Alertmanager:
        log = self.tmp / "alertmanager.log"
        seen = log.stat().st_size if log.exists() else 0  # (a restart appends: its own lines follow)
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={self.config}", f"--storage.path={self.tmp / 'data'}", f"--web.listen-address=127.0.0.1:{self.port or 0}",
             "--cluster.listen-address=", "--log.level=info"],
            stdout=subprocess.DEVNULL, stderr=open(log, "ab"),
        )
        self.port = listening_port(self.proc, log, since=seen)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("alertmanager never became ready")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alerts(self, **filters: str) -> list[dict]:
        """GET /api/v2/alerts (active, silenced and inhibited; resolved ones are not listed)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as r:
            return [a for a in json.loads(r.read()) if all(a["labels"].get(k) == v for k, v in filters.items())]


def wait(predicate, timeout: float = 60, what: str = "condition"):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = predicate()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Proxy(_Local):
    """A reverse proxy before Alertmanager (`upstream`, or none: it answers 200 itself) that refuses
    what such proxies refuse: a body over `max_body` bytes (413, nginx's client_max_body_size is
    1 MB by default), and (as Alertmanager does for one malformed alert) any body holding an alert
    of a run in `bad` (400). `accepted` lists the alerts it let through, `answers` each status."""

    def __init__(self, upstream: str | None = None, *, max_body: int = 1 << 20, bad: tuple[str, ...] = ()) -> None:
        self.upstream, self.max_body, self.bad = upstream, max_body, bad
        self.accepted: list[dict] = []
        self.answers: list[int] = []
        super().__init__()

    def answer(self, path: str, body: bytes) -> int:
        alerts = json.loads(body) if len(body) <= self.max_body else []
        status = 413 if len(body) > self.max_body else 400 if any(a["labels"].get("run") in self.bad for a in alerts) else 200
        if status == 200 and self.upstream is not None:
            request = urllib.request.Request(self.upstream + path, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as r:
                r.read()
        if status == 200:
            self.accepted += alerts
        self.answers.append(status)
        return status
