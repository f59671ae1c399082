"""The app token's Socket Mode connection: slack-sdk's builtin client (no dependency beyond
slack-sdk) for the handshake, the pings and the sends, driven so that a burst of envelopes is
taken whole, each acked once (alerts.slack owns the Web API side; this module is imported only by
a daemon with an app token, slack-sdk's Socket Mode package being slow to import).

Three things of the client are replaced, each for a failure seen under a burst of 3,000 envelopes:
- reading: its frame parser recursed once a frame until a read ended where a frame ended, which a
  burst never does (RecursionError, then reads starting inside a frame, then the link closed by
  the garbage); frames are cut by alerts.frames, a loop that keeps a partial frame for the next read.
- queueing: its queue was unbounded, and a second pool queued again behind it; here QUEUE
  envelopes wait at most, then the reading thread waits (TCP holds the rest, on Slack's side).
- handling: envelopes are taken one at a time on the client's own processing thread, in order,
  and each is acked once after `on_request` returned; what is not an envelope is said in one line
  (an envelope is not logged whole: its response_url and token are capabilities)."""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.builtin.connection import Connection, ConnectionState

from ..escaping import printable
from ..redact import remember
from .delivery import Delivery
from .frames import BINARY, CLOSE, PING, PONG, TEXT, FrameError, FrameReader
from .slack import DEFAULT_BASE_URL, _app_failure, _broken, retry_handlers

log = logging.getLogger("lossguard")
QUEUE = 64
"""Envelopes read and not yet taken; past that the link stops reading until one is taken."""
READ = 256 << 10
"""Bytes asked of the socket at once (slack-sdk's 1 KiB took several reads an envelope)."""

OnRequest = Callable[[dict], tuple[dict | None, Callable[[], None] | None]]


class _Connection(Connection):
    """slack-sdk's connection (handshake, ping, pong, send, disconnect) reading with FrameReader."""

    def run_until_completion(self, state: ConnectionState) -> None:
        reader = FrameReader()
        # slack-sdk's handshake reads its response up to the last line's \r: that line's \n is
        # the first byte left on the socket, before the first frame.
        handshake_tail = b"\n"
        while not state.terminated:
            if not self.is_active():
                time.sleep(0.2)
                continue
            try:
                with self.sock_receive_lock:
                    sock = self.sock
                    data = sock.recv(READ) if sock is not None else b""
                if not data:
                    raise ConnectionResetError("the connection was closed")
                if handshake_tail:
                    data, handshake_tail = data.removeprefix(handshake_tail), b""
                frames = reader.feed(data)
            except socket.timeout:
                continue
            except (OSError, FrameError) as exc:
                if not state.terminated and self.on_error_listener is not None:
                    self.on_error_listener(exc)
                self.disconnect()
                break
            for frame in frames:
                if frame.opcode == PING:
                    self.pong(frame.data)
                elif frame.opcode == PONG:
                    self._ponged(frame.data)
                elif frame.opcode == TEXT and self.on_message_listener is not None:
                    self.on_message_listener(frame.data.decode("utf-8", errors="replace"))
                elif frame.opcode == BINARY:
                    log.warning("a binary message from Slack was ignored (%d bytes; Socket Mode sends text)", len(frame.data))
                elif frame.opcode == CLOSE:
                    if self.on_close_listener is not None:
                        code = int.from_bytes(frame.data[:2], "big") if len(frame.data) >= 2 else 1005
                        self.on_close_listener(code, frame.data[2:].decode("utf-8", errors="replace"))
                    self.disconnect()
                    state.terminated = True
                    break
        state.terminated = True

    def disconnect(self) -> None:
        """Closed, its read woken first: slack-sdk's waits for the read (up to its 3 s timeout),
        during which the new connection's frames wait behind it on the same reading thread."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # (gone already)
                pass
        super().disconnect()

    def _ponged(self, data: bytes) -> None:
        """A pong to this connection's ping: it is alive (slack-sdk's monitor drops it after 4 pings unanswered)."""
        session, _, at = data.decode("utf-8", errors="replace").partition(":")
        if session == self.session_id:
            try:
                self.last_ping_pong_time = float(at)
            except ValueError:
                pass


class _Client(SocketModeClient):
    """slack-sdk's client with its connection reading by FrameReader, a bounded queue, and
    messages handled on its processing thread by `take` (none on its pool)."""

    def __init__(self, app_token: str, *, take: Callable[[str], None], queued: int, **options: object) -> None:
        self._take = take
        self._queue: queue.Queue[str] | None = None
        super().__init__(app_token, **options)  # (its processing thread starts here, before the queue below)
        self._queue = self.message_queue = queue.Queue(maxsize=queued)

    def connect(self) -> None:
        """One connection (the link owns reconnecting; Slack's `disconnect` asks for a new one)."""
        if self.wss_uri is None:
            self.wss_uri = self.issue_new_wss_url()
        old, old_state = self.current_session, self.current_session_state
        session = _Connection(url=self.wss_uri, logger=self.logger, ping_interval=self.ping_interval, receive_buffer_size=self.receive_buffer_size,
                              proxy=self.proxy, proxy_headers=self.proxy_headers, on_message_listener=self._on_message,
                              on_error_listener=self._on_error, on_close_listener=self._on_close, ssl_context=self.web_client.ssl)
        session.connect()
        old_state.terminated = True
        if old is not None:
            old.close()
        self.current_session, self.current_session_state = session, ConnectionState()
        if not self.current_app_monitor_started:
            self.current_app_monitor_started = True
            self.current_app_monitor.start()

    def _on_message(self, message: str) -> None:
        """Queued, waiting while QUEUE wait already (slack-sdk's logs the whole envelope at debug)."""
        while not self.closed:
            try:
                self._queue.put(message, timeout=1.0)
                return
            except queue.Full:
                continue

    def process_message(self) -> None:
        if self._queue is None:
            time.sleep(0.01)
            return
        try:
            raw = self._queue.get(timeout=1.0)
        except queue.Empty:
            return
        if not self.closed:
            self._take(raw)


class SocketModeLink:
    """The app token's Socket Mode connection, opened once; it does not reconnect by itself
    (alerts.link owns the backoff). `on_request(envelope) -> (ack payload or None, then)` runs
    for every envelope, one at a time: what it applies is committed when it returns; the ack is
    sent after, then `then()`, which must return at once (it hands the message's update to
    threads of its own: the next envelope's ack waits for it). `on_request` raising leaves the
    envelope unacked (Slack sends it again)."""

    def __init__(self, app_token: str, *, base_url: str = DEFAULT_BASE_URL, on_request: OnRequest, logger: logging.Logger,
                 ping_interval: float = 3.0, queued: int = QUEUE) -> None:
        remember(app_token)
        web = WebClient(base_url=base_url if base_url.endswith("/") else base_url + "/", timeout=10, retry_handlers=retry_handlers(retries=1))
        self._on_request = on_request
        self._hello = threading.Event()
        self._client = _Client(app_token, take=self._take, queued=queued, web_client=web, logger=logger, auto_reconnect_enabled=False,
                               ping_interval=ping_interval, concurrency=1)

    def _take(self, raw: str) -> None:
        """One message from Slack: a hello, a request for a new connection, or an envelope acked
        once `on_request` returned. Anything else is said in one line, never shown whole."""
        try:
            message = json.loads(raw)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            log.warning("a message from Slack that is no JSON object was ignored (%d characters)", len(raw))
            return
        kind = message.get("type")
        if kind == "hello":
            self._hello.set()
            return
        if kind == "disconnect":  # (Slack refreshes a connection every few hours: a new one, at once)
            self._client.connect_to_new_endpoint(force=True)
            return
        envelope_id = message.get("envelope_id")
        if not isinstance(envelope_id, str) or not envelope_id:
            log.warning("a message from Slack of type %s without an envelope_id was ignored (nothing to acknowledge)",
                        printable(str(kind))[:40])
            return
        try:
            payload, then = self._on_request(message)
        except Exception:  # noqa: BLE001 - not acked: Slack sends it again (the handler said why)
            log.debug("envelope %s left for Slack to send again", printable(envelope_id)[:80], exc_info=True)
            return
        try:
            self._client.send_socket_mode_response({"envelope_id": envelope_id, **({"payload": payload} if payload else {})})
        except (SlackClientError, OSError) as exc:
            # (applied, so Slack's retry finds it done and gets its answer then)
            log.info("the ack of envelope %s could not be sent (Slack sends it again): %s", printable(envelope_id)[:80], type(exc).__name__)
            return
        if then is not None:
            then()

    def open(self, *, hello_within: float = 10.0) -> Delivery:
        """Connected and greeted, or why not (permanent: a token Slack refuses, with the fix). Only
        Slack's `hello` says the link works (slack-sdk's connect logs a failed handshake, a 503 or a
        refused port, and returns as if it had worked: only its socket is missing)."""
        try:
            self._client.connect()
            if not self._client.is_connected():
                return Delivery(ok=False, error="the WebSocket handshake with Slack failed", permanent=False)
            if not self._hello.wait(hello_within):
                return Delivery(ok=False, error=f"Slack sent no hello within {hello_within:.0f} s of the handshake", permanent=False)
        except SlackApiError as exc:
            return _app_failure(exc)
        except (SlackClientError, OSError, ValueError, KeyError) as exc:
            return _broken(exc)
        return Delivery(ok=True)

    def connected(self) -> bool:
        return self._client.is_connected()

    def close(self) -> None:
        """Closed on a thread of its own: slack-sdk's close waits for its ping thread to wake (up to
        ping_interval), which neither a reconnect nor the daemon's stop should."""

        def close() -> None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - a connection already gone
                pass

        threading.Thread(target=close, name="slack-socket-close", daemon=True).start()
