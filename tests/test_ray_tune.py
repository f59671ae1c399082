"""Ray Tune's trial folders (ray/tune/logger/json.py: JsonLoggerCallback writes each reported result
as a JSON line to `result.json`; csv.py: CSVLoggerCallback the same results flattened with `/` to
`progress.csv`; the trial's config to `params.json`): one trial is one run, at Ray's
`training_iteration`, and its spike is found once."""

from __future__ import annotations

import csv
import json

from .conftest import run_lossguard


def _results(iterations: int = 30, spike_at: int = 20, restored_at: int = 40) -> list[dict]:
    """What a trainable reports, with the keys Tune adds (a trial restored from a checkpoint goes on
    from its iteration: here from `restored_at`)."""
    out = []
    for k in range(iterations):
        it = restored_at + k + 1
        out.append({
            "loss": (2.0 - 0.01 * k) * (3.0 if it == restored_at + spike_at else 1.0), "mean_accuracy": 0.5 + k / 100,
            "timestamp": 1_733_300_000 + k, "checkpoint_dir_name": None, "done": False, "training_iteration": it,
            "trial_id": "a1b2c_00000", "date": "2026-12-04_10-00-00", "time_this_iter_s": 1.0, "time_total_s": float(k + 1),
            "pid": 4242, "hostname": "box", "node_ip": "10.0.0.1", "config": {"lr": 0.01, "batch_size": 32},
            "time_since_restore": float(k + 1), "iterations_since_restore": k + 1,
        })
    return out


def _flat(result: dict) -> dict:
    return {f"config/{k}": v for k, v in result["config"].items()} | {k: v for k, v in result.items() if k != "config"}


def test_a_ray_tune_trial_is_one_run_at_its_training_iterations_and_its_spike_is_found_once(tmp_path):
    trial = tmp_path / "ray_results" / "train_fn_2026-12-04_10-00-00" / "train_fn_a1b2c_00000_0_lr=0.0100_2026-12-04_10-00-00"
    trial.mkdir(parents=True)
    results = _results()
    (trial / "params.json").write_text(json.dumps(results[0]["config"]))
    with open(trial / "result.json", "w") as fh:
        for r in results:
            json.dump(r, fh)
            fh.write("\n")
    with open(trial / "progress.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(_flat(results[0])))
        writer.writeheader()
        writer.writerows(_flat(r) for r in results)
    res = run_lossguard("scan", str(tmp_path / "ray_results"), "--format", "json")
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert report["run"] == "train_fn_2026-12-04_10-00-00/train_fn_a1b2c_00000_0_lr=0.0100_2026-12-04_10-00-00"
    assert (report["first_step"], report["last_step"]) == (41, 70)
    assert [(s["metric"], s["step"]) for s in report["spikes"]] == [("loss", 60)]
