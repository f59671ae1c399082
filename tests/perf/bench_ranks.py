"""The daemon's pass over a job written per rank against the same number of runs of their own: N
torchrun ranks (`attempt_0/<rank>/stdout.log`) whose loss spikes at the same step, against N runs
(`run<k>/train.log`) spiking alike. The ranks' pass also joins the N incidents into one alert and
compares every rank's step time and loss with the others' (stragglers); the runs' pass raises N
alerts. Then a pass that reads one new line of one rank (or run). Both read the same bytes,
in-process, on the state in a temporary folder.

    python tests/perf/bench_ranks.py [--ranks 64 256 512]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.test_ranks_watch import lines  # noqa: E402
from tests.test_watch_crash import follower  # noqa: E402


def one_pass(n: int, *, ranked: bool) -> tuple[float, int, float]:
    """(seconds, notices) of the pass that reads the spike of `n` ranks (or runs), and the seconds
    of a pass that then reads one new line of one of them (what inotify hands over while a job
    runs: the rank compared with every other one's tail)."""
    root = Path(tempfile.mkdtemp(prefix="lossguard-ranks-"))

    def path(k: int) -> Path:
        return root / "runs" / (f"job_k3j2x9ab/attempt_0/{k}/stdout.log" if ranked else f"run{k}/train.log")

    for k in range(n):
        path(k).parent.mkdir(parents=True, exist_ok=True)
        path(k).write_text(lines(range(1, 61)))
    state, f = follower(root)
    f.run_pass(1.0)
    for k in range(n):
        with open(path(k), "a") as fh:
            fh.write(lines(range(61, 91), spike_at=80))
    start = time.perf_counter()
    report = f.run_pass(2.0)
    took = time.perf_counter() - start
    with open(path(0), "a") as fh:
        fh.write(lines(range(91, 92)))
    start = time.perf_counter()
    f.run_pass(3.0, changed=[str(path(0))])
    one = time.perf_counter() - start
    state.close()
    return took, len(report.notices), one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 512])
    args = parser.parse_args()
    print(f"{'N':>5}  {'ranks of one job':>22}  {'runs of their own':>22}  ratio  {'one line, ranks / runs':>24}")
    for n in args.ranks:
        ranks, said_ranks, line_ranks = one_pass(n, ranked=True)
        runs, said_runs, line_runs = one_pass(n, ranked=False)
        print(f"{n:>5}  {ranks * 1000:>9.0f} ms {said_ranks:>4} notices  {runs * 1000:>9.0f} ms {said_runs:>4} notices  {runs / ranks:.2f}"
              f"  {line_ranks * 1000:>8.1f} ms / {line_runs * 1000:.1f} ms")


if __name__ == "__main__":
    main()
