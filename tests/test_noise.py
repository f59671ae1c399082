"""A run too noisy for its loss rule is said to be, once, with the preset that fits it: on the runs
the real trainers wrote (a small MLP's per-batch loss moves 2x between batches), never on the
corpus's real runs nor the sample runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lossguard.cli import main
from lossguard.detection.noise import Noisy, fold, noisy, spread_before
from lossguard.model import Incident

from .conftest import CORPUS, FIXTURES

REAL = FIXTURES / "real_trainers"


def _scan(capsys, *paths, fmt: str = "json"):
    code = main(["scan", *map(str, paths), "--format", fmt, "--quiet"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if fmt == "json" else out)


def _noisy(run: dict) -> list[dict]:
    return [w for w in run["warnings"] if w["kind"] == "noisy"]


def test_a_small_models_lr_jump_run_is_noisy_and_the_preset_named_keeps_the_jump_alone(capsys):
    _, doc = _scan(capsys, REAL / "lightning_lr_jump" / "csv")
    (run,) = doc["runs"]
    (note,) = _noisy(run)
    assert note["rule"] == "loss-spike" and note["firings"] == sum(1 for s in run["spikes"] if s["rule"] == "loss-spike") >= 20
    assert note["points"] == 700 and note["per_1000"] > 20
    assert [o["step"] for o in note["outside"]] == [398]  # the LR jump's 43.9x, the rest is noise
    assert note["preset"] == "llm-foundry" and note["preset_raises"] == 1
    assert "--rules llm-foundry" in note["message"]
    # What the note promises holds: the preset it names flags the jump and nothing else on this run.
    _, with_preset = _scan(capsys, REAL / "lightning_lr_jump" / "csv", "--rules", "llm-foundry")
    assert [(s["metric"], s["step"]) for s in with_preset["runs"][0]["spikes"] if s["metric"] == "loss"] == [("loss", 401)]


def test_the_clean_control_run_is_noisy_with_nothing_outside_its_noise(capsys):
    _, doc = _scan(capsys, REAL / "hf_clean" / "output")
    (note,) = _noisy(doc["runs"][0])
    assert note["outside"] == [] and note["preset_raises"] == 0
    assert "nothing stands outside that noise" in note["message"]


def test_the_table_says_it_among_its_warnings(capsys):
    _, out = _scan(capsys, REAL / "hf_clean" / "output", fmt="table")
    assert "output: noisy for its rule: loss-spike fired 27 times in 700 loss points (38.6 per 1,000)" in out


@pytest.mark.parametrize("where", [CORPUS, FIXTURES / "runs"], ids=["corpus", "sample runs"])
def test_no_real_run_of_the_corpus_nor_sample_run_is_called_noisy(capsys, where):
    _, doc = _scan(capsys, where)
    assert [r["run"] for r in doc["runs"] if _noisy(r)] == []


def _spike(step: int, ratio: float) -> Incident:
    return Incident(run="r", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=step, peak_step=step,
                    end_step=step + 1, value=2.0 * ratio, baseline=2.0, threshold=4.0, points=1, causes=())


@pytest.mark.parametrize(
    "ratios,points,said",
    [
        pytest.param([2.1] * 4, 700, False, id="four firings: too few to call it noise"),
        pytest.param([2.1] * 5, 2000, False, id="2.5 per 1,000 points: a rare firing"),
        pytest.param([2.1] * 5, 700, True, id="7.1 per 1,000 points: noisy"),
    ],
)
def test_a_run_is_noisy_from_five_firings_and_five_per_thousand_points(ratios, points, said):
    incidents = [_spike(10 * k, r) for k, r in enumerate(ratios, 1)]
    note = noisy("r", incidents, points=points, interval=1.0, presets=(), judged_with=lambda name: (), loss=_jumpy(points))
    assert (note is not None) == said
    if note is not None:
        assert isinstance(note, Noisy) and note.preset is None and "no preset raises fewer alarms" in note.message


def test_the_presets_judged_for_the_note_are_the_packaged_ones_whatever_folders_the_scan_runs_beside(tmp_path, capsys, monkeypatch):
    # A folder named like a preset where the command runs (a Megatron-LM checkout's `megatron/`) is
    # the user's, not the preset: the note is still made, from the package's presets.
    import shutil

    for name in ("megatron", "lightning", "olmo-core", "llm-foundry", "metaseq"):
        (tmp_path / name).mkdir()
    shutil.copytree(REAL / "hf_clean" / "output", tmp_path / "lightning" / "output")
    monkeypatch.chdir(tmp_path)
    code, doc = _scan(capsys, "lightning")
    (note,) = _noisy(doc["runs"][0])
    assert code == 1 and note["preset"] == "llm-foundry"


def _jumpy(points: int, *, moves: float = 1.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A loss that moves by about `moves`x from one point to the next (a small model's per-batch loss)."""
    rng = np.random.default_rng(seed)
    return np.arange(points), 0.3 * np.exp(rng.normal(0.0, np.log(moves), points))


def _flat(points: int) -> tuple[np.ndarray, np.ndarray]:
    """A smooth loss with 1% noise (the synthetic runs')."""
    rng = np.random.default_rng(0)
    return np.arange(points), 2.0 + rng.normal(0.0, 0.02, points)


def test_frequent_spikes_on_a_flat_loss_are_no_noise_for_scan():
    # Ten 2.5x spikes in 700 points is the rate of a noisy run, but a flat loss never moves 2.5x by
    # itself: they are incidents, and the run is not called noisy.
    incidents = [_spike(60 * k, 2.5) for k in range(1, 11)]
    assert noisy("r", incidents, points=700, interval=1.0, presets=(), judged_with=lambda name: (), loss=_flat(700)) is None
    assert noisy("r", incidents, points=700, interval=1.0, presets=(), judged_with=lambda name: (), loss=_jumpy(700)) is not None


@pytest.mark.parametrize(
    "loss,ratio,earlier,folded",
    [
        pytest.param("jumpy", 2.2, [], True, id="a first 2.2x firing on a loss that moves 1.5x a point: noise"),
        pytest.param("jumpy", 2.2, [2.1, 2.5, 2.0], True, id="like the earlier firings: noise"),
        pytest.param("jumpy", 9.0, [2.1, 2.5, 2.0], False, id="4x the usual firing: alerted"),
        pytest.param("jumpy", 30.0, [], False, id="far beyond the spread (an LR jump's 30x): alerted"),
        pytest.param("jumpy", None, [], False, id="a NaN: alerted"),
        pytest.param("flat", 2.2, [], False, id="a 2.2x spike on a flat loss: alerted"),
        pytest.param("flat", 2.2, [2.2] * 20, False, id="the twentieth of its kind on a flat loss: still alerted"),
        pytest.param("short", 2.2, [], False, id="fewer than nine points before it: no spread, alerted"),
    ],
)
def test_the_daemon_folds_a_firing_only_within_the_runs_own_noise(loss, ratio, earlier, folded):
    steps, values = {"jumpy": _jumpy(300), "flat": _flat(300), "short": _jumpy(5)}[loss]
    inc = _spike(len(steps), 2.0) if ratio is None else _spike(len(steps), ratio)
    if ratio is None:
        inc = Incident(run="r", metric="loss", rule="loss-spike", kind="nonfinite", severity="critical", step=len(steps),
                       peak_step=len(steps), value=float("nan"), baseline=None, threshold=None)
    spread = spread_before(steps, values, inc.step)
    assert fold(inc, earlier=[_spike(10 * k, r) for k, r in enumerate(earlier, 1)], spread=spread) is folded
