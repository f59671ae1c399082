"""WebSocket frames cut out of what the socket gives (alerts.frames), written by the websockets
library's own frame serializer: whole messages out whatever the reads' sizes, nothing taken of a
frame before all of it came, and a stream no server may send refused."""

from __future__ import annotations

import random

import pytest
from websockets.frames import Frame, Opcode

from lossguard.alerts.frames import PING, TEXT, FrameError, FrameReader

OP_TEXT, OP_BINARY, OP_CONT, OP_PING = Opcode.TEXT, Opcode.BINARY, Opcode.CONT, Opcode.PING


def _wire(*frames: Frame) -> bytes:
    return b"".join(f.serialize(mask=False, extensions=[]) for f in frames)


STREAM = _wire(
    Frame(OP_TEXT, b'{"type": "hello"}'),
    Frame(OP_PING, b"sid:1.5"),
    Frame(OP_TEXT, b"x" * 300),  # (a 16-bit length)
    Frame(OP_TEXT, b"y" * 70_000),  # (a 64-bit length)
    Frame(OP_TEXT, b'{"part": ', fin=False), Frame(OP_PING, b"in between"), Frame(OP_CONT, b"1", fin=False), Frame(OP_CONT, b"}"),
    *[Frame(OP_TEXT, f'{{"envelope_id": "e-{i}"}}'.encode()) for i in range(3000)],
)


def _read(cuts: list[int]) -> list[tuple[int, bytes]]:
    reader, out, at = FrameReader(), [], 0
    for cut in [*cuts, len(STREAM)]:
        out += [(f.opcode, f.data) for f in reader.feed(STREAM[at:cut])]
        at = cut
    assert reader.pending == 0
    return out


def test_a_stream_read_in_pieces_of_any_size_gives_the_messages_of_one_read():
    whole = _read([])
    assert len(whole) == 4 + 2 + 3000 and whole[0] == (TEXT, b'{"type": "hello"}') and whole[1] == (PING, b"sid:1.5")
    assert whole[4] == (PING, b"in between") and whole[5] == (TEXT, b'{"part": 1}')  # (a control frame may come between fragments)
    rng = random.Random(7)
    for _ in range(5):
        assert _read(sorted(rng.sample(range(1, len(STREAM)), 2000))) == whole
    assert _read(list(range(1, 80_000))) == whole  # (byte by byte through the long frames)


def test_a_frame_cut_anywhere_is_not_taken_until_its_last_byte_comes():
    frame = _wire(Frame(OP_TEXT, b"z" * 200))
    reader = FrameReader()
    for i in range(len(frame) - 1):
        assert reader.feed(frame[i:i + 1]) == []
    assert [f.data for f in reader.feed(frame[-1:])] == [b"z" * 200]


@pytest.mark.parametrize("wire, why", [
    pytest.param(b"\x81\x7f" + (1 << 40).to_bytes(8, "big"), "more than", id="a frame announcing a terabyte"),
    pytest.param(_wire(Frame(OP_TEXT, b"a", fin=False), Frame(OP_TEXT, b"b")), "before the last one ended", id="a message inside a message"),
    pytest.param(_wire(Frame(OP_CONT, b"a")), "no message begun", id="a continuation of nothing"),
    pytest.param(b"\x83\x00", "unknown opcode", id="a reserved opcode"),
    pytest.param(b"\xc1\x00", "reserved bits", id="a compressed frame nobody agreed to"),
    pytest.param(b"\x09\x00", "control frame", id="a fragmented ping"),
])
def test_a_stream_no_server_may_send_is_refused(wire, why):
    with pytest.raises(FrameError, match=why):
        FrameReader().feed(wire)


def test_a_message_past_the_limit_is_refused_before_its_bytes_are_held():
    reader = FrameReader(max_message=1000)
    head = _wire(Frame(OP_BINARY, b"q" * 600, fin=False))
    assert reader.feed(head) == []
    with pytest.raises(FrameError, match="more than 1000"):
        reader.feed(_wire(Frame(OP_CONT, b"q" * 600))[:4])  # (its header alone says it is too long)


@pytest.mark.parametrize("size", [0, 1, 5, 300, 70_000])
def test_a_masked_frame_a_proxy_may_send_is_unmasked(size):
    # Servers do not mask; a proxy in between might. Each length's tail (not a multiple of the
    # 4-byte key) included.
    data = bytes(random.Random(size).getrandbits(8) for _ in range(size))
    (frame,) = FrameReader().feed(Frame(OP_BINARY, data).serialize(mask=True, extensions=[]))
    assert frame.data == data
