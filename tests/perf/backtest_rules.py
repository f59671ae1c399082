"""Backtest rules on real runs: alerts per 10k logged steps of each run, for the default rules, each
preset, and candidate grad-norm rules. A run a human described a spike in (tests/fixtures/corpus/
SOURCES.md) should alert; a clean one should stay at or below 1 alert per 10k logged steps.

    python tests/perf/backtest_rules.py [PATH ...] [--candidates] [--markdown] [--divergence]

Default PATHs: tests/fixtures/corpus and tests/fixtures/runs. With --candidates, also a grid of
grad-norm ratio rules (median baseline), to choose the default one; --markdown prints docs/rules.md's
table. The column "default w/o divergence" is the default rules without loss-divergence (what the
defaults were before it). With --divergence, the slow divergences other tools' tests are made of (a
compounding 1.08x a step, linear climbs of 2x), beside runs that must stay quiet (a long plateau, a
warm-up bump, a small model's noisy per-batch loss), written as CSV files and scanned: the
loss-divergence incidents each gets.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lossguard.detection.rules import RuleSet, load_rules, rule_from  # noqa: E402
from lossguard.report.audit import scan  # noqa: E402
from tests.synth import DIVERGING, divergence_cases, write_loss_csv  # noqa: E402

LABELLED = (
    "bloom176b_tr11_spike_31216", "tr8b_104b_resume_spike_17062", "tr8_104b_exp12_spike_8741_diverge_9027", "tr8_104b_exp2_glitch_6930",
    "hf-lr-too-high", "megatron-grad-explosion", "megatron-fp16-overflow", "lightning-bad-batch", "jsonl-lr-restart", "tf2-recurring-spikes",
)
"""Runs with a spike: described by a human (SOURCES.md), or made with one (the sample runs)."""
OBSERVED = ("t5_summarization", "bigscience_meg_ds_3d_gpt2_perf", "modded_nanogpt", "build_nanogpt")
"""Real runs nobody commented on, with anomalies SOURCES.md notes as "observed by us" (isolated
grad-norm spikes, a perf test's early blow-up, per-step blips): neither clean nor labelled."""


def candidates() -> dict[str, RuleSet]:
    grid = {}
    for window in (20, 50):
        for factor in (3.0, 5.0, 10.0):
            rule = rule_from({"name": "grad-norm-spike", "metric": "grad_norm", "kind": "ratio", "baseline": "median",
                              "window": window, "factor": factor, "severity": "warning"})
            grid[f"gn median{window} x{factor:g}"] = RuleSet((rule,), origin="backtest")
    return grid


def divergence_backtest() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for k, values in enumerate(divergence_cases().values()):
            write_loss_csv(Path(tmp) / f"case{k}" / "metrics.csv", values)
        report = scan([Path(tmp)], rules=load_rules(None))
        for k, name in enumerate(divergence_cases()):
            run = next(r for r in report.runs if r.run == f"case{k}")
            found = [i for i in run.incidents if i.rule == "loss-divergence"]
            verdict = "ok" if (len(found) == 1) == (name in DIVERGING) and len(found) <= 1 else "WRONG"
            where = ", ".join(f"step {i.step} ({i.value:.3g} vs minimum {i.baseline:.3g})" for i in found)
            print(f"{verdict:5}  {name:24}  {len(found)} incident(s)  {where}")


def per_10k(alerts: int, steps: int) -> float:
    return alerts * 10_000 / max(steps, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path, default=[REPO / "tests/fixtures/corpus", REPO / "tests/fixtures/runs"])
    ap.add_argument("--candidates", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--divergence", action="store_true")
    args = ap.parse_args()
    if args.divergence:
        divergence_backtest()
        return
    default = load_rules(None)
    sets = {"default": default, "default w/o divergence": RuleSet(tuple(r for r in default.rules if r.name != "loss-divergence"), origin="backtest")}
    for preset in sorted((REPO / "rules/presets").glob("*.toml")):
        sets[preset.stem] = load_rules([preset])
    if args.candidates:
        sets.update(candidates())
    results = {name: scan(args.paths, rules=rules) for name, rules in sets.items()}
    first = next(iter(results.values()))
    runs = [r.run for r in first.runs]
    steps = {r.run: r.analysis.steps for r in first.runs}
    labelled = {r for r in runs if any(name in r for name in LABELLED)}
    observed = {r for r in runs if any(name in r for name in OBSERVED)}
    header = ["run", "loss points", *sets]
    rows = []
    for run in runs:
        cells = [run + (" *" if run in labelled else " (o)" if run in observed else ""), str(steps[run])]
        for name in sets:
            rep = next(r for r in results[name].runs if r.run == run)
            n = len(rep.incidents)
            cells.append(f"{n} ({per_10k(n, steps[run]):.1f})" if n else "0")
        rows.append(cells)
    clean = [r for r in runs if r not in labelled and r not in observed]
    total_clean = sum(steps[r] for r in clean)
    footer = ["clean runs: alerts per 10k steps", str(total_clean)]
    for name in sets:
        n = sum(len(next(r for r in results[name].runs if r.run == run).incidents) for run in clean)
        footer.append(f"{per_10k(n, total_clean):.2f}")
    caught = ["labelled runs alerted", str(len(labelled))]
    for name in sets:
        caught.append(str(sum(1 for run in labelled if next(r for r in results[name].runs if r.run == run).incidents)))
    rows += [footer, caught]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cells in rows:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(c[i]) for c in [header, *rows]) for i in range(len(header))]
    for cells in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
    print("\n* a spike (a human described it, or the sample run was made with it); (o) anomalies observed, not described;")
    print("cells: alerts (per 10k loss points); 'clean runs' counts the rest")


if __name__ == "__main__":
    main()
