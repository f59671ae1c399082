"""Runs on object storage, against moto's S3 server on 127.0.0.1 behind a counting proxy:

- `lossguard scan s3://bench/runs` over --runs small runs (a JSON-lines log each), against boto3
  downloading the same objects (10 threads, as `aws s3 sync` by default) and then a local scan;
- the daemon's requests per poll while --idle runs sit unchanged.

    python tests/perf/bench_object_store.py [--runs 1000] [--idle 100]

Needs s3fs and moto[server] (the test extra). A local server answers in about a millisecond: on a
real bucket each request costs its latency (tens of ms), which the mirror's concurrent fetches
(4 per --jobs worker) and the listing's pages of a thousand keys are there to hide.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import child_env  # noqa: E402

from tests.s3_server import S3Proxy  # noqa: E402


def _log(run: int) -> bytes:
    return "".join(json.dumps({"step": s, "loss": 2.0 + ((s * 7 + run) % 11) * 0.01, "lr": 1e-4}) + "\n" for s in range(1, 201)).encode()


def _timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-2000:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--idle", type=int, default=100)
    parser.add_argument("--watch-seconds", type=float, default=10.0)
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = S3Proxy((host, port))
    env = {**child_env(), "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": proxy.url, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    import boto3

    writer = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
    writer.create_bucket(Bucket="bench")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: writer.put_object(Bucket="bench", Key=f"runs/run{i:05d}/metrics.jsonl", Body=_log(i)), range(args.runs)))
    scan = [sys.executable, "-m", "lossguard.cli", "scan", "--format", "json", "-o", os.devnull, "--quiet"]

    proxy.reset()
    remote = _timed([*scan, "s3://bench/runs"], env)
    requests = sum(proxy.counts.values())

    with tempfile.TemporaryDirectory() as tmp:
        reader = boto3.client("s3", endpoint_url=proxy.url)
        start = time.perf_counter()
        keys = [o["Key"] for page in reader.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix="runs/") for o in page.get("Contents", [])]

        def download(key: str) -> None:
            target = Path(tmp, key)
            target.parent.mkdir(parents=True, exist_ok=True)
            reader.download_file("bench", key, str(target))

        with ThreadPoolExecutor(10) as pool:
            list(pool.map(download, keys))
        fetched = time.perf_counter() - start
        local = _timed([*scan, str(Path(tmp, "runs"))], env)

    print(f"scan of {args.runs} runs: s3:// {remote:.2f} s ({requests} requests) | boto3 download {fetched:.2f} s + local scan {local:.2f} s = {fetched + local:.2f} s")

    for i in range(args.idle):
        writer.put_object(Bucket="bench", Key=f"idle/run{i:04d}/metrics.jsonl", Body=_log(i))
    with tempfile.TemporaryDirectory() as state:
        daemon = subprocess.Popen([sys.executable, "-m", "lossguard.cli", "watch", "s3://bench/idle", "--state-dir", state, "--poll-interval", "1",
                                   "--stall-after", "0"], env={**env, "LOSSGUARD_PLOTS": "false"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(p.is_file() for p in Path(state).rglob("metrics.jsonl")):
                time.sleep(0.2)
            time.sleep(3)  # (the first passes read the history)
            proxy.reset()
            time.sleep(args.watch_seconds)
            lines = list(proxy.lines)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    polls = sum(1 for line in lines if "list-type=2" in line)
    print(f"watch of {args.idle} idle runs: {len(lines)} requests over {polls} polls ({len(lines) / max(polls, 1):.1f} a poll)")
    proxy.close()
    server.stop()


if __name__ == "__main__":
    main()
