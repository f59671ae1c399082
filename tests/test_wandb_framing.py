"""W&B transaction logs at the edges of their framing: a record longer than a read (written by the
real wandb), one past the largest record read, one whose LAST chunk never comes, and runs of zeros
(a sparse tail of gigabytes, megabytes written) where records should be. Bytes are crafted only
where no writer makes the case, framed as wandb-core frames them."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import polars as pl
import pytest

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read
from lossguard.ingest.sources.wandb_log import BLOCK, frame

from .conftest import run_lossguard
from .test_incremental import _grow_and_read
from .test_wandb import again_after_kill_9, daemon, wandb_env

pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2 as pb  # noqa: E402

OPTIONS = ReadOptions()

BIG = r'''
import wandb
run = wandb.init(project="p", name="big")
for s in range(1, 301):
    row = {"train/loss": 9.0 if s == 250 else 2.0 + (s % 5) * 0.01, "train/global_step": s}
    if s == 100:  # one step of 5 MB (its summary record too): more than a 4 MiB read
        row["notes"] = {f"n{i}": "x" * 1_000_000 for i in range(5)}
    wandb.log(row)
run.finish()
print(run.id)
'''


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A run logged by the real wandb whose step 100 is a 5 MB record."""
    root = tmp_path_factory.mktemp("big")
    done = subprocess.run([sys.executable, "-c", BIG], env=wandb_env(root, tmp_path_factory.mktemp("home")), cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.split()[-1]
    return next((root / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def _long_records(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of the records longer than a block, as the file frames them."""
    rec = frame(path.read_bytes(), base=0, final=True, source="x")
    return [(o, e - s) for o, s, e in zip(rec.offsets.tolist(), rec.starts.tolist(), rec.ends.tolist()) if e - s > BLOCK]


def _loss_steps(frame_: pl.DataFrame) -> list[int]:
    return frame_.filter(pl.col("tag") == "train/loss").get_column("step").to_list()


def test_a_record_longer_than_a_read_is_read_whole_and_the_spike_after_it_is_found(big):
    assert [size > 4 << 20 for _, size in _long_records(big)] == [True, True]  # (the history record and its summary)
    res = read(big, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert res.problems == () and res.cursor.offset == big.stat().st_size
    assert _loss_steps(res.frame) == list(range(1, 301))
    scanned = run_lossguard("scan", str(big.parent.parent.parent), "--format", "json")
    assert scanned.returncode == 1, scanned.stderr
    (run,) = json.loads(scanned.stdout)["runs"]
    assert [s["step"] for s in run["spikes"]] == [250] and run["warnings"] == []


def test_a_growing_file_cut_inside_a_long_record_and_a_limited_read_give_what_one_read_gives(big, tmp_path):
    data = big.read_bytes()
    whole = read(big, run="r", fmt="wandb", final=True, options=OPTIONS)
    (start, size), _ = _long_records(big)
    cuts = [start + 3, start + BLOCK + 10, start + (4 << 20) + 100, start + size]
    grown, cursor = _grow_and_read(tmp_path / big.name, data, cuts, "wandb")
    assert grown.drop("source").equals(whole.frame.drop("source")) and cursor.offset == len(data) and cursor.scanned is None
    # The daemon's budget: a megabyte a read, the long record followed across reads.
    cursor, frames = Cursor(), []
    for _ in range(40):
        res = read(big, cursor, run="r", fmt="wandb", final=False, options=OPTIONS, limit=1 << 20)
        assert res.problems == ()
        frames.append(res.frame)
        cursor = res.cursor
    assert cursor.offset == len(data) and pl.concat(frames).equals(whole.frame)


def test_a_record_over_the_largest_read_is_one_line_naming_its_offset_and_the_records_after_it_are_read(big, monkeypatch):
    monkeypatch.setattr("lossguard.ingest.formats.wandb_edges.MAX_RECORD", 1 << 20)
    res = read(big, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert [(p.offset, p.message) for p in res.problems] == [
        (at, f"a record of {size_mib}, over the 1 MiB a W&B record may have here: passed over, the records after it are read")
        for at, size_mib in ((at, f"{(_span(big, at)) / (1 << 20):,.1f} MiB") for at, _ in _long_records(big))
    ]
    assert _loss_steps(res.frame) == [s for s in range(1, 301) if s != 100]  # (step 100 was the long record)
    assert res.cursor.offset == big.stat().st_size


def _span(path: Path, at: int) -> int:
    """The bytes the record at `at` spans in the file: its chunks, headers and block trailers."""
    rec = frame(path.read_bytes(), base=0, final=True, source="x")
    following = [o for o in rec.offsets.tolist() if o > at]
    return following[0] - at


def _chunk(kind: int, data: bytes) -> bytes:
    return struct.pack("<IHB", zlib.crc32(data, zlib.crc32(bytes([kind]))), len(data), kind) + data


def _framed(record: bytes, offset: int, *, last: bool = True) -> bytes:
    """`record` cut into chunks as wandb-core cuts one written at `offset` (its LAST left out with
    last=False: a record whose end was never written)."""
    out, first = bytearray(), True
    while True:
        left = BLOCK - (offset + len(out)) % BLOCK
        if left < 7:
            out += bytes(left)
            continue
        piece, record = record[: left - 7], record[left - 7 :]
        kind = (1 if first else 4) if not record else (2 if first else 3)
        if kind == 4 and not last:
            return bytes(out)
        out += _chunk(kind, piece)
        first = False
        if not record:
            return bytes(out)


def _history(step: int, loss: float, num: int, **extra: str) -> bytes:
    items = [pb.HistoryItem(nested_key=["train/loss"], value_json=json.dumps(loss)), pb.HistoryItem(nested_key=["train/global_step"], value_json=str(step))]
    items += [pb.HistoryItem(nested_key=[k], value_json=json.dumps(v)) for k, v in extra.items()]
    return pb.Record(num=num, history=pb.HistoryRecord(item=items)).SerializeToString()


def _log(steps: range, *, offset: int = 0, spike: int | None = None) -> bytes:
    """History records of `steps` (a run's record first when offset is 0), framed from `offset`."""
    out = bytearray(b":W&B\xe1\xbe\x00" if offset == 0 else b"")
    if offset == 0:
        out += _framed(pb.Record(num=1, run=pb.RunRecord(run_id="crafted1", project="p")).SerializeToString(), len(out))
    for s in steps:
        out += _framed(_history(s, 9.0 if s == spike else 2.0 + (s % 5) * 0.01, s + 1), offset + len(out))
    return bytes(out)


def _bytes_read() -> int:
    """What this process has read (rchar): a bound on a read's work that no clock decides."""
    return int(next(line.split()[1] for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")))


def _run_file(root: Path) -> Path:
    path = root / "wandb" / "offline-run-20260101_000000-crafted1" / "run-crafted1.wandb"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_record_whose_last_chunk_never_comes_is_checked_once_as_it_grows_not_read_again(tmp_path):
    path = _run_file(tmp_path)
    head = _log(range(1, 21))
    big = _history(21, 2.0, 22, note="x" * (8 << 20))
    pending = _framed(big, len(head), last=False)
    path.write_bytes(head + pending)
    first = read(path, run=".", fmt="wandb", final=False, options=OPTIONS)
    assert first.problems == () and _loss_steps(first.frame) == list(range(1, 21))
    assert first.cursor.offset == len(head) and first.cursor.scanned == len(head) + len(pending)
    before = _bytes_read()
    again = read(path, first.cursor, run=".", fmt="wandb", final=False, options=OPTIONS)
    assert _bytes_read() - before < 64 << 10  # (not the 8 MiB it holds so far: nothing new to look at)
    assert again.cursor == first.cursor and again.frame.height == 0
    told = read(path, first.cursor, run=".", fmt="wandb", final=True, options=OPTIONS).problems
    assert [(p.offset, p.message) for p in told] == [(len(head), f"last record is incomplete ({len(pending)} bytes; file cut off or still being written)")]
    whole = _framed(big, len(head))
    tail = _log(range(22, 26), offset=len(head) + len(whole))
    with open(path, "ab") as fh:
        fh.write(whole[len(pending) :] + tail)
    before = _bytes_read()
    done = read(path, again.cursor, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert done.problems == () and _loss_steps(done.frame) == list(range(21, 26))
    assert done.cursor.offset == path.stat().st_size and done.cursor.scanned is None
    # The chunks checked before are not checked again; the record is read once, whole, to decode.
    assert _bytes_read() - before < len(whole) + (2 << 20)


def test_the_daemon_waits_on_a_record_whose_end_is_not_written_without_reading_it_again_and_alerts_after_it(tmp_path):
    runs = tmp_path / "runs" / "exp"
    path = _run_file(runs)
    head = _log(range(1, 21))
    big = _history(21, 2.0, 22, note="x" * (16 << 20))
    whole = _framed(big, len(head))
    pending = _framed(big, len(head), last=False)
    with daemon(tmp_path) as w:
        w.wait_settled()
        path.write_bytes(head + pending)
        w.wait_ready()
        io = Path(f"/proc/{w.proc.pid}/io")
        rchar = lambda: int(next(x.split()[1] for x in io.read_text().splitlines() if x.startswith("rchar:")))  # noqa: E731
        before = rchar()
        time.sleep(2)  # (ten polls: each read the pending 16 MiB again before)
        assert rchar() - before < 2 << 20
        with open(path, "ab") as fh:
            fh.write(whole[len(pending) :] + _log(range(22, 41), offset=len(head) + len(whole), spike=30))
        w.wait_for(lambda ev: any(e["event"] == "opened" for e in ev))
        ev = again_after_kill_9(w)
    assert [(e["rule"], e["step"]) for e in ev if e["event"] == "opened"] == [("loss-spike", 30)]


def test_a_sparse_tail_of_5_gib_of_zeros_is_passed_over_in_one_look_and_said_once(tmp_path):
    path = _run_file(tmp_path)
    data = _log(range(1, 41), spike=30)
    path.write_bytes(data)
    whole = read(path, run=".", fmt="wandb", final=True, options=OPTIONS)
    with open(path, "r+b") as fh:
        fh.truncate(len(data) + (5 << 30))  # (a hole: no disk used, zeros read)
    before = _bytes_read()
    res = read(path, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert _bytes_read() - before < 16 << 20  # (the holes jumped, not read)
    zeros_from = -(-len(data) // BLOCK) * BLOCK
    assert [(p.offset, p.message) for p in res.problems] == [
        (zeros_from, f"{path.stat().st_size - zeros_from:,} bytes of zeros in this W&B log, no record in them (a file extended with zeros, or blocks never written): passed over")
    ]
    assert res.frame.drop("source").equals(whole.frame.drop("source")) and res.cursor.offset == path.stat().st_size
    scanned = run_lossguard("scan", str(tmp_path), "--format", "json")
    assert scanned.returncode == 1 and [s["step"] for s in json.loads(scanned.stdout)["runs"][0]["spikes"]] == [30]


def test_zeros_written_between_records_are_passed_over_and_said_once_however_the_file_grew(tmp_path):
    path = _run_file(tmp_path)
    first = _log(range(1, 21))
    gap = bytes(-len(first) % BLOCK + (3 << 20))  # (to a block's end, and 3 MiB more)
    rest = _log(range(21, 41), offset=len(first) + len(gap), spike=30)
    data = first + gap + rest
    path.write_bytes(data)
    one = read(path, run=".", fmt="wandb", final=True, options=OPTIONS)
    # (Said from the first whole block of them: fewer than a block after a record are its block's padding.)
    said = [(len(first) + len(gap) - (3 << 20), f"{3 << 20:,} bytes of zeros in this W&B log, no record in them (a file extended with zeros, or blocks never written): passed over")]
    assert [(p.offset, p.message) for p in one.problems] == said and _loss_steps(one.frame) == list(range(1, 41))
    # Grown in pieces, two of them ending among the zeros: the same rows, the zeros said once.
    cursor, frames, problems = Cursor(), [], []
    for cut in (len(first) + 5, len(first) + (1 << 20) + 99, len(first) + (2 << 20), len(first) + len(gap) + 3, len(data)):
        (tmp_path / "grown.wandb").write_bytes(data[:cut])
        res = read(tmp_path / "grown.wandb", cursor, run=".", fmt="wandb", final=cut == len(data), options=OPTIONS)
        frames.append(res.frame)
        problems += [(p.offset, p.message) for p in res.problems]
        cursor = res.cursor
    assert problems == said and pl.concat(frames).drop("source").equals(one.frame.drop("source"))


@pytest.mark.parametrize("into", [1 << 20, 6 << 20], ids=["in the first read", "past the first read"])
def test_damage_inside_a_record_longer_than_a_read_loses_that_record_alone_said_once_at_its_chunk(tmp_path, into):
    path = _run_file(tmp_path)
    head = _log(range(1, 21))
    whole = bytearray(_framed(_history(21, 2.0, 22, note="x" * (9 << 20)), len(head)))
    bad = (len(head) + into) // BLOCK * BLOCK  # (a MIDDLE chunk, at its block's start)
    whole[bad - len(head) + 100] ^= 0x01
    tail = _log(range(22, 41), offset=len(head) + len(whole), spike=30)
    path.write_bytes(head + bytes(whole) + tail)
    res = read(path, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert [(p.offset, p.message) for p in res.problems] == [
        (bad, "1 damaged chunk(s) in this W&B log (a bad checksum, length or type); the rest of each one's 32 KiB block is skipped, the blocks after it are read")
    ]
    assert _loss_steps(res.frame) == [s for s in range(1, 41) if s != 21] and res.cursor.offset == path.stat().st_size
