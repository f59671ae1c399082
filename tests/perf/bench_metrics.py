"""What serving `/metrics` costs the daemon following 1,000 runs, beside what it costs idle.

    python tests/perf/bench_metrics.py [--runs 1000] [--idle 30] [--scrapes 60] [--interval 15]

The daemon follows --runs runs (each a small JSON-lines log, read as history), with metrics_listen
set. Idle cost: its own CPU (utime+stime from /proc) over --idle seconds with nobody scraping. Scrape
cost: its CPU over --scrapes scrapes made back to back, per scrape; at one scrape every --interval
seconds that is the share of a core printed (target: < 0.1% at 15 s with 1,000 runs). A run's text
is rendered again only after a pass committed new data for it: what a scrape then costs, with every
run changed since the last scrape, 30 of them, and none (a commit that touched no run's metrics),
is measured in-process on the same state and printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_after_commit(state_dir: Path, n: int, changed: int) -> float:
    """CPU seconds of one render after a pass committed new values for `changed` runs (a box
    where that many runs logged since the last scrape); the commit itself is not counted."""
    import numpy as np

    from lossguard.watch.metrics import Exposition, Health
    from lossguard.state import State, StateReader, Tail

    state = State.attach(state_dir)
    runs = [r for (r,) in state.db.execute("SELECT run FROM runs ORDER BY run")][:changed]
    reader = StateReader(state_dir / "state.db")
    exposition = Exposition(reader, Health(["console"]))
    exposition.render()
    spent = 0.0
    for i in range(n):
        with state.transaction() as tx:
            for run in runs:
                for metric in ("loss", "lr", "grad_norm", "loss_scale"):
                    tx.put_tail(run, metric, Tail(np.arange(1, 31, dtype=np.int64), np.full(30, 2.0 + i * 1e-3), 30 + i))
                tx.advance_run(run, 31 + i, now=time.time())
        started = time.process_time()
        exposition.render()
        spent += time.process_time() - started
    reader.close()
    state.close()
    return spent / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--scrapes", type=int, default=60)
    ap.add_argument("--interval", type=float, default=15.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lossguard-bench-metrics-"))
    try:
        for i in range(args.runs):
            run = tmp / "runs" / f"run-{i:04d}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(
                json.dumps({"step": s, "loss": 2.0 + (s % 7) * 0.01, "lr": 1e-4, "grad_norm": 1.0, "loss_scale": 65536.0}) + "\n" for s in range(1, 31)
            ))
        port = free_port()
        env = {**os.environ, "LOSSGUARD_METRICS_LISTEN": f"127.0.0.1:{port}"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "lossguard.cli", "watch", str(tmp / "runs"), "--state-dir", str(tmp / "state"), "--stall-after", "0", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    with sqlite3.connect(f"file:{tmp / 'state' / 'state.db'}?mode=ro", uri=True) as db:
                        if db.execute("SELECT count(*) FROM runs").fetchone()[0] >= args.runs and db.execute("SELECT count(*) FROM meta WHERE key='settled'").fetchone()[0]:
                            break
                except sqlite3.Error:
                    pass
                time.sleep(0.5)
            else:
                raise TimeoutError("the daemon never read every run")
            time.sleep(3)  # the first walk's follow-up passes
            url = f"http://127.0.0.1:{port}/metrics"
            body = urllib.request.urlopen(url, timeout=10).read()  # noqa: S310 - localhost
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))

            before = cpu_seconds(proc.pid)
            time.sleep(args.idle)
            idle = (cpu_seconds(proc.pid) - before) / args.idle

            before, started = cpu_seconds(proc.pid), time.perf_counter()
            for _ in range(args.scrapes):
                urllib.request.urlopen(url, timeout=10).read()  # noqa: S310
            per_scrape = (cpu_seconds(proc.pid) - before) / args.scrapes
            wall = (time.perf_counter() - started) / args.scrapes
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        fresh = {k: render_after_commit(tmp / "state", args.scrapes, k) for k in (args.runs, 30, 0)}
        print(f"runs followed: {args.runs}; one scrape: {len(body) / 1024:.0f} KB, {series} samples")
        print(f"idle (no scrapes): {idle * 100:.3f}% of a core over {args.idle:.0f} s")
        print(f"per scrape: {per_scrape * 1e3:.1f} ms of daemon CPU ({wall * 1e3:.1f} ms wall), mean of {args.scrapes}")
        print(f"scraped every {args.interval:g} s: {per_scrape / args.interval * 100:.3f}% of a core (target < 0.1%)")
        for k, cost in fresh.items():
            print(f"a scrape after a pass committed new values for {k} of {args.runs} runs (in-process CPU): {cost * 1e3:.1f} ms; "
                  f"every {args.interval:g} s: {cost / args.interval * 100:.3f}% of a core")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
