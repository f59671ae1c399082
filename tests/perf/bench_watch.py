"""The daemon's figures: alert latency (inotify and polling), idle CPU and memory following many
runs, keeping up with a fast run, many busy runs at once (`many`; `pass`: one pass's CPU,
in-process) and a start on many runs' history (`first`).

    python tests/perf/bench_watch.py [--runs 1000] [--samples 20] [--rate 1000] [--seconds 60] [--many 100] [--only throughput]

`busy`: the latency to Slack (a local stand-in answering each post after 150 ms) of a spike written
while other runs' alerts keep Slack busy.

Latency is measured from the write of a spike line to its line in the JSON-lines sink.
CPU is the daemon's own utime+stime (from /proc) over the measured interval.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> tuple[float, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def line(step: int, loss: float) -> str:
    return json.dumps({"step": step, "loss": loss, "lr": 1e-4, "grad_norm": 1.0}) + "\n"


def start(tmp: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lossguard.cli", "watch", str(tmp / "runs"), "--state-dir", str(tmp / "state"), "--jsonl", str(tmp / "out.jsonl"),
         "--stall-after", "0", "--log-level", "warning", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_event(path: Path, event: str, step: int, timeout: float = 30) -> float:
    """Until the sink holds `event` for the spike at `step`; returns when it was seen."""
    deadline = time.perf_counter() + timeout
    needle = f'"step": {step},'
    while time.perf_counter() < deadline:
        if path.exists():
            for text in path.read_text().splitlines():
                if f'"event": "{event}"' in text and needle in text:
                    return time.perf_counter()
        time.sleep(0.002)
    raise TimeoutError(path)


def latency(samples: int, *extra: str) -> list[float]:
    tmp = Path(tempfile.mkdtemp())
    log = tmp / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(line(s, 2.0) for s in range(1, 20)))
    proc = start(tmp, *extra)
    time.sleep(3)
    out = tmp / "out.jsonl"
    step = 20
    got = []
    try:
        for _ in range(samples):
            with open(log, "a") as fh:
                fh.write("".join(line(s, 2.0) for s in range(step, step + 12)))
            step += 12
            time.sleep(0.6)
            t0 = time.perf_counter()
            spike = step
            with open(log, "a") as fh:
                fh.write(line(spike, 9.0))
            step += 1
            got.append(wait_event(out, "opened", spike) - t0)
            with open(log, "a") as fh:
                fh.write("".join(line(s, 2.0) for s in range(step, step + 5)))
            step += 5
            wait_event(out, "resolved", spike)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    return got


def busy_round(samples: int, *, others: int = 6, slack_delay: float = 0.1, every: float = 3.0) -> list[float]:
    """The Slack latency of a spike written while Slack is busy with other runs' alerts: `others`
    runs spike and recover every `every` s (each notice a post, each post answered after
    `slack_delay` s by the local Slack stand-in: Slack busy 40% of the time), and the measured run's spike is timed from its
    write to its post reaching the server, whatever round was in flight when it was recorded."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.slack_server import SlackServer

    tmp = Path(tempfile.mkdtemp())
    logs = [tmp / "runs" / name / "metrics.jsonl" for name in ("exp", *(f"busy{i}" for i in range(others)))]
    for log in logs:
        log.parent.mkdir(parents=True)
        log.write_text("".join(line(s, 2.0) for s in range(1, 20)))
    stop = threading.Event()
    got: list[float] = []
    with SlackServer() as slack:
        slack.slow["/api/chat.postMessage"] = slack.slow["/api/chat.update"] = slack_delay
        env = {**os.environ, "LOSSGUARD_SLACK_BASE_URL": slack.base_url, "LOSSGUARD_SLACK_TOKEN": "xoxb-bench", "LOSSGUARD_SLACK_CHANNEL": "C0BENCH",
               "LOSSGUARD_SLACK_MIN_INTERVAL": "0", "LOSSGUARD_PLOTS": "false"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "lossguard.cli", "watch", str(tmp / "runs"), "--state-dir", str(tmp / "state"), "--stall-after", "0",
             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )

        def noise() -> None:
            step = 20
            while not stop.is_set():
                for log in logs[1:]:
                    with open(log, "a") as fh:
                        fh.write("".join(line(s, 2.0) for s in range(step, step + 10)) + line(step + 10, 9.0) + "".join(line(s, 2.0) for s in range(step + 11, step + 15)))
                step += 15
                stop.wait(every)

        time.sleep(3)
        threading.Thread(target=noise, daemon=True).start()
        time.sleep(2)
        step = 20
        try:
            for _ in range(samples):
                with open(logs[0], "a") as fh:
                    fh.write("".join(line(s, 2.0) for s in range(step, step + 12)))
                step += 12
                time.sleep(0.8)
                since = len(slack.requests)
                t0 = time.monotonic()
                with open(logs[0], "a") as fh:
                    fh.write(line(step, 9.0))
                needle = f"step {step}"
                deadline = t0 + 30
                while time.monotonic() < deadline:
                    hit = next((r for r in slack.requests[since:] if r.path == "/api/chat.postMessage" and "`exp`" in str(r.body) and needle in str(r.body)), None)
                    if hit is not None:
                        got.append(hit.at - t0)
                        break
                    time.sleep(0.002)
                step += 1
                with open(logs[0], "a") as fh:
                    fh.write("".join(line(s, 2.0) for s in range(step, step + 5)))
                step += 5
                time.sleep(0.5)
        finally:
            stop.set()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            shutil.rmtree(tmp, ignore_errors=True)
    return got


def small_runs(runs: int) -> tuple[Path, int]:
    """A folder of `runs` runs, each a JSON-lines log of 199 calm steps; and the log's size."""
    tmp = Path(tempfile.mkdtemp())
    history = "".join(line(s, 2.0) for s in range(1, 200))
    for i in range(runs):
        d = tmp / "runs" / f"run{i:04d}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(history)
    return tmp, len(history.encode())


def idle(runs: int, seconds: float, *extra: str) -> tuple[float, float, float]:
    tmp, size = small_runs(runs)
    proc = start(tmp, *extra)  # default intervals: inotify names changed files, a walk every 300 s (polling: 10 s)
    try:
        until_read(tmp, size, runs, since=time.perf_counter(), timeout=300, every=1)
        time.sleep(3)
        c0 = cpu_seconds(proc.pid)
        time.sleep(seconds)
        c1 = cpu_seconds(proc.pid)
        rss, peak = rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    return (c1 - c0) / seconds * 100, rss, peak


PEER = """
import json, os, sys, time
path, offset = sys.argv[1], 0
rest = b""
while not os.path.exists(sys.argv[2]):
    time.sleep(0.1)
    if os.path.getsize(path) > offset:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = rest + fh.read()
        offset += len(data) - len(rest)
        *lines, rest = data.split(b"\\n")
        for text in lines:
            json.loads(text)
"""


def _write_steps(log: Path, rate: int, seconds: float, *, line_buffered: bool, spikes: dict[int, float] | None = None) -> float:
    """Append `rate` JSON lines a second for `seconds`; returns how long it took. With `spikes`, a
    spike (loss 9 among ~2.0) every 2,500 steps, each recorded in it as step -> when it was written."""
    t0 = time.perf_counter()
    step = 1
    out = open(log, "a", buffering=1) if line_buffered else None
    while time.perf_counter() - t0 < seconds:
        batch = max(1, rate // 10) if not line_buffered else 10
        text = [line(s, 9.0 if spikes is not None and s % 2500 == 0 else 2.0 + (s % 7) * 0.01) for s in range(step, step + batch)]
        if line_buffered:
            for one in text:
                out.write(one)
        else:
            with open(log, "a") as fh:
                fh.write("".join(text))
        if spikes is not None:
            spikes.update({s: time.perf_counter() for s in range(step, step + batch) if s % 2500 == 0})
        step += batch
        time.sleep(max(0.0, t0 + step / rate - time.perf_counter()))
    if out is not None:
        out.close()
    return time.perf_counter() - t0


class _Sink(threading.Thread):
    """Watches the JSON-lines sink and notes when each `opened` alert arrived (step -> time)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.seen, self.done = path, {}, threading.Event()

    def run(self) -> None:
        offset, rest = 0, b""
        while not self.done.is_set():
            if self.path.exists() and self.path.stat().st_size > offset:
                with open(self.path, "rb") as fh:
                    fh.seek(offset)
                    data = rest + fh.read()
                offset += len(data) - len(rest)
                *lines, rest = data.split(b"\n")
                now = time.perf_counter()
                for text in lines:
                    event = json.loads(text)
                    if event.get("event") == "opened":
                        self.seen.setdefault(event["step"], now)
                        self.seen.setdefault((event["run"], event["step"]), now)
            time.sleep(0.002)


def peer(rate: int, seconds: float, *, line_buffered: bool = False) -> float:
    """The floor the issue names: a loop that reads only the new bytes from its offset ten times a
    second and parses each line with json.loads (no windows, rules, state or alerts). CPU % of a core."""
    tmp = Path(tempfile.mkdtemp())
    log = tmp / "metrics.jsonl"
    log.write_text(line(0, 2.0))
    proc = subprocess.Popen([sys.executable, "-c", PEER, str(log), str(tmp / "stop")])
    time.sleep(1)
    try:
        c0 = cpu_seconds(proc.pid)
        elapsed = _write_steps(log, rate, seconds, line_buffered=line_buffered)
        c1 = cpu_seconds(proc.pid)
    finally:
        (tmp / "stop").touch()
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    return (c1 - c0) / elapsed * 100


def throughput(rate: int, seconds: float, *, line_buffered: bool = False) -> tuple[float, float, float, list[float]]:
    """A writer with an 8 KB buffer (a trainer's stdout redirected to a file: ~100 lines a write),
    or one that flushes every line (logging's handlers, print(..., flush=True)): one write, and one
    inotify event, per line. Returns CPU %, how long after the writer stopped the daemon had read
    everything, peak RSS, and the alert latency of the spikes written meanwhile."""
    tmp = Path(tempfile.mkdtemp())
    log = tmp / "runs" / "fast" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(line(0, 2.0))
    proc = start(tmp)
    time.sleep(3)
    sink = _Sink(tmp / "out.jsonl")
    sink.start()
    spikes: dict[int, float] = {}
    try:
        c0 = cpu_seconds(proc.pid)
        elapsed = _write_steps(log, rate, seconds, line_buffered=line_buffered, spikes=spikes)
        c1 = cpu_seconds(proc.pid)
        stopped = time.perf_counter()
        size = log.stat().st_size
        import sqlite3

        caught = None
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            with sqlite3.connect(f"file:{tmp / 'state' / 'state.db'}?mode=ro", uri=True) as conn:
                cursor = json.loads(conn.execute("SELECT cursor FROM files").fetchone()[0])
            if cursor["offset"] >= size:
                caught = time.perf_counter()
                break
            time.sleep(0.05)
        time.sleep(1.5)
        _, peak = rss_mb(proc.pid)
    finally:
        sink.done.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    latencies = [sink.seen[s] - t for s, t in spikes.items() if s in sink.seen]
    if len(latencies) != len(spikes):
        print(f"    ({len(spikes) - len(latencies)} of {len(spikes)} spikes were not alerted)")
    return (c1 - c0) / elapsed * 100, caught - stopped if caught is not None else float("nan"), peak, latencies


def many(runs: int, rate: int, seconds: float) -> tuple[float, list[float]]:
    """`runs` runs each logging `rate` steps a second (a sweep on one box), every 0.1 s; one spike
    per run along the way. Returns CPU % of a core and the spikes' alert latencies."""
    tmp = Path(tempfile.mkdtemp())
    logs = []
    for i in range(runs):
        log = tmp / "runs" / f"run{i:03d}" / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text(line(0, 2.0))
        logs.append(log)
    proc = start(tmp)
    time.sleep(5)
    sink = _Sink(tmp / "out.jsonl")
    sink.start()
    spikes: dict[tuple[str, int], float] = {}
    per_tick = max(1, rate // 10)
    try:
        c0 = cpu_seconds(proc.pid)
        t0 = time.perf_counter()
        step, tick, ticks = 1, 0, int(seconds * 10)
        spike_tick = {i: 10 + i * max(1, ticks - 40) // runs for i in range(runs)}  # spread over the run
        while time.perf_counter() - t0 < seconds:
            for i, log in enumerate(logs):
                spike = spike_tick[i] == tick
                with open(log, "a") as fh:
                    fh.write("".join(line(s, 9.0 if spike and s == step else 2.0 + (s % 7) * 0.01) for s in range(step, step + per_tick)))
                if spike:
                    spikes[(log.parent.name, step)] = time.perf_counter()
            step += per_tick
            tick += 1
            time.sleep(max(0.0, t0 + step / rate - time.perf_counter()))
        elapsed = time.perf_counter() - t0
        c1 = cpu_seconds(proc.pid)
        time.sleep(10)
    finally:
        sink.done.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    latencies = [sink.seen[(run, s)] - t for (run, s), t in spikes.items() if (run, s) in sink.seen]
    if len(latencies) != len(spikes):
        print(f"    ({len(spikes) - len(latencies)} of {len(spikes)} spikes were not alerted within 10 s of the writers stopping)")
    return (c1 - c0) / elapsed * 100, latencies


def until_read(tmp: Path, size: int, files: int, *, since: float, timeout: float, every: float) -> float:
    """Seconds from `since` until the daemon's state has `files` files read to `size` bytes."""
    import sqlite3

    while time.perf_counter() - since < timeout:
        time.sleep(every)
        try:
            with sqlite3.connect(f"file:{tmp / 'state' / 'state.db'}?mode=ro", uri=True) as conn:
                done = conn.execute("SELECT count(*) FROM files WHERE json_extract(cursor, '$.offset') >= ?", (size,)).fetchone()[0]
        except sqlite3.Error:
            continue
        if done >= files:
            break
    return time.perf_counter() - since


def first_pass(runs: int) -> float:
    """A daemon started on `runs` small runs (199 lines each, as in `idle`): seconds from its start
    until every file is read to its end (the history a first start reads quietly)."""
    tmp, size = small_runs(runs)
    t0 = time.perf_counter()
    proc = start(tmp)
    try:
        took = until_read(tmp, size, runs, since=t0, timeout=300, every=0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    return took


def one_pass(runs: int, lines: int, passes: int = 10) -> tuple[float, float]:
    """In-process, what one pass costs over `runs` busy runs that each got `lines` new lines (one run
    in 20 with a spike among them): the median process CPU of a pass, and of the first pass over
    their history (199 lines each)."""
    from lossguard.watch.follow import Follower
    from lossguard.detection.rules import default_rules
    from lossguard.state import State

    tmp, _ = small_runs(runs)
    logs = sorted((tmp / "runs").glob("*/metrics.jsonl"))
    state = State(tmp / "state")
    follower = Follower([tmp / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=1e9)
    c0 = time.process_time()
    follower.run_pass(1.0)
    first = time.process_time() - c0
    step, took = 200, []
    for p in range(passes):
        for i, log in enumerate(logs):
            with open(log, "a") as fh:
                fh.write("".join(line(s, 9.0 if (i + p) % 20 == 0 and s == step + 1 else 2.0 + (s % 7) * 0.01) for s in range(step, step + lines)))
        step += lines
        c0 = time.process_time()
        follower.run_pass(2.0 + p, [str(log) for log in logs])
        took.append(time.process_time() - c0)
    state.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return statistics.median(took), first


def history(mb: int) -> tuple[float, float, float, float]:
    """A daemon started on a run whose log already holds `mb` MB: how long it takes to read it all
    (quietly: history is not alerted), and its memory while and after doing so."""
    from bench_readers import text_file

    src = text_file("jsonl", mb)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "runs" / "big").mkdir(parents=True)
    os.symlink(src, tmp / "runs" / "big" / "metrics.jsonl")
    size = src.stat().st_size
    t0 = time.perf_counter()
    proc = start(tmp)
    try:
        took = until_read(tmp, size, 1, since=t0, timeout=900, every=0.5)
        rss, peak = rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    return size / 1e9, took, rss, peak


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--idle-seconds", type=float, default=60)
    ap.add_argument("--history-mb", type=int, default=1024)
    ap.add_argument("--many", type=int, default=100, help="runs writing at once, for the 'many' part")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the 'first' part (its min is printed)")
    ap.add_argument("--only", choices=("latency", "busy", "idle", "history", "throughput", "many", "first", "pass"), action="append", help="run only these parts")
    args = ap.parse_args()
    parts = set(args.only or ("latency", "busy", "idle", "history", "throughput", "many", "first", "pass"))
    print("lossguard watch benchmark")
    if "latency" in parts:
        ino = latency(args.samples, "--poll-interval", "2")
        print(f"  latency, inotify (poll 2 s as backstop): p50 {statistics.median(ino) * 1e3:6.0f} ms   p95 {pct(ino, 0.95) * 1e3:6.0f} ms")
        pol = latency(args.samples, "--polling", "--poll-interval", "1")
        print(f"  latency, polling every 1 s:              p50 {statistics.median(pol) * 1e3:6.0f} ms   p95 {pct(pol, 0.95) * 1e3:6.0f} ms")
    if "busy" in parts:
        busy = busy_round(args.samples)
        print(f"  latency to Slack while it is busy (6 other runs spiking every 3 s, 100 ms a post): p50 {statistics.median(busy) * 1e3:6.0f} ms   "
              f"p95 {pct(busy, 0.95) * 1e3:6.0f} ms   ({len(busy)} of {args.samples} seen)")
    if "idle" in parts:
        cpu, rss, peak = idle(args.runs, args.idle_seconds)
        print(f"  idle, following {args.runs} runs, inotify:          CPU {cpu:5.2f}% of a core   RSS {rss:.0f} MB (peak {peak:.0f} MB)")
        cpu, rss, peak = idle(args.runs, args.idle_seconds, "--polling")
        print(f"  idle, following {args.runs} runs, polling every 10 s: CPU {cpu:5.2f}% of a core   RSS {rss:.0f} MB (peak {peak:.0f} MB)")
    if "history" in parts:
        gb, took, rss, peak = history(args.history_mb)
        print(f"  start on a run with {gb:.1f} GB of history:       read in {took:.0f} s   RSS after {rss:.0f} MB (peak {peak:.0f} MB)")
    if "throughput" in parts:
        for style, flag in (("8 KB writes", False), ("a flush per line", True)):
            cpu, lag, peak, alerts = throughput(args.rate, args.seconds, line_buffered=flag)
            floor = peer(args.rate, args.seconds, line_buffered=flag)
            print(
                f"  a run logging {args.rate} steps/s for {args.seconds:.0f} s, {style:16s}: CPU {cpu:5.2f}% of a core "
                f"(reading new bytes + json.loads alone: {floor:4.2f}%; {cpu / floor:.1f}x)   caught up {lag:.2f} s after the writer stopped   peak RSS {peak:.0f} MB"
            )
            if alerts:
                print(
                    f"      its {len(alerts)} spikes alerted after p50 {statistics.median(alerts) * 1e3:.0f} ms, "
                    f"p95 {pct(alerts, 0.95) * 1e3:.0f} ms, max {max(alerts) * 1e3:.0f} ms"
                )
    if "many" in parts:
        cpu, alerts = many(args.many, 10, args.seconds)
        print(f"  {args.many} runs logging 10 steps/s each for {args.seconds:.0f} s: CPU {cpu:5.1f}% of a core", end="")
        if alerts:
            print(f"   their spikes alerted after p50 {statistics.median(alerts):.1f} s, p95 {pct(alerts, 0.95):.1f} s, max {max(alerts):.1f} s")
        else:
            print()
    if "pass" in parts:
        busy, first = one_pass(args.many, 8)
        print(f"  one pass (in-process) over {args.many} runs with 8 new lines each: {busy * 1e3:.0f} ms of CPU ({busy / args.many * 1e3:.2f} ms a run); "
              f"the first, over their history: {first:.2f} s")
    if "first" in parts:
        took = min(first_pass(args.runs) for _ in range(args.repeat))
        print(f"  start on {args.runs} small runs (199 lines each): all read after {took:.1f} s (min of {args.repeat}, from the process start)")


if __name__ == "__main__":
    main()
