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
import os
import subprocess
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import DATA, measure  # noqa: E402

LOSSGUARD = """
from pathlib import Path
from lossguard.ingest.reader import read, ReadOptions
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
from lossguard.ingest.sources.tfrecord import frame
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


# The peers build the rows scan's projection keeps (loss, lr, grad norm, and val_loss in the CSV),
# as floats, the way a user would write the loop.
PEERS_TEXT = {
    "jsonl": ("json.loads loop -> rows", """
import json
rows = []
for line in open({path!r}):
    d = json.loads(line)
    step = d["step"]
    for k in ("loss", "lr", "grad_norm"):
        v = d.get(k)
        if v is not None:
            rows.append((step, k, float(v)))
print(len(rows))
"""),
    "csv": ("csv.reader loop -> rows", """
import csv
rows = []
reader = csv.reader(open({path!r}, newline=""))
names = next(reader)
for row in reader:
    step = int(row[1])
    for i in (2, 3, 4, 5):
        if row[i]:
            rows.append((step, names[i], float(row[i])))
print(len(rows))
"""),
}
REGEX_PEER = ("re loop: loss, lr, grad norm -> rows", """
import re
pat = re.compile({pattern!r})
rows = []
step = 0
for line in open({path!r}):
    m = pat.search(line)
    if m:
        g = m.groupdict()
        step = int(g["step"]) if g.get("step") else step + 1
        rows.append((step, "loss", float(g["loss"])))
        rows.append((step, "lr", float(g["lr"])))
        rows.append((step, "grad_norm", float(g["gn"])))
print(len(rows))
""")
F = r"([-+.\deE]+)"
PATTERNS = {
    "megatron": rf"iteration\s+(?P<step>\d+)/.*learning rate: (?P<lr>{F[1:-1]}).*lm loss: (?P<loss>{F[1:-1]}).*grad norm: (?P<gn>{F[1:-1]})",
    "hf_console": rf"'loss': (?P<loss>{F[1:-1]}), 'grad_norm': (?P<gn>{F[1:-1]}), 'learning_rate': (?P<lr>{F[1:-1]})",
    "kv_lines": rf"step\s+(?P<step>\d+) \| loss: (?P<loss>{F[1:-1]}) \| lr (?P<lr>{F[1:-1]}) \| norm: (?P<gn>{F[1:-1]})",
}

LOSSGUARD_TEXT = """
from pathlib import Path
from lossguard.ingest.reader import read, ReadOptions
kw = {{}}
if {projected!r}:
    try:
        from lossguard.detection.engine import SCAN_NEEDS
        kw["needs"] = SCAN_NEEDS
    except ImportError:
        pass  # a lossguard from before projection: the full read is what scan did
r = read(Path({path!r}), run="r", fmt={fmt!r}, final=True, options=ReadOptions(), lean={projected!r}, **kw)
assert not r.problems, r.problems
print(r.frame.height, r.frame.estimated_size())
"""
CLI_READ = """
import sys
from lossguard.cli import main
sys.argv = ["lossguard", "read", {path!r}, "--format", {out!r}]
sys.stdout = open("/dev/null", "w")
main(sys.argv[1:])
"""


def row(label: str, seconds: float, rss: float, ours: float | None, note: str = "") -> str:
    ratio = f"{seconds / ours:8.1f}x" if ours else " " * 9
    return f"  {label:<40} {seconds:9.2f} s {rss:9.0f} MB  {ratio}  {note}"


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


def best_of(repeat: int, fns: list) -> list:
    """The fastest of `repeat` runs of each of `fns`, taken in turns (new, base, peer, new, base,
    peer...), so that a burst of load on this shared machine falls on all of them alike."""
    runs: list[list] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            runs[i].append(fn())
    return [min(r, key=lambda x: x[0]) for r in runs]


def with_code(code_dir: str | None) -> dict | None:
    """The environment running lossguard from `code_dir` (an exported older tree), for A/B."""
    if not code_dir:
        return None
    env = _common.child_env()
    env["PYTHONPATH"] = code_dir
    return env


def bench_text(kind: str, megabytes: int, *, repeat: int, baseline: str | None, cli: bool, code_dir: str | None = None) -> None:
    path = text_file(kind, megabytes)
    size = path.stat().st_size / 1e6
    print(f"\n{kind}: {size:.0f} MB")
    print(f"  {'reader':<40} {'time':>11} {'peak RSS':>12}  {'peer/ours':>9}")
    fmt = kind
    versions = [("", with_code(code_dir))] + ([(" [base]", with_code(baseline))] if baseline else [])
    ours: dict[str, float] = {}
    tables: dict[str, int] = {}
    reads = [(tag, env, projected) for tag, env in versions for projected in (False, True)]
    label, peer = PEERS_TEXT.get(kind, REGEX_PEER)
    peer = peer.format(path=str(path), pattern=PATTERNS.get(kind, ""))
    fns = [lambda env=env, projected=projected: measure(LOSSGUARD_TEXT.format(path=str(path), fmt=fmt, projected=projected), env=env) for _, env, projected in reads]
    *results, (pt, prss, pout) = best_of(repeat, [*fns, lambda: measure(peer)])
    for (tag, _, projected), (t, rss, out) in zip(reads, results):
        rows, est = map(int, out.split())
        name = ("lossguard read, scan's projection" if projected else "lossguard read, full table") + tag
        ours[name] = t
        tables[name] = est
        print(row(name, t, rss, None, f"{rows:,} rows, {size / t:.0f} MB/s"))
    base = ours.get("lossguard read, scan's projection [base]")
    print(row(label, pt, prss, ours["lossguard read, scan's projection"], f"{int(pout):,} rows; ratio to scan's projection" + (f" (base: {pt / base:.1f}x)" if base else "")))
    # Whole process: MB/s per core (CPU seconds, so both cores' work counts), beside grep -c.
    exe = [sys.executable, "-m", "lossguard", "scan", str(path), "--format", "json", "--quiet"]
    *scans, (gt, grss, gcpu) = best_of(repeat, [*(lambda env=env: measure_cpu(exe, env=env) for _, env in versions), lambda: measure_cpu(["grep", "-c", "loss", str(path)])])
    print(f"  {'grep -c loss':<40} {gt:9.2f} s {grss:9.0f} MB  {'':>9}  {size / gcpu:.0f} MB/s per core")
    for (tag, _), (st, srss, scpu) in zip(versions, scans):
        print(f"  {'lossguard scan (whole process)' + tag:<40} {st:9.2f} s {srss:9.0f} MB  {'':>9}  {size / scpu:.0f} MB/s per core ({size / st:.0f} MB/s wall)")
    if cli:
        # The target: peak RSS within 2x the largest block's table + 300 MB (a block: textfile.BLOCK of text).
        block_table = tables["lossguard read, full table"] * min(1.0, (32 << 20) / path.stat().st_size) / 1e6
        print(f"  (a 32 MiB block's table: ~{block_table:.0f} MB; RSS bound 2x that + 300 MB = {2 * block_table + 300:.0f} MB)")
        bench_cli_read(path, repeat=repeat, versions=versions, fmt=fmt)


def bench_cli_read(path: Path, *, repeat: int, versions, fmt: str) -> None:
    """`lossguard read FILE --format csv|json` to /dev/null: time and peak RSS beside the library read
    (the full table), timed again in the same turns: a ratio of figures from different minutes of a
    shared box varied 0.74-1.35x for the same code."""
    library = LOSSGUARD_TEXT.format(path=str(path), fmt=fmt, projected=False)
    runs = [(tag, env, out) for tag, env in versions for out in ("csv", "json", None)]
    results = best_of(repeat, [
        lambda env=env, out=out: measure(CLI_READ.format(path=str(path), out=out) if out else library, env=env) for _, env, out in runs
    ])
    lib = {tag: t for (tag, _, out), (t, _, _) in zip(runs, results) if out is None}
    for (tag, _, out), (t, rss, _) in zip(runs, results):
        if out is not None:
            print(row(f"lossguard read --format {out}{tag}", t, rss, None, f"{t / lib[tag]:.2f}x the library read{tag} ({lib[tag]:.2f} s in the same turns)"))


def measure_cpu(argv: list[str], *, env: dict | None = None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MB, CPU seconds) of a command whose output is read and dropped."""
    import time

    start = time.perf_counter()
    # A pipe, not /dev/null: GNU grep stops at the first match when its output goes nowhere.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env or _common.child_env())
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--text-mb", type=int, default=1024)
    ap.add_argument("--skip", action="append", default=[], help="peer labels to skip (substring), e.g. tbparse")
    ap.add_argument("--only", choices=["events", "text"], help="run one half only")
    ap.add_argument("--kind", action="append", choices=["jsonl", "csv", "megatron", "hf_console", "kv_lines"], help="text formats to run (default: all)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the fastest counts")
    ap.add_argument("--baseline", metavar="DIR", help="also run an older lossguard (an exported tree: git archive REV lossguard | tar -x -C DIR)")
    ap.add_argument("--code", metavar="DIR", help="run lossguard from this exported tree instead of the installed one (so edits during a long run do not count)")
    ap.add_argument("--cli-kind", action="append", help="text formats to time `lossguard read --format csv|json` on (default: all)")
    ap.add_argument("--no-cli", action="store_true", help="skip `lossguard read --format csv|json`")
    args = ap.parse_args()
    # Children run `python -c` / `-m`, which put the working directory first on sys.path: from the
    # repository, its lossguard/ would shadow the trees --code and --baseline name.
    DATA.mkdir(exist_ok=True)
    os.chdir(DATA)
    print("lossguard reader benchmark (ratio = peer time / lossguard time; higher is better for lossguard)")
    if args.only in (None, "events"):
        bench_events(args.events, tf2=False, skip=set(args.skip))
        bench_events(max(1, args.events // 3), tf2=True, skip=set(args.skip) | {"tbparse", "EventAccumulator"})
    if args.only in (None, "text"):
        for kind in args.kind or ("jsonl", "csv", "megatron", "hf_console", "kv_lines"):
            cli = not args.no_cli and (not args.cli_kind or kind in args.cli_kind)
            bench_text(kind, args.text_mb, repeat=args.repeat, baseline=args.baseline, cli=cli, code_dir=args.code)


if __name__ == "__main__":
    main()
