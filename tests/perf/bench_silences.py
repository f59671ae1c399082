"""What ended silences cost: a state keeping --ended silences, all ended and reported, and one in force.

    python tests/perf/bench_silences.py [--ended 100000] [--rounds 50] [--idle 20]

Per round: the CPU of Dispatcher.round with nothing to deliver (in-process, --rounds rounds). The
CLI: the wall time of `silence list --all` (the last 100 ended shown), of `--all --limit 0` (every
row) and of `silence list`, each a fresh process. The daemon: its own CPU (utime+stime from /proc)
over --idle seconds following one calm run, and the time from a spike written to its line in the
JSON-lines sink, four times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _line(step: int, loss: float) -> str:
    return json.dumps({"step": step, "loss": loss}) + "\n"


def build(directory: Path, ended: int) -> None:
    """The state, and four calm runs for the daemon to follow."""
    from lossguard.state import State

    for run in "abcd":
        (directory / "runs" / run).mkdir(parents=True)
        (directory / "runs" / run / "metrics.jsonl").write_text("".join(_line(s, 2.0 + s % 5 * 0.01) for s in range(1, 50)))
    state, now = State(directory / "state"), time.time()
    with state.transaction():
        state.db.executemany(
            "INSERT INTO silences (run, starts, ends, comment, author, created, reported) VALUES (?,?,?,?,?,?,?)",
            [(f"r{i}", now - 90_000, now - 86_400 + i * 0.1, "old", "ana", now - 90_000, now - 86_400 + i * 0.1) for i in range(ended)],
        )
    state.add_silence(run="live", rule=None, metric=None, cause=None, starts=now, ends=now + 3600, comment="in force", author="ana")
    state.close()


def per_round(directory: Path, rounds: int) -> float:
    """CPU seconds of one Dispatcher.round with nothing waiting."""
    from lossguard.alerts.pipeline import Dispatcher
    from lossguard.alerts.sinks import JsonlSink
    from lossguard.state import State

    state = State(directory / "state")
    try:
        sender = Dispatcher(state, {"jsonl": JsonlSink(directory / "rounds.jsonl")})
        sender.round()
        began = time.process_time()
        for _ in range(rounds):
            sender.round()
        return (time.process_time() - began) / rounds
    finally:
        state.close()


def cli(directory: Path, *args: str) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lossguard", "silence", "list", *args, "--state-dir", str(directory / "state")],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def daemon(directory: Path, idle: float) -> tuple[float, list[float]]:
    """(share of a core used idle, seconds from each spike written to its alert)."""
    out = directory / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "lossguard", "watch", str(directory / "runs"), "--state-dir", str(directory / "state"),
                             "--jsonl", str(out)], stderr=subprocess.DEVNULL)

    def cpu() -> float:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    try:
        time.sleep(6)  # (started, first pass made)
        used, began = cpu(), time.monotonic()
        time.sleep(idle)
        share = (cpu() - used) / (time.monotonic() - began)
        took = []
        for run in "abcd":
            began = time.monotonic()
            with open(directory / "runs" / run / "metrics.jsonl", "a") as fh:
                fh.write(_line(50, 9.0))
            while not (out.exists() and any(json.loads(line)["run"] == run for line in out.read_text().splitlines())):
                time.sleep(0.01)
            took.append(time.monotonic() - began)
            time.sleep(1.3)
        return share, took
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ended", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--idle", type=float, default=20.0)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="lossguard-silences-"))
    try:
        build(directory, args.ended)
        print(f"{args.ended:,} ended silences, one in force")
        print(f"Dispatcher.round: {per_round(directory, args.rounds) * 1e3:.2f} ms CPU")
        for words in (["--all"], ["--all", "--limit", "0"], []):
            print(f"silence list {' '.join(words)}: {cli(directory, *words):.2f} s")
        share, took = daemon(directory, args.idle)
        print(f"daemon idle: {share * 100:.2f} % of a core; spike to alert: {', '.join(f'{t:.2f}' for t in took)} s")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
