"""Reader throughput, side by side with the peers the foundation issue names, in one run.

    python tests/perf/bench_readers.py                    # 3M events, 1 GB per text format
    python tests/perf/bench_readers.py --events 300000 --text-mb 100   # a quicker look

Data is generated into perf-data/ (cached between runs). Every figure is a whole fresh process:
wall time and peak RSS (os.wait4). Peers: tbparse's SummaryReader (if installed), TensorBoard's
EventAccumulator, a plain protobuf decode loop, `grep -c loss`, and straightforward Python loops
(json.loads, csv.reader, re.search per line).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import DATA, measure, measure_cmd  # noqa: E402

LOSSGUARD = """
from pathlib import Path
from lossguard.reader import read, ReadOptions
r = read(Path({path!r}), run="r", fmt={fmt!r}, final=True, options=ReadOptions())
assert not r.problems, r.problems
print(r.frame.height, r.frame.estimated_size())
"""

PEERS_EVENTS = {
    "tbparse SummaryReader": """
from tbparse import SummaryReader
df = SummaryReader({path!r}, pivot=False).scalars
print(len(df))
""",
    "TensorBoard EventAccumulator": """
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator({path!r}, size_guidance={{"scalars": 0}})
acc.Reload()
print(sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"]))
""",
    "protobuf decode loop": """
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
n = 0
for raw in RawEventFileLoader({path!r}).Load():
    ev = event_pb2.Event.FromString(raw)
    n += len(ev.summary.value)
print(n)
""",
    "lossguard framing + CRC only": """
from lossguard.sources.tfrecord import frame
data = open({path!r}, "rb").read()
print(frame(data, base_offset=0, source="x").heads.size)
""",
    "read the bytes": """
print(len(open({path!r}, "rb").read()))
""",
}


def text_file(kind: str, megabytes: int) -> Path:
    """A log of about `megabytes` MB in one text format, lines as the tools print them."""
    DATA.mkdir(exist_ok=True)
    names = {"jsonl": "metrics.jsonl", "csv": "metrics.csv", "megatron": "megatron.log", "hf_console": "hf_console.log", "kv_lines": "nanogpt.log"}
    path = DATA / f"{megabytes}mb-{names[kind]}"
    if path.exists():
        return path
    rng = random.Random(0)
    target = megabytes << 20
    written = 0
    step = 0
    with open(path, "w") as fh:
        if kind == "csv":
            fh.write("epoch,step,train_loss_step,lr-AdamW,grad_2.0_norm_total,val_loss\n")
        while written < target:
            lines = []
            for _ in range(20000):
                step += 1
                loss = 2.0 + 8.0 * math.exp(-step / 5e5) + rng.random() * 0.05
                lr, gn = 3e-4 * (1 - step / 5e7), 0.9 + rng.random() * 0.2
                if kind == "jsonl":
                    lines.append(f'{{"step": {step}, "loss": {loss:.6f}, "lr": {lr:.6e}, "grad_norm": {gn:.5f}, "tokens": {step * 524288}}}\n')
                elif kind == "csv":
                    lines.append(f"{step // 100000},{step},{loss:.6f},{lr:.6e},{gn:.5f},\n")
                elif kind == "megatron":
                    lines.append(
                        f" iteration {step:8d}/ 5000000 | consumed samples: {step * 512:12d} | elapsed time per iteration (ms): 812.3 |"
                        f" learning rate: {lr:.3E} | global batch size:   512 | lm loss: {loss:.6E} | loss scale: 4096.0 |"
                        f" grad norm: {gn:.3f} | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
                    )
                elif kind == "hf_console":
                    # tqdm redraws the bar as each step ends: the dict logged at a step follows it.
                    lines.append(f" {step // 50000}%|███     | {step + 1}/5000000 [00:10<01:30,  3.00it/s]\r")
                    lines.append(f"{{'loss': {loss:.4f}, 'grad_norm': {gn:.4f}, 'learning_rate': {lr:.6e}, 'epoch': {step / 1e5:.2f}}}\n")
                else:
                    lines.append(f"step {step:6d} | loss: {loss:.6f} | lr {lr:.4e} | norm: {gn:.4f} | dt: 351.23ms | tok/sec: 1493812.55\n")
            chunk = "".join(lines)
            fh.write(chunk)
            written += len(chunk)
    return path


PEERS_TEXT = {
    "jsonl": ("json.loads loop", """
import json
n = 0
for line in open({path!r}):
    d = json.loads(line)
    n += ("loss" in d)
print(n)
"""),
    "csv": ("csv.reader loop", """
import csv
n = 0
for row in csv.reader(open({path!r})):
    n += bool(row[2])
print(n)
"""),
}
REGEX_PEER = ("re.search loop", """
import re
pat = re.compile({pattern!r})
n = 0
for line in open({path!r}):
    if pat.search(line):
        n += 1
print(n)
""")
PATTERNS = {
    "megatron": r"iteration\s+(\d+)/.*lm loss: ([-+.\dEe]+).*grad norm: ([-+.\dEe]+)",
    "hf_console": r"'loss': ([-+.\deE]+)",
    "kv_lines": r"step\s+(\d+) \| loss: ([-+.\deE]+)",
}


def row(label: str, seconds: float, rss: float, ours: float | None, note: str = "") -> str:
    ratio = f"{seconds / ours:8.1f}x" if ours else " " * 9
    return f"  {label:<34} {seconds:9.2f} s {rss:9.0f} MB  {ratio}  {note}"


def bench_events(n: int, *, tf2: bool, skip: set[str]) -> None:
    path = _common.event_file(n, tf2=tf2)
    size = path.stat().st_size / 1e6
    print(f"\nEvent file, {'TF2 tensor' if tf2 else 'TF1 simple_value'} scalars: {n:,} events, {size:.0f} MB")
    print(f"  {'reader':<34} {'time':>11} {'peak RSS':>12}  {'vs lossguard':>9}")
    t, rss, out = measure(LOSSGUARD.format(path=str(path), fmt="tfevents"))
    rows, est = map(int, out.split())
    assert rows == n, (rows, n)
    print(row("lossguard read (CRC checked)", t, rss, None, f"{rows:,} rows, table {est / 1e6:.0f} MB"))
    for label, code in PEERS_EVENTS.items():
        if any(s in label for s in skip):
            continue
        try:
            pt, prss, _ = measure(code.format(path=str(path)))
        except RuntimeError as exc:
            print(f"  {label:<34} not run: {str(exc).splitlines()[-1][:80]}")
            continue
        print(row(label, pt, prss, t))


def bench_text(kind: str, megabytes: int) -> None:
    path = text_file(kind, megabytes)
    size = path.stat().st_size / 1e6
    print(f"\n{kind}: {size:.0f} MB")
    print(f"  {'reader':<34} {'time':>11} {'peak RSS':>12}  {'vs lossguard':>9}")
    fmt = {"hf_console": "hf_console", "kv_lines": "kv_lines"}.get(kind, kind)
    t, rss, out = measure(LOSSGUARD.format(path=str(path), fmt=fmt))
    rows, est = map(int, out.split())
    print(row("lossguard read", t, rss, None, f"{rows:,} rows, table {est / 1e6:.0f} MB; peak RSS / table {rss / max(est / 1e6, 1e-9):.2f}"))
    gt, grss = measure_cmd(["grep", "-c", "loss", str(path)])
    print(row("grep -c loss", gt, grss, t))
    label, code = PEERS_TEXT.get(kind, REGEX_PEER)
    pt, prss, _ = measure(code.format(path=str(path), pattern=PATTERNS.get(kind, "")))
    print(row(label, pt, prss, t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--text-mb", type=int, default=1024)
    ap.add_argument("--skip", action="append", default=[], help="peer labels to skip (substring), e.g. tbparse")
    ap.add_argument("--only", choices=["events", "text"], help="run one half only")
    args = ap.parse_args()
    print("lossguard reader benchmark (ratio = peer time / lossguard time; higher is better for lossguard)")
    if args.only in (None, "events"):
        bench_events(args.events, tf2=False, skip=set(args.skip))
        bench_events(max(1, args.events // 3), tf2=True, skip=set(args.skip) | {"tbparse", "EventAccumulator"})
    if args.only in (None, "text"):
        for kind in ("jsonl", "csv", "megatron", "hf_console", "kv_lines"):
            bench_text(kind, args.text_mb)


if __name__ == "__main__":
    main()
