"""Whole-process figures for `lossguard scan`: start-up, the sample runs, many small runs, a large
runs folder (bounded memory, both cores), one large log.

    python tests/perf/bench_scan.py [--runs 1000] [--run-mb 10]

The runs folder is generated into perf-data/ (one template log per format, copied run after run),
mixing TensorBoard event files, JSON lines, Lightning CSV, Megatron and nanoGPT logs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import DATA, ROOT, measure  # noqa: E402

SCAN = """
import resource, sys, time
from lossguard.cli import main
t = time.perf_counter()
code = main({argv!r})
took = time.perf_counter() - t
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(code, round(me), round(kids), round(took, 3), file=sys.stderr if False else sys.stdout)
"""


def runs_folder(n: int, run_mb: int) -> Path:
    from bench_readers import text_file

    folder = DATA / f"runs-{n}x{run_mb}mb"
    if folder.exists():
        return folder
    templates = {
        "jsonl": text_file("jsonl", run_mb),
        "csv": text_file("csv", run_mb),
        "megatron": text_file("megatron", run_mb),
        "kv_lines": text_file("kv_lines", run_mb),
    }
    events = _common.event_file(max(1000, run_mb * 1_000_000 // 55))
    kinds = ["tfevents", *templates]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        run = folder / f"run{i:04d}"
        run.mkdir(parents=True)
        if kind == "tfevents":
            shutil.copy(events, run / "events.out.tfevents.1700000000.bench")
        else:
            src = templates[kind]
            shutil.copy(src, run / ({"csv": "metrics.csv", "jsonl": "metrics.jsonl"}.get(kind, "train.log")))
    return folder


SMALL_LOGS = {
    "megatron": "megatron-grad-explosion/train.log",
    "kv_lines": "nanogpt-clean/train.log",
    "jsonl": "jsonl-lr-restart/metrics.jsonl",
    "csv": "lightning-bad-batch/version_0/metrics.csv",
    "tfevents": "tb-clean/events.out.tfevents.1796083710.vm",
}
"""The sample runs' logs a small run may be (--small-log): a sweep's runs are many copies of one kind."""
DVCLIVE_STEPS = 300


def dvclive_run(run: Path) -> None:
    """A run as dvclive lays it out (--small-log dvclive): a tab-separated file a metric under
    dvclive/plots/metrics/, each `step<TAB>value` with its header, as Live.log_metric writes them."""
    metrics = run / "dvclive" / "plots" / "metrics" / "train"
    metrics.mkdir(parents=True)
    for name, value in (("loss", lambda s: 2.0 + 0.01 * (s % 7)), ("lr", lambda s: 1e-3), ("grad_norm", lambda s: 0.5 + 0.001 * s)):
        (metrics / f"{name}.tsv").write_text(f"step\t{name}\n" + "".join(f"{s}\t{value(s)}\n" for s in range(DVCLIVE_STEPS)))


def scan(args: list[str], *, code: str | None = None) -> tuple[float, float, float, str]:
    """(wall seconds, peak RSS of the scan process and of its largest worker, exit code); `code`: an
    exported older tree to run instead (PYTHONPATH; the workers inherit it)."""
    env = None
    if code:
        env = _common.child_env()
        env["PYTHONPATH"] = code
    seconds, rss, out = measure(SCAN.format(argv=["scan", *args, "--quiet", "--format", "json", "--output", "/dev/null"]), env=env)
    code, me, kids, took = out.split()
    return seconds, float(me), float(kids), code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--run-mb", type=int, default=10)
    ap.add_argument("--small-runs", type=int, default=1000)
    ap.add_argument("--small-log", choices=sorted([*SMALL_LOGS, "dvclive"]), default="megatron", help="the sample log each small run holds a copy of")
    ap.add_argument("--big-mb", type=int, default=1024)
    ap.add_argument("--only", choices=("start", "samples", "small", "big", "folder"), action="append", help="run only these parts")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the 'small' part (its min is printed)")
    ap.add_argument("--baseline", metavar="DIR", help="also run the 'small' part on an older lossguard, in turns (an exported tree: git archive REV lossguard | tar -x -C DIR)")
    args = ap.parse_args()
    parts = set(args.only or ("start", "samples", "small", "big", "folder"))
    # Children run `python -c`, which puts the working directory first on sys.path: from the
    # repository, its lossguard/ would shadow the tree --baseline names.
    DATA.mkdir(exist_ok=True)
    os.chdir(DATA)
    print("lossguard scan, whole process (wall time; peak RSS of the scan process and of its largest worker)")
    one = ROOT / "tests/fixtures/runs" / SMALL_LOGS["megatron"]
    if "start" in parts:
        # Start-up figures are the median of 7 starts: a 2-core VM's scheduler noise is +-0.2 s.
        starts = sorted(_common.measure_cmd([sys.executable, "-m", "lossguard.cli", "--help"])[0] for _ in range(7))
        print(f"  lossguard --help (median of 7)            {starts[3]:7.2f} s")
        runs = sorted((scan([str(one)]) for _ in range(7)), key=lambda r: r[0])
        s, me = runs[3][0], runs[3][1]
        print(f"  scan one small file (median of 7)         {s:7.2f} s  {me:6.0f} MB  (min {runs[0][0]:.2f}, max {runs[-1][0]:.2f})")
    if "samples" in parts:
        s, me, kids, _ = scan([str(ROOT / "tests/fixtures/runs")])
        print(f"  scan the sample runs (8 runs)             {s:7.2f} s  {me:6.0f} MB")
    if "small" in parts:
        small = DATA / (f"small-runs-{args.small_runs}" + ("" if args.small_log == "megatron" else f"-{args.small_log}"))
        if not small.exists():
            for i in range(args.small_runs):
                (small / f"run{i:04d}").mkdir(parents=True)
                if args.small_log == "dvclive":
                    dvclive_run(small / f"run{i:04d}")
                else:
                    log = ROOT / "tests/fixtures/runs" / SMALL_LOGS[args.small_log]
                    shutil.copy(log, small / f"run{i:04d}" / log.name)
        mb = sum(f.stat().st_size for f in small.rglob("*") if f.is_file()) / 1e6
        versions = [("", None)] + ([(" [base]", args.baseline)] if args.baseline else [])
        for jobs in ("1", "2"):
            # Taken in turns (new, base, new, base...): a burst of load on a shared box falls on both alike.
            runs = [[scan([str(small), "--jobs", jobs], code=code) for _, code in versions] for _ in range(args.repeat)]
            for i, (tag, _) in enumerate(versions):
                s, me, kids, _ = min((r[i] for r in runs), key=lambda r: r[0])
                label = f"scan {args.small_runs} small {args.small_log} runs ({mb:.0f} MB), --jobs {jobs}{tag}"
                print(f"  {label:<58} {s:7.2f} s  {me:6.0f} MB  workers {kids:.0f} MB  (min of {args.repeat})")
    if not parts & {"big", "folder"}:
        return
    from bench_readers import text_file

    if "big" in parts:
        big = text_file("jsonl", args.big_mb)
        s, me, kids, _ = scan([str(big)])
        print(f"  scan one {big.stat().st_size / 1e9:.1f} GB JSONL log             {s:7.2f} s  {me:6.0f} MB")
    if "folder" not in parts:
        return
    folder = runs_folder(args.runs, args.run_mb)
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9
    for jobs in ("1", "2"):
        s, me, kids, _ = scan([str(folder), "--jobs", jobs])
        print(f"  scan {args.runs} runs, {total:.1f} GB, --jobs {jobs}        {s:7.1f} s  main {me:5.0f} MB  largest worker {kids:5.0f} MB  ({total * 1e3 / s:.0f} MB/s)")


if __name__ == "__main__":
    main()
