"""W&B's `.wandb` transaction logs: lossguard's reader beside wandb's own protobuf classes, and the
daemon following growing `.wandb` files beside the same runs as JSON lines, in one run.

    python tests/perf/bench_wandb.py                  # (a) 20k steps, 4 metrics; (b) 100 runs, 30 s
    python tests/perf/bench_wandb.py --only read --repeat 5

(a) The file is written once by the real wandb (offline mode) into perf-data/ and cached. Each
figure is a fresh process, wall time, the median (and range) of `--repeat` runs taken in turns:
lossguard's library read, `lossguard read --format csv`, and a Python loop that splits the records and parses
each with wandb's own `wandb_internal_pb2.Record` (no checksums checked; values through
json.loads). The same read without the imports (each process times its own read) is printed too:
a fresh process spends most of its time importing polars or wandb.

(b) `runs` runs each append `rate` steps a second, every 0.1 s, to a `.wandb` file (records framed
as wandb-core frames them: a history record and two summary records per step) or to a JSON lines
file; the daemon's CPU over the interval (bench_watch's measure) is compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import DATA, measure  # noqa: E402
from bench_readers import with_code  # noqa: E402
from bench_watch import cpu_seconds, line, start  # noqa: E402

WRITE_RUN = r"""
import random, sys, wandb
random.seed(0)
run = wandb.init(project="bench", name="twenty-k", settings=wandb.Settings(x_transaction_log_flush_interval=0))
for s in range(1, {steps} + 1):
    wandb.log({{"train/loss": random.gauss(2, 0.1), "train/learning_rate": 1e-3 * random.random(), "train/grad_norm": random.random(), "train/epoch": s / 1000}})
run.finish()
print(run.dir)
"""

LOSSGUARD = """
import time
t0 = time.perf_counter()
from pathlib import Path
import numpy.ma  # (polars imports it the first time it builds a Series from numpy: an import, timed as one)
from lossguard.ingest.reader import read, ReadOptions
t1 = time.perf_counter()
r = read(Path({path!r}), run="r", fmt="wandb", final=True, options=ReadOptions())
assert not r.problems, r.problems
print(r.frame.height, time.perf_counter() - t1)
"""

PB2_LOOP = """
import time
t0 = time.perf_counter()
import json, struct
from wandb.proto import wandb_internal_pb2
t1 = time.perf_counter()
data = open({path!r}, "rb").read()
rows, pos, held = 0, 7, b""

def record(raw):
    global rows
    rec = wandb_internal_pb2.Record.FromString(raw)
    if rec.WhichOneof("record_type") == "history":
        for item in rec.history.item:
            key = item.key or ".".join(item.nested_key)
            try:
                float(json.loads(item.value_json))
            except (TypeError, ValueError):
                continue
            rows += 1

while pos + 7 <= len(data):
    left = 32768 - pos % 32768
    if left < 7:
        pos += left
        continue
    crc, length, kind = struct.unpack_from("<IHB", data, pos)
    chunk = data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind == 1:
        record(chunk)
    elif kind == 2:
        held = chunk
    elif kind == 3:
        held += chunk
    elif kind == 4:
        record(held + chunk)
print(rows, time.perf_counter() - t1)
"""


def wandb_file(steps: int) -> Path:
    """A run of `steps` wandb.log calls of 4 metrics, written by the real wandb, offline."""
    folder = DATA / f"wandb-{steps}"
    found = sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(folder), WANDB_SILENT="true")
    subprocess.run([sys.executable, "-c", WRITE_RUN.format(steps=steps)], env=env, check=True, capture_output=True, cwd=folder)
    return sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))[0]


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _spread(values: list[float], *, ms: bool = False) -> str:
    """Median and range of a figure, as docs/performance.md gives them."""
    lo, mid, hi = (f"{v * 1e3:.0f}" if ms else f"{v:.2f}" for v in (min(values), _median(values), max(values)))
    return f"{mid} {'ms' if ms else 's'} ({lo}-{hi})"


def bench_read(steps: int, repeat: int, code_dir: str | None = None) -> None:
    """Each figure a median of `repeat` fresh processes, all taken in turns (lossguard, the pb2 loop,
    the CLI; then the same again), so that a burst of load on this shared machine falls on all of
    them alike; with `code_dir`, an older tree's library read is taken in the same turns."""
    path = wandb_file(steps)
    mb = path.stat().st_size / 1e6
    print(f"\n(a) a run of {steps:,} steps, 4 metrics, written by wandb: {mb:.1f} MB; {repeat} turns, medians (range)")
    cli = [sys.executable, "-m", "lossguard", "read", str(path), "--format", "csv"]
    fns = [lambda: measure(LOSSGUARD.format(path=str(path))), lambda: measure(PB2_LOOP.format(path=str(path))), lambda: _common.measure_cmd(cli)]
    if code_dir:
        env = with_code(code_dir)
        fns.append(lambda: measure(LOSSGUARD.format(path=str(path)), env=env))
    load = [os.getloadavg()[0]]
    turns: list[list] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            turns[i].append(fn())
        load.append(os.getloadavg()[0])
    ours, pb2, cli_runs = turns[:3]
    rows = {int(o[2].split()[0]) for o in ours}
    read = [float(o[2].split()[1]) for o in ours]
    loop = [float(o[2].split()[1]) for o in pb2]
    whole, peer = [o[0] for o in ours], [o[0] for o in pb2]
    print(f"  lossguard read (library): the read alone {_spread(read, ms=True)}, whole process {_spread(whole)}, "
          f"{_median([o[1] for o in ours]):.0f} MB; {rows.pop():,} rows")
    print(f"  lossguard read --format csv (CLI): whole process {_spread([c[0] for c in cli_runs])}, {_median([c[1] for c in cli_runs]):.0f} MB")
    print(f"  wandb_internal_pb2 loop: the loop alone {_spread(loop, ms=True)}, whole process {_spread(peer)}, {_median([o[1] for o in pb2]):.0f} MB")
    if code_dir:
        base = [float(o[2].split()[1]) for o in turns[3]]
        print(f"  {code_dir}'s library read: the read alone {_spread(base, ms=True)}, whole process {_spread([o[0] for o in turns[3]])}")
    per_turn = sorted(p / r for p, r in zip(loop, read))
    print(f"  the read alone: pb2 loop / lossguard = {_median(loop) / _median(read):.1f}x (medians; per turn {per_turn[0]:.1f}-{per_turn[-1]:.1f}x); "
          f"whole process: library {_median(peer) / _median(whole):.1f}x, CLI {_median(peer) / _median([c[0] for c in cli_runs]):.1f}x (target >= 5x)")
    print(f"  load average (1 min) during the turns: {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores")


class WandbLog:
    """A `.wandb` file grown as wandb-core grows one: the 7-byte header, then records framed in
    32 KiB blocks (FULL, or FIRST/MIDDLE/LAST across a block's end; zero padding under 7 bytes)."""

    def __init__(self, path: Path, run_id: str) -> None:
        from wandb.proto import wandb_internal_pb2 as pb

        self.pb, self.path, self.num, self.pending = pb, path, 0, bytearray()
        self.offset = 7
        path.write_bytes(b":W&B\xe1\xbe\x00")
        self.record(pb.Record(run=pb.RunRecord(run_id=run_id, project="bench", display_name=run_id)))
        self.flush()

    def record(self, rec) -> None:  # noqa: ANN001 - (a wandb_internal_pb2.Record)
        self.num += 1
        rec.num = self.num
        data, first = rec.SerializeToString(), True
        while True:
            left = 32768 - self.offset % 32768
            if left < 7:
                self._put(bytes(left))
                continue
            piece, data = data[: left - 7], data[left - 7 :]
            kind = (1 if first else 4) if not data else (2 if first else 3)
            self._put(struct.pack("<IHB", zlib.crc32(piece, zlib.crc32(bytes([kind]))), len(piece), kind) + piece)
            first = False
            if not data:
                return

    def step(self, step: int, loss: float) -> None:
        pb = self.pb
        values = {"_step": step, "_runtime": step / 10, "_timestamp": 1.7e9 + step, "loss": loss, "lr": 1e-4, "grad_norm": 1.0}
        items = [pb.HistoryItem(nested_key=[k], value_json=json.dumps(v)) for k, v in values.items()]
        self.record(pb.Record(summary=pb.SummaryRecord(update=[pb.SummaryItem(key="_runtime", value_json="0")])))
        self.record(pb.Record(summary=pb.SummaryRecord(update=[pb.SummaryItem(nested_key=[i.nested_key[0]], value_json=i.value_json) for i in items])))
        self.record(pb.Record(history=pb.HistoryRecord(item=items, step=pb.HistoryStep(num=step))))

    def _put(self, raw: bytes) -> None:
        self.pending += raw
        self.offset += len(raw)

    def flush(self, *, blocks_only: bool = False) -> None:
        """Write what is pending; `blocks_only`: only the blocks it fills (wandb-core writes a block
        when it fills, the rest at its flush interval)."""
        keep = self.offset % 32768 if blocks_only else 0
        if keep >= len(self.pending):
            return
        with open(self.path, "ab") as fh:
            fh.write(self.pending[: len(self.pending) - keep])
        del self.pending[: len(self.pending) - keep]


def follow(kind: str, runs: int, rate: int, seconds: float, *, flush_every: float = 0.0) -> float:
    """The daemon's CPU (% of a core) following `runs` runs that each log `rate` steps a second;
    `flush_every` (.wandb): written as wandb-core writes, a block when it fills and the rest this
    often (0: everything at once, every 0.1 s, as the JSON lines are)."""
    tmp = Path(tempfile.mkdtemp())
    writers = []
    for i in range(runs):
        folder = tmp / "runs" / f"run{i:03d}"
        if kind == "wandb":
            log = folder / "wandb" / f"offline-run-20260101_000000-r{i:07d}" / f"run-r{i:07d}.wandb"
            log.parent.mkdir(parents=True)
            writers.append(WandbLog(log, f"r{i:07d}"))
        else:
            folder.mkdir(parents=True)
            (folder / "metrics.jsonl").write_text(line(0, 2.0))
            writers.append(folder / "metrics.jsonl")
    proc = start(tmp)
    time.sleep(5)
    per_tick = max(1, rate // 10)
    try:
        c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        step = 1
        while time.perf_counter() - t0 < seconds:
            for w in writers:
                steps = range(step, step + per_tick)
                if kind == "wandb":
                    for s in steps:
                        w.step(s, 2.0 + (s % 7) * 0.01)
                    due = flush_every and int((time.perf_counter() - t0) / flush_every) > int((time.perf_counter() - t0 - 0.1) / flush_every)
                    w.flush(blocks_only=bool(flush_every) and not due)
                else:
                    with open(w, "a") as fh:
                        fh.write("".join(line(s, 2.0 + (s % 7) * 0.01) for s in steps))
            step += per_tick
            time.sleep(max(0.0, t0 + step / rate - time.perf_counter()))
        elapsed = time.perf_counter() - t0
        return (cpu_seconds(proc.pid) - c0) / elapsed * 100
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5, help="turns in (a); each figure is the median")
    ap.add_argument("--code-dir", help="(a) also times this tree's library read (an older checkout, for A/B)")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rate", type=int, default=10, help="steps a second each run logs in (b)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--only", choices=("read", "follow"), action="append")
    args = ap.parse_args()
    parts = set(args.only or ("read", "follow"))
    DATA.mkdir(exist_ok=True)
    os.chdir(DATA)  # (children run `python -c`: the repository's own lossguard/ must not shadow the installed one)
    print("lossguard W&B benchmark (ratio = peer time / lossguard time; higher is better for lossguard)")
    if "read" in parts:
        bench_read(args.steps, args.repeat, args.code_dir)
    if "follow" in parts:
        print(f"\n(b) the daemon following {args.runs} runs logging {args.rate} steps/s each, for {args.seconds:.0f} s")
        jsonl = follow("jsonl", args.runs, args.rate, args.seconds)
        same = follow("wandb", args.runs, args.rate, args.seconds)
        native = follow("wandb", args.runs, args.rate, args.seconds, flush_every=15.0)
        print(f"  JSON lines, appended every 0.1 s:                     CPU {jsonl:5.1f}% of a core")
        print(f"  .wandb, appended every 0.1 s too:                     CPU {same:5.1f}% of a core   ({same / jsonl:.2f}x the JSON lines)")
        print(f"  .wandb as wandb-core writes it (full blocks, 15 s):   CPU {native:5.1f}% of a core   ({native / jsonl:.2f}x the JSON lines; target within 2x)")


if __name__ == "__main__":
    main()
