"""A JSON-lines log whose every line brings new keys, read by lossguard beside a plain json.loads loop
building the same (step, metric, value) rows, in one run.

    python tests/perf/bench_wide_jsonl.py                        # 2,000 lines x 10 new keys (364 KB)
    python tests/perf/bench_wide_jsonl.py --lines 20000          # ten times the lines: time should grow ~10x
    python tests/perf/bench_wide_jsonl.py --before /tmp/old      # also an older checkout (its lossguard/ in that folder)

Such a log once cost 4.5 minutes and 523 MB: polars' NDJSON reader made a column for each key of the
first 1,000 lines (10,000 of them) and a row for each line, and the fast path then rebuilt the schema
once per column. Every figure is a whole fresh process: wall time and peak RSS (os.wait4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, measure  # noqa: E402

LOSSGUARD = """
from pathlib import Path
from lossguard.ingest.reader import read, ReadOptions
r = read(Path({path!r}), run="r", fmt="jsonl", final=True, options=ReadOptions())
assert not r.problems, r.problems
print(r.frame.height)
"""

JSON_LOOP = """
import json, math
rows = []
with open({path!r}) as fh:
    for line in fh:
        record = json.loads(line)
        step = record.pop("step")
        rows.extend((step, k, float(v)) for k, v in record.items() if isinstance(v, (int, float)))
print(len(rows))
"""


def wide_file(lines: int, new_keys: int) -> Path:
    """The case of the issue: every line has step, loss and `new_keys` keys of its own."""
    DATA.mkdir(exist_ok=True)
    path = DATA / f"wide-{lines}x{new_keys}.jsonl"
    if not path.exists():
        with path.open("w") as fh:
            for i in range(lines):
                record = {"step": i + 1, "loss": 2.0 + (i % 13) / 100, **{f"m{i}_{j}": i + j / 10 for j in range(new_keys)}}
                fh.write(json.dumps(record) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--new-keys", type=int, default=10)
    parser.add_argument("--before", type=Path, help="a folder holding an older lossguard/ package to measure too")
    args = parser.parse_args()
    path = wide_file(args.lines, args.new_keys)
    print(f"{path.name}: {path.stat().st_size / 1024:.0f} KB, {args.lines} lines, {args.lines * args.new_keys} distinct keys")
    cases = [("json.loads loop", JSON_LOOP), ("lossguard read", LOSSGUARD)]
    if args.before:
        # Ahead of the working directory, which `python -c` puts first on the path.
        cases.append((f"lossguard read ({args.before})", f"import sys; sys.path.insert(0, {str(args.before)!r})\n" + LOSSGUARD))
    figures = {}
    for name, code in cases:
        seconds, rss, out = measure(code.format(path=str(path)))
        figures[name] = seconds
        print(f"  {name:<40} {seconds:8.2f} s  {rss:7.0f} MB peak RSS  {out} rows")
    print(f"  lossguard / json.loads loop: {figures['lossguard read'] / figures['json.loads loop']:.1f}x the time")


if __name__ == "__main__":
    main()
