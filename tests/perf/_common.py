"""Shared by the benchmark scripts: data generation into perf-data/ (cached), and timing a command in
a fresh process with its peak RSS (os.wait4), so every figure is whole-process and comparable."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "perf-data"


def child_env() -> dict[str, str]:
    """The environment of a measured process: as after `pip install .`, which compiles bytecode. A
    shell with PYTHONDONTWRITEBYTECODE set would otherwise charge every start with compiling
    lossguard's sources (~0.1 s)."""
    env = os.environ.copy()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(code: str, *, env: dict | None = None) -> tuple[float, float, str]:
    """Run `code` in a fresh Python; return (seconds, peak RSS in MB, its stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or child_env())
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"benchmark child failed:\n{err[-3000:]}")
    return elapsed, usage.ru_maxrss / 1024, out.strip()


def measure_cmd(argv: list[str]) -> tuple[float, float]:
    start = time.perf_counter()
    # A pipe, not /dev/null: GNU grep stops at the first match when its output goes nowhere.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env())
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def event_file(n_events: int, *, tf2: bool = False) -> Path:
    """An event file of `n_events` scalar events over 3 tags, as TensorBoard's writer lays them out
    (serialised with TensorBoard's own protos for the first events of each shape, then repeated
    with new step, wall time and value bytes: the layout is exactly the writer's)."""
    import numpy as np

    from lossguard.ingest.sources.tfrecord import masked_crc

    DATA.mkdir(exist_ok=True)
    path = DATA / f"events.out.tfevents.{n_events}.{'tf2' if tf2 else 'tf1'}.bench"
    if path.exists():
        return path
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    rng = np.random.default_rng(0)
    tags = ["train/loss", "train/learning_rate", "train/grad_norm"]
    with open(path, "wb") as fh:
        def write(data: bytes) -> None:
            header = struct.pack("<Q", len(data))
            fh.write(header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data)))

        write(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
        values = rng.normal(2.0, 0.1, n_events).astype(np.float32)
        buf = []
        for i in range(n_events):
            step = i // 3
            tag = tags[i % 3]
            if tf2:
                tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto(), tensor_content=values[i].tobytes())
                value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
            else:
                value = summary_pb2.Summary.Value(tag=tag, simple_value=float(values[i]))
            data = event_pb2.Event(wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value])).SerializeToString()
            header = struct.pack("<Q", len(data))
            buf.append(header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data)))
            if len(buf) >= 100_000:
                fh.write(b"".join(buf))
                buf.clear()
        fh.write(b"".join(buf))
    return path
