"""An MLflow SQLite store of 1M metric rows: `lossguard read` against MLflow's own client
(`MlflowClient().get_metric_history` for each run and key), side by side in one run.

    python tests/perf/bench_mlflow.py                 # 1M rows: 4 runs x 5 keys x 50,000 steps
    python tests/perf/bench_mlflow.py --steps 5000    # a quicker look

The database is made by MLflow (its migrations, experiment and runs through MlflowClient), and its
metric rows are then inserted by SQL into the `metrics` table MLflow created, in the shape
`log_batch` writes them (logging a million rows through MLflow takes most of an hour). It is cached
in perf-data/. Every figure is a fresh process (wall time and peak RSS, os.wait4); each child also
says how long its read took once its imports were done (MLflow's: once its client was made).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, measure  # noqa: E402

RUNS, KEYS = 4, ("loss", "lr", "grad_norm", "loss_scale", "tokens_per_second")

OURS = """
import time
from pathlib import Path
from lossguard.ingest.reader import read, ReadOptions
t = time.perf_counter()
r = read(Path({path!r}), run=".", fmt="mlflow_db", final=True, options=ReadOptions())
assert not r.problems, r.problems
print(r.frame.height, time.perf_counter() - t)
"""
OURS_CLI = """
import sys, time, contextlib
from lossguard.cli import main
t = time.perf_counter()
sys.argv = ["lossguard", "read", {path!r}, "--format", "csv"]
with open("/dev/null", "w") as out, contextlib.redirect_stdout(out):
    try:
        main()
    except SystemExit:
        pass
print(0, time.perf_counter() - t)
"""
PEER = """
import time
from mlflow import MlflowClient
client = MlflowClient(tracking_uri="sqlite:///" + {path!r})
t = time.perf_counter()
n = 0
for exp in client.search_experiments():
    for run in client.search_runs([exp.experiment_id]):
        for key in run.data.metrics:
            n += len(client.get_metric_history(run.info.run_id, key))
print(n, time.perf_counter() - t)
"""


def database(steps: int) -> Path:
    """perf-data/mlflow-<rows>.db: made by MLflow, its metric rows inserted by SQL."""
    path = DATA / f"mlflow-{RUNS * len(KEYS) * steps}.db"
    if path.exists():
        return path
    from mlflow import MlflowClient

    DATA.mkdir(exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    client = MlflowClient(tracking_uri="sqlite:///" + str(partial))
    experiment = client.create_experiment("pretrain")
    runs = [client.create_run(experiment, run_name=f"run-{i}").info.run_id for i in range(RUNS)]
    for run in runs:
        client.log_metric(run, KEYS[0], 2.0, timestamp=0, step=0)  # (so that MLflow's latest_metrics knows each key)
        for key in KEYS[1:]:
            client.log_metric(run, key, 1.0, timestamp=0, step=0)
    with sqlite3.connect(partial) as db:
        db.execute("DELETE FROM metrics")
        for run in runs:
            rows = [
                (key, 2.0 + math.sin(step / 50) * 0.1 + k, 1_790_000_000_000 + step * 100, run, step, 0)
                for step in range(steps) for k, key in enumerate(KEYS)
            ]
            db.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.close()
    partial.rename(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50_000)
    args = ap.parse_args()
    path = database(args.steps)
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB")
    print(f"  {'reader':<48} {'process':>9} {'read':>9} {'peak RSS':>10}")
    results = {}
    for name, code in (("lossguard read (library, full table)", OURS), ("lossguard read --format csv > /dev/null", OURS_CLI),
                       ("MlflowClient.get_metric_history per run, key", PEER)):
        wall, rss, out = measure(code.format(path=str(path)))
        rows, inner = out.split()[-2:]
        results[name] = (wall, float(inner), int(rows))
        print(f"  {name:<48} {wall:8.2f}s {float(inner):8.2f}s {rss:8.0f} MB" + (f"  {int(rows):,} rows" if int(rows) else ""))
    peer_wall, peer_inner, _ = results["MlflowClient.get_metric_history per run, key"]
    for name in list(results)[:2]:
        wall, inner, _ = results[name]
        print(f"  {name}: {peer_wall / wall:.1f}x faster as processes, {peer_inner / inner:.1f}x as reads")


if __name__ == "__main__":
    main()
