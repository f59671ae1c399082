"""A local server on 127.0.0.1 that answers like Slack's Web API and incoming webhooks, for the real
slack-sdk to talk to (as slack-sdk's own tests do). Each test queues the answers it wants; the server
records every request (path, headers, body) so tests assert on what Slack would have received.

File uploads go the way files_upload_v2 takes with Slack: files.getUploadURLExternal hands out a
file id and an upload URL (here, on this server), the bytes are POSTed there, and
files.completeUploadExternal shares the uploaded files into a channel (and thread). `files` keeps
each file's bytes by id; completing a file that was not uploaded, or whose size is not the length
announced, is refused as Slack refuses it."""

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
    hold: threading.Event | None = None
    """Answer only once the test sets it (a Slack that hangs until the test has seen what it wanted
    meanwhile), or after `hold_limit` s: slack-sdk gives up at 10 s and posts again."""
    hold_limit: float = 9.0
    drop: bool = False
    """Close the connection without answering (a reset)."""
    answered: threading.Event = field(default_factory=threading.Event)
    """Set once the server stopped waiting and answered (or dropped the connection)."""


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict
    at: float = 0.0
    data: bytes = b""
    """The raw body (an upload's bytes)."""


@dataclass
class File:
    name: str
    length: int
    data: bytes | None = None


class SlackServer:
    def __init__(self, *, port: int = 0, echo: bool = False) -> None:
        self.requests: list[Request] = []
        self.queue: list[Answer] = []
        self.files: dict[str, File] = {}
        self._ts = 0
        self.socket_url: str | None = None
        self.slow: dict[str, float] = {}
        """path -> seconds every request to it waits before its answer (a Slack API that is slow today)."""
        self.answers: dict[str, list[Answer]] = {}
        """path -> answers for that path only, taken before `queue`'s."""
        self.always: dict[str, Answer] = {}
        """path -> the answer every request to it gets once its `answers` are taken (a Slack API
        failing today: `Answer(503, delay=4)` for usergroups.users.list)."""
        """What apps.connections.open answers (tests.socket_server's URL): Socket Mode's endpoint."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                data = self.rfile.read(length)
                ctype = self.headers.get("Content-Type", "")
                if self.path.startswith("/upload/"):
                    body: dict = {}
                elif "json" in ctype:
                    raw = data.decode()
                    body = json.loads(raw) if raw else {}
                else:
                    body = {k: v[0] for k, v in parse_qs(data.decode()).items()}
                    if "blocks" in body:
                        body["blocks"] = json.loads(body["blocks"])
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic(), data)
                server.requests.append(request)
                if echo:
                    print(f"{self.path}: {body.get('text', '')}", flush=True)
                for_path = server.answers.get(self.path)
                always = server.always.get(self.path)
                answer = for_path.pop(0) if for_path else always if always else server.queue.pop(0) if server.queue else Answer()
                if answer.delay or server.slow.get(self.path):
                    time.sleep(answer.delay or server.slow[self.path])
                if answer.hold is not None:
                    answer.hold.wait(answer.hold_limit)
                if answer.drop:
                    answer.answered.set()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                payload = answer.body(request) if callable(answer.body) else answer.body
                if payload is None:
                    payload = server._default(self.path, body, data)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                answer.answered.set()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _default(self, path: str, body: dict, data: bytes) -> dict | str:
        if path.startswith("/hooks/"):
            return "ok"
        if path == "/api/apps.connections.open":
            return {"ok": True, "url": self.socket_url} if self.socket_url else {"ok": False, "error": "invalid_auth"}
        if path == "/api/chat.postEphemeral":
            return {"ok": True, "message_ts": "1700000000.999999"}
        if path == "/api/files.getUploadURLExternal":
            file_id = f"F{len(self.files) + 1:06d}"
            self.files[file_id] = File(body.get("filename", ""), int(body.get("length", -1)))
            return {"ok": True, "file_id": file_id, "upload_url": f"{self.base_url.removesuffix('/api/')}/upload/v1/{file_id}"}
        if path.startswith("/upload/v1/"):
            file = self.files.get(path.rsplit("/", 1)[1])
            if file is None:
                return "invalid upload URL"
            file.data = data
            return f"OK - {len(data)}"
        if path == "/api/files.completeUploadExternal":
            shared = json.loads(body.get("files", "[]"))
            for f in shared:
                file = self.files.get(f.get("id", ""))
                if file is None or file.data is None or len(file.data) != file.length:
                    return {"ok": False, "error": "file_upload_size_mismatch" if file and file.data is not None else "file_not_found"}
            return {"ok": True, "files": [{"id": f["id"], "title": f.get("title", "")} for f in shared]}
        self._ts += 1
        return {"ok": True, "channel": body.get("channel", "C0TEST"), "ts": f"1700000000.{self._ts:06d}"}

    def uploads(self) -> list[tuple[Request, list[bytes]]]:
        """Each files.completeUploadExternal request and the bytes of the files it shared."""
        done = [r for r in self.requests if r.path == "/api/files.completeUploadExternal"]
        return [(r, [self.files[f["id"]].data or b"" for f in json.loads(r.body["files"])]) for r in done]

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


if __name__ == "__main__":
    # `python tests/slack_server.py [PORT]`: a stand-in for Slack on 127.0.0.1 that answers every call
    # as Slack would and prints the path and text of each, to try lossguard's Slack sink by hand.
    import sys

    with SlackServer(port=int(sys.argv[1]) if len(sys.argv) > 1 else 8765, echo=True) as local:
        print(f"answering like Slack at {local.base_url} (LOSSGUARD_SLACK_BASE_URL)", flush=True)
        local.thread.join()
