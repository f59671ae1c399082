"""WebSocket frames (RFC 6455, section 5) cut out of the bytes a socket gives, for the Socket Mode
link: bytes in, whole messages out, the rest kept for the next read.

slack-sdk's builtin client parses by recursion, one level a frame and one a read, until a read
happens to end where a frame ends: a burst of envelopes (Slack sending faster than the link reads)
never ends so, and past about a thousand frames the parser fails with RecursionError, losing the
bytes it held, so that the next read starts inside a frame and its garbage closes the link. This
reader is a loop over a buffer: a frame is taken only once all of it has come (as a log reader
never consumes half a record), whatever the number of frames or reads, and a message is never
larger than MAX_MESSAGE. Pure: no socket, no clock."""

from __future__ import annotations

import struct
from dataclasses import dataclass

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CONTROL = (CLOSE, PING, PONG)
MAX_MESSAGE = 8 << 20
"""An envelope is a few KiB (Slack caps a message's blocks well under 1 MiB): a frame announcing
more is no envelope, and the link is closed rather than the memory given to it."""


class FrameError(ValueError):
    """The bytes are no WebSocket stream a server may send (the connection cannot go on)."""


@dataclass(frozen=True)
class Frame:
    """A whole message (its fragments joined) or a control frame."""

    opcode: int
    data: bytes


class FrameReader:
    def __init__(self, *, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._buffer = bytearray()
        self._fragments: list[bytes] = []
        self._fragmented: int | None = None
        """The opcode of a message whose first fragments came (its last one has not)."""

    @property
    def pending(self) -> int:
        """Bytes held: a frame or a message not whole yet."""
        return len(self._buffer) + sum(map(len, self._fragments))

    def feed(self, data: bytes) -> list[Frame]:
        """The messages and control frames `data` completes, in order; what is left of a frame is
        kept for the next call."""
        self._buffer += data
        out: list[Frame] = []
        at = 0
        while (frame := self._frame(at)) is not None:
            at, fin, opcode, payload = frame
            if opcode in CONTROL:
                out.append(Frame(opcode, payload))
            elif (joined := self._join(fin, opcode, payload)) is not None:
                out.append(joined)
        del self._buffer[:at]
        return out

    def _frame(self, at: int) -> tuple[int, bool, int, bytes] | None:
        """(where the next frame starts, fin, opcode, payload) of the frame at `at`, or None when it
        has not all come."""
        buf = self._buffer
        if len(buf) - at < 2:
            return None
        b1, b2 = buf[at], buf[at + 1]
        fin, opcode, masked, length = bool(b1 & 0x80), b1 & 0x0F, bool(b2 & 0x80), b2 & 0x7F
        head = 2
        if length == 126:
            head = 4
            if len(buf) - at < head:
                return None
            (length,) = struct.unpack_from("!H", buf, at + 2)
        elif length == 127:
            head = 10
            if len(buf) - at < head:
                return None
            (length,) = struct.unpack_from("!Q", buf, at + 2)
        if b1 & 0x70:
            raise FrameError("a frame with reserved bits set (no extension was agreed)")
        if opcode in CONTROL and (length > 125 or not fin):
            raise FrameError("a control frame longer than 125 bytes or fragmented")
        if opcode not in (CONTINUATION, TEXT, BINARY, *CONTROL):
            raise FrameError(f"a frame of unknown opcode {opcode:#x}")
        if length + sum(map(len, self._fragments)) > self.max_message:
            raise FrameError(f"a message of more than {self.max_message} bytes")
        key = bytes(buf[at + head:at + head + 4]) if masked else b""
        start = at + head + len(key)
        end = start + length
        if len(buf) < end:
            return None
        payload = bytes(buf[start:end])
        if key:  # (servers do not mask; a proxy might)
            n = len(payload)
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes((key * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        return end, fin, opcode, payload

    def _join(self, fin: bool, opcode: int, payload: bytes) -> Frame | None:
        """A data frame into its message: whole when `fin`, else kept until its last fragment."""
        if opcode == CONTINUATION:
            if self._fragmented is None:
                raise FrameError("a continuation frame with no message begun")
            self._fragments.append(payload)
            if not fin:
                return None
            joined = Frame(self._fragmented, b"".join(self._fragments))
            self._fragments, self._fragmented = [], None
            return joined
        if self._fragmented is not None:
            raise FrameError("a new message began before the last one ended")
        if fin:
            return Frame(opcode, payload)
        self._fragmented, self._fragments = opcode, [payload]
        return None
