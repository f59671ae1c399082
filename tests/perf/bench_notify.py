"""Delivery latency per sink: from the write of a spike line to the moment each service had its
message, for Slack (the local Slack-like server, through slack-sdk), the notification URLs through
apprise (json://, ntfy://, gotify:// on a local HTTP server; mailto:// on aiosmtpd's SMTP server),
the on_incident command (its start) and the JSON-lines file, all from one daemon following one run.

    python tests/perf/bench_notify.py [--samples 10] [--gap 6]

Each sample is a new spike in a run of its own. `--gap` seconds between samples: apprise paces one
URL's messages 5.5 s apart for services that name no pace of their own (ntfy, e-mail), which a
shorter gap would measure instead of the delivery.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.notify_servers import HookServer, MailServer  # noqa: E402
from tests.slack_server import SlackServer  # noqa: E402

STAMP = "import sys, time\nopen(sys.argv[1], 'a').write(f'{time.time()}\\n')\n"


def calm(steps: range) -> str:
    return "".join(json.dumps({"step": s, "loss": 2.0 + (s % 5) * 0.01}) + "\n" for s in steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--gap", type=float, default=6.0)
    args = ap.parse_args()
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(var, None)
    with tempfile.TemporaryDirectory() as tmp_name, HookServer() as hooks, MailServer() as mail, SlackServer() as slack:
        tmp = Path(tmp_name)
        (tmp / "runs").mkdir()
        stamps, stamp = tmp / "action.txt", tmp / "stamp.py"
        stamp.write_text(STAMP)
        config = tmp / "lossguard.toml"
        config.write_text(f'[slack]\nchannel = "#training"\nbase_url = "{slack.base_url}"\nmin_interval = 0.0\ngroup_threshold = 100\n')
        env = {**os.environ, "PYTHONPATH": str(REPO), "LOSSGUARD_SLACK_TOKEN": "xoxb-bench", "LOSSGUARD_PLOTS": "false", "NO_PROXY": "*",
               "LOSSGUARD_NOTIFY_URLS": ",".join([f"json://localhost:{hooks.port}/hook", f"ntfy://localhost:{hooks.port}/training",
                                                  f"gotify://localhost:{hooks.port}/AppTokenBench1", mail.url()]),
               "LOSSGUARD_ON_INCIDENT": shlex.join([sys.executable, str(stamp), str(stamps)])}
        proc = subprocess.Popen([sys.executable, "-m", "lossguard.cli", "watch", str(tmp / "runs"), "--config", str(config), "--state-dir",
                                 str(tmp / "state"), "--jsonl", str(tmp / "out.jsonl"), "--stall-after", "0", "--log-level", "warning"],
                                env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "wb"))
        lat: dict[str, list[float]] = {k: [] for k in ("slack", "json", "ntfy", "gotify", "mailto", "on_incident", "jsonl")}
        try:
            settled(tmp / "state" / "state.db", proc)
            for i in range(args.samples + 1):  # (the first one warms up: imports, first connections)
                log = tmp / "runs" / f"r{i}" / "metrics.jsonl"
                log.parent.mkdir()
                log.write_text(calm(range(1, 20)))
                time.sleep(1.5)  # (its history read, so the spike is news)
                counts = (len(slack.requests), len(hooks.requests), len(mail.messages))
                wall, start = time.time(), time.monotonic()
                with open(log, "a") as fh:
                    fh.write(json.dumps({"step": 20, "loss": 9.0}) + "\n")
                got = wait_all(slack, hooks, mail, stamps, tmp / "out.jsonl", counts, i)
                if i:
                    lat["slack"].append(got["slack"] - start)
                    for kind, path in (("json", "/hook"), ("ntfy", "/"), ("gotify", "/message")):
                        lat[kind].append(got[kind] - start)
                    lat["mailto"].append(got["mailto"] - start)
                    lat["on_incident"].append(got["on_incident"] - wall)
                    lat["jsonl"].append(got["jsonl"] - start)
                time.sleep(args.gap)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"delivery latency, write -> received, {args.samples} samples (ms)")
    print(f"{'sink':<12} {'p50':>7} {'p95':>7} {'max':>7}")
    for name, values in lat.items():
        values = sorted(v * 1000 for v in values)
        p95 = values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))]
        print(f"{name:<12} {statistics.median(values):7.0f} {p95:7.0f} {values[-1]:7.0f}")


def settled(db: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the daemon's first pass has committed: from then on, what is written is news."""
    import sqlite3

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                if conn.execute("SELECT count(*) FROM meta WHERE key='settled'").fetchone()[0]:
                    return
        except sqlite3.Error:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode}): {(db.parent.parent / 'daemon.log').read_text()[-2000:]}")
        time.sleep(0.05)
    raise SystemExit("the daemon never made its first pass")


def wait_all(slack, hooks, mail, stamps: Path, jsonl: Path, counts: tuple[int, int, int], i: int, timeout: float = 60) -> dict[str, float]:  # noqa: ANN001
    """When each sink had the spike of run r{i}: the servers' own arrival times (monotonic), the
    command's start (wall clock), the JSON-lines line as seen by polling."""
    got: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(got) < 7:
        for r in slack.requests[counts[0]:]:
            if r.path == "/api/chat.postMessage" and f"r{i}" in json.dumps(r.body):
                got.setdefault("slack", r.at)
        for r in hooks.requests[counts[1]:]:
            kind = "json" if r.path == "/hook" else "gotify" if r.path == "/message" else "ntfy"
            got.setdefault(kind, r.at)
        if len(mail.messages) > counts[2]:
            got.setdefault("mailto", time.monotonic())  # (aiosmtpd keeps no arrival time: polled, within 2 ms)
        if stamps.exists() and len(stamps.read_text().splitlines()) >= i + 1:
            got.setdefault("on_incident", float(stamps.read_text().splitlines()[i]))
        if jsonl.exists() and f'"run": "r{i}"' in jsonl.read_text():
            got.setdefault("jsonl", time.monotonic())
        time.sleep(0.002)
    missing = {"slack", "json", "ntfy", "gotify", "mailto", "on_incident", "jsonl"} - set(got)
    if missing:
        raise SystemExit(f"sample {i}: never delivered to {sorted(missing)}: {(jsonl.parent / 'daemon.log').read_text()[-2000:]}")
    return got


if __name__ == "__main__":
    main()
