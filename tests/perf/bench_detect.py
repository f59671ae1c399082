"""Detection speed: the default rules over 10 million points, beside a pure-Python loop of the seed's
detect_loss_spike, and incremental detection (a few new points) on streams of growing length.

    python tests/perf/bench_detect.py [--points 10000000] [--seed-points 200000]

The seed loop is run on --seed-points points and scaled linearly to the full size (it is linear:
one np.mean of 9 values per point); the printed figure says so.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl


def seed_detect_loss_spike(losses, threshold=2.0):
    if len(losses) < 10:
        return False
    recent_avg = np.mean(losses[-10:-1])
    return losses[-1] > threshold * recent_avg


def stream(n: int) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    t = np.arange(1, n + 1)
    loss = 2.0 + 6.0 * np.exp(-t / (n / 50)) + rng.normal(0, 0.03, n)
    spikes = rng.choice(n, size=max(1, n // 100_000), replace=False)
    loss[spikes] *= 3
    loss[rng.choice(n, size=max(1, n // 1_000_000), replace=False)] = np.nan
    return pl.DataFrame({"step": t, "value": loss, "segment": np.zeros(n, dtype=np.int64)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=10_000_000)
    ap.add_argument("--seed-points", type=int, default=200_000)
    args = ap.parse_args()
    from lossguard.detection.spikes import find_incidents
    from lossguard.detection.causes import RunContext
    from lossguard.detection.engine import Seen, judge
    from lossguard.detection.rules import default_rules

    rules = [r for r in default_rules().rules if r.metric == "loss"]
    pts = stream(args.points)
    find_incidents(pts.head(1000), rules[0], run="warmup")
    t0 = time.perf_counter()
    found = [i for r in rules for i in find_incidents(pts, r, run="bench")]
    ours = time.perf_counter() - t0
    values = pts.get_column("value").to_list()[: args.seed_points]
    t0 = time.perf_counter()
    flagged = 0
    for i in range(1, len(values) + 1):
        flagged += bool(seed_detect_loss_spike(values[:i] if i < 10 else values[i - 10 : i]))
    seed = (time.perf_counter() - t0) * args.points / len(values)
    print(f"Detection, default loss rules (ratio 2x/9 + nonfinite), {args.points:,} points:")
    print(f"  lossguard (polars, vectorised)     {ours:8.3f} s   {len(found)} incidents")
    print(f"  seed detect_loss_spike loop        {seed:8.1f} s   (measured on {len(values):,} points, scaled)")
    print(f"  ratio                              {seed / ours:8.0f}x")
    print()
    print("Incremental (the daemon's case): 10 new points judged with the stream's tail, by stream length")
    rule = rules[0]
    for n in (1_000, 100_000, args.points):
        s = pts.head(n)
        window = s.tail(rule.lookback + 10)
        seen = Seen(before={"loss": n - window.height}, new_from={"loss": int(s.get_column("step")[-10])})
        reps = 50
        t0 = time.perf_counter()
        for _ in range(reps):
            judge({"loss": window}, RunContext(loss=None), [rule], run="bench", seen=seen)
        tail = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        find_incidents(s, rule, run="bench")
        full = time.perf_counter() - t0
        print(f"  {n:>11,} points: tail {tail * 1e3:7.2f} ms   full pass {full * 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
