"""Spike rules on streams: the seed's rule exactly, every kind, incidents, resumes and duplicates."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from lossguard.detection import kinds
from lossguard.detection.spikes import find_incidents
from lossguard.detection.engine import analyse_run
from lossguard.detection.kinds import Judgement, Rule
from lossguard.ingest.reader import ReadOptions, read_paths
from lossguard.detection.rules import RuleSet, default_rules, rule_from
from lossguard.detection.streams import by_metric, collapse
from lossguard.validate import spec

from . import synth
from .conftest import CORPUS


def seed_detect_loss_spike(losses, threshold=2.0):
    """../shared/seed/training_optimization.py's rule, minus its prints."""
    if len(losses) < 10:
        return False
    recent_avg = np.mean(losses[-10:-1])
    return losses[-1] > threshold * recent_avg


DEFAULT_LOSS_RULE = next(r for r in default_rules().rules if r.name == "loss-spike")


def rule(**kw):
    kw.setdefault("name", "r")
    kw.setdefault("metric", "loss")
    return rule_from(kw)


def stream_of(values, steps=None):
    steps = list(range(1, len(values) + 1)) if steps is None else steps
    return collapse(pl.DataFrame({"step": steps, "value": values}, schema={"step": pl.Int64, "value": pl.Float64}))


def flagged_steps(values, r, steps=None):
    """Steps the rule flags, point by point (an incident's flagged points, not only its first)."""
    from lossguard.detection.spikes import _judge
    from lossguard.detection.streams import segments_with_history

    pts = stream_of(values, steps)
    if r.finite_only:
        pts = pts.filter(pl.col("value").is_finite())
    units = segments_with_history(pts, r.lookback)
    flagged, _ = _judge(units, r)
    return units.get_column("step").gather(flagged.get_column("i")).to_list()


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=0, max_size=40))
def test_default_rule_flags_exactly_what_the_seed_function_flags(values):
    flagged = set(flagged_steps(values, DEFAULT_LOSS_RULE)) if values else set()
    for n in range(1, len(values) + 1):
        assert (n in flagged) == bool(seed_detect_loss_spike(values[:n])), (n, values[:n])


def test_seed_example_is_one_incident():
    losses = [0.5, 0.48, 0.47, 0.46, 0.45, 0.44, 0.43, 0.42, 0.41, 0.40, 1.2]
    (inc,) = find_incidents(stream_of(losses), DEFAULT_LOSS_RULE, run="r")
    assert (inc.step, inc.peak_step, inc.value) == (11, 11, 1.2)
    assert inc.baseline == pytest.approx(np.mean(losses[1:10]))
    assert inc.ratio == pytest.approx(1.2 / np.mean(losses[1:10]))
    assert inc.end_step is None  # the log ends at the spike: still open


def test_consecutive_flagged_points_are_one_incident_that_recovers():
    values = [1.0] * 20 + [3.0, 3.5, 2.5] + [1.0] * 10
    (inc,) = find_incidents(stream_of(values), DEFAULT_LOSS_RULE, run="r")
    assert (inc.step, inc.peak_step, inc.value) == (21, 22, 3.5)
    assert inc.end_step == 24
    assert inc.points >= 1


def test_nan_does_not_blind_the_ratio_rule_and_is_caught_by_nonfinite():
    values = [1.0] * 12 + [math.nan] + [1.0, 3.0] + [1.0] * 5
    ratio_incidents = find_incidents(stream_of(values), DEFAULT_LOSS_RULE, run="r")
    assert [i.step for i in ratio_incidents] == [15]
    nonfinite = next(r for r in default_rules().rules if r.name == "loss-nonfinite")
    (nan_inc,) = find_incidents(stream_of(values), nonfinite, run="r")
    assert nan_inc.step == 13 and math.isnan(nan_inc.value) and nan_inc.end_step == 14


def test_nan_that_never_recovers_stays_open():
    nonfinite = next(r for r in default_rules().rules if r.name == "loss-nonfinite")
    (inc,) = find_incidents(stream_of([1.0] * 5 + [math.nan] * 5), nonfinite, run="r")
    assert inc.step == 6 and inc.end_step is None


def test_rewound_steps_start_a_new_segment_without_repeating_the_incident():
    steps = list(range(1, 31)) + list(range(15, 31))
    values = [1.0] * 20 + [3.0] + [1.0] * 9 + [1.0] * 5 + [3.0] + [1.0] * 10  # the replay spikes at step 20 again
    incidents = find_incidents(stream_of(values, steps), DEFAULT_LOSS_RULE, run="r")
    assert [i.step for i in incidents] == [21, 20]
    # A rewind alone raises nothing: the same steps replayed calmly.
    calm = [1.0] * 30 + [1.0] * 16
    assert find_incidents(stream_of(calm, steps), DEFAULT_LOSS_RULE, run="r") == []


def test_replayed_spike_at_the_same_step_is_not_raised_twice():
    steps = list(range(1, 31)) + list(range(15, 31))
    values = [1.0] * 20 + [3.0] + [1.0] * 9 + [1.0] * 6 + [3.0] + [1.0] * 9
    incidents = find_incidents(stream_of(values, steps), DEFAULT_LOSS_RULE, run="r")
    assert [i.step for i in incidents] == [21]


def test_resumed_segment_continues_its_window_from_the_matching_step():
    # After the rewind to step 15 the window holds steps 6..14 of the first timeline: a spike at the
    # replay's second point is judged against them, not skipped for lack of history.
    steps = list(range(1, 21)) + list(range(15, 25))
    values = [1.0] * 20 + [1.0, 2.5] + [1.0] * 8
    assert [i.step for i in find_incidents(stream_of(values, steps), DEFAULT_LOSS_RULE, run="r")] == [16]


def test_duplicate_rows_of_one_step_collapse_to_one_point():
    steps = [s for s in range(1, 21) for _ in range(4)]  # four ranks print each step
    values = [1.0] * 80
    values[-4:] = [3.0] * 4
    pts = stream_of(values, steps)
    assert pts.height == 20
    assert [i.step for i in find_incidents(pts, DEFAULT_LOSS_RULE, run="r")] == [20]


def test_lr_decay_drop_and_steep_early_descent_are_not_spikes():
    t = np.arange(1, 2001)
    loss = 10 * np.exp(-t / 50) + 2.0
    loss[1000:] *= 0.5  # a step decay of the LR drops the loss sharply
    frame = synth.long_frame("clean")
    assert find_incidents(stream_of(list(loss)), DEFAULT_LOSS_RULE, run="r") == []
    assert analyse_run(frame, default_rules(), run="clean").incidents == ()


@pytest.mark.parametrize(
    "kw,values,expected",
    [
        pytest.param(dict(kind="zscore", k=6, window=20), [1.0 + 0.01 * (i % 3) for i in range(30)] + [1.5] + [1.0] * 5, [31], id="zscore 6 sigma"),
        pytest.param(dict(kind="ewm", factor=1.5, alpha=0.1), [1.0] * 30 + [1.6] + [1.0] * 5, [31], id="ewm ratio"),
        pytest.param(dict(kind="threshold", above=10.0, patience=3), [1.0] * 5 + [11.0, 12.0] + [1.0] + [11.0, 12.0, 13.0] + [1.0] * 5, [9], id="threshold with patience"),
        pytest.param(dict(kind="threshold", below=0.5), [1.0] * 5 + [0.1] + [1.0] * 5, [6], id="threshold below"),
        pytest.param(dict(kind="sustained", factor=2.0, window=10, patience=4), [1.0] * 20 + [4.0] * 3 + [1.0] * 5 + [4.0] * 6 + [1.0] * 5, [29], id="sustained needs patience"),
        pytest.param(dict(kind="ratio", factor=10.0, window=5, baseline="max"), [1.0, 2.0, 1.0, 1.0, 1.0, 25.0] + [1.0] * 5, [6], id="ratio to the window max"),
        pytest.param(dict(kind="ratio", factor=10.0, window=5, baseline="max"), [1.0, 2.0, 1.0, 1.0, 1.0, 15.0] + [1.0] * 5, [], id="under 10x the window max"),
        pytest.param(dict(kind="ratio", factor=10.0, window=5, baseline="mean"), [1.0, 2.0, 1.0, 1.0, 1.0, 15.0] + [1.0] * 5, [6], id="over 10x the window mean"),
        pytest.param(dict(kind="nonfinite"), [1.0, math.inf, 1.0, 1.0, 1.0, -math.inf, 1.0, 1.0, 1.0], [2, 6], id="inf is non-finite"),
    ],
)
def test_rule_kinds(kw, values, expected):
    incidents = find_incidents(stream_of(values), rule(**kw), run="r")
    assert [i.step for i in incidents] == expected


@pytest.fixture
def scratch_kinds():
    """Kinds a test defines are forgotten after it: the others see only the shipped ones."""
    shipped = dict(kinds.RULE_KINDS)
    yield
    kinds._registered.clear()
    kinds._registered.update(shipped)


def test_a_kind_is_one_class_that_rules_files_name_and_detection_judges(scratch_kinds):
    @dataclass(frozen=True, kw_only=True)
    class JumpRule(Rule):
        """value > factor x the value before it."""

        kind: str = "jump"
        factor: float = field(default=2.0, metadata=spec(float, gt=0))
        finite_only = True

        @property
        def lookback(self) -> int:
            return 1

        def judgement(self, v, per_unit):
            baseline = per_unit(v.shift(1))
            return Judgement(condition=v > baseline * self.factor, baseline=baseline, limit=baseline * self.factor)

    jump = rule_from({"name": "j", "metric": "loss", "kind": "jump", "factor": 3.0})
    assert isinstance(jump, JumpRule)
    (inc,) = find_incidents(stream_of([1.0, 1.0, math.nan, 4.0, 1.0, 2.0, 1.0, 1.0, 1.0]), jump, run="r")
    assert (inc.step, inc.kind, inc.baseline, inc.threshold, inc.end_step) == (4, "jump", 1.0, 3.0, 5)
    with pytest.raises(ValueError, match=r"factor: Input should be greater than 0 \(got 0\)"):
        rule_from({"name": "j", "metric": "loss", "kind": "jump", "factor": 0})
    with pytest.raises(ValueError, match=r"unknown kind 'jumps'; one of: ratio, zscore, .*, jump, crash$"):  # (the metric kinds in their order, then crash)
        rule_from({"name": "j", "metric": "loss", "kind": "jumps"})


def test_a_second_class_cannot_take_a_kind_name_already_registered(scratch_kinds):
    with pytest.raises(TypeError, match="kind 'ratio' must be a new, non-empty name"):

        class AnotherRatio(Rule):
            kind: str = "ratio"


def test_cooldown_folds_a_close_second_spike_into_the_first():
    values = [1.0] * 20 + [3.0] + [1.0] * 5 + [3.0] + [1.0] * 10
    assert len(find_incidents(stream_of(values), rule(kind="ratio", factor=2.0, window=9), run="r")) == 2
    (inc,) = find_incidents(stream_of(values), rule(kind="ratio", factor=2.0, window=9, cooldown=10), run="r")
    assert inc.points == 2 and inc.last_flagged_step == 27


def test_runs_glob_limits_a_rule():
    rules = RuleSet((rule(kind="nonfinite", runs="prod/*"),), "test")
    frame = synth.long_frame("numerical_instability", run="dev/x")
    assert analyse_run(frame, rules, run="dev/x").incidents == ()
    assert len(analyse_run(frame.with_columns(pl.lit("prod/x").alias("run")), rules, run="prod/x").incidents) == 1


def test_min_history_holds_the_rule_back():
    values = [1.0, 1.0, 1.0, 5.0] + [1.0] * 3
    assert find_incidents(stream_of(values), rule(kind="ratio", window=3), run="r")[0].step == 4
    assert find_incidents(stream_of(values), rule(kind="ratio", window=3, min_history=6), run="r") == []


def healthy_loss(n, *, seed=0):
    """A noisy decaying loss, like synth's: 6.0 above its floor of 2.0 at first, noise of 1% of the floor."""
    t = np.arange(n)
    return 2.0 + 6.0 * np.exp(-t / 150) + np.random.default_rng(seed).normal(0, 0.02, n)


def relative_slopes(values, window):
    """Each full window's least-squares slope over its mean, computed directly (window k ends at k + window - 1)."""
    x = np.arange(window) - (window - 1) / 2
    windows = sliding_window_view(np.asarray(values, dtype=float), window)
    return windows @ x / (x @ x) / windows.mean(axis=1)


def test_slope_flags_a_steady_climb_that_the_ratio_rule_misses():
    loss = healthy_loss(600)
    loss[400:] *= 1.015 ** np.arange(200)  # 1.5% a point: never 2x the previous nine
    slope = rule(kind="slope")
    assert find_incidents(stream_of(list(loss)), DEFAULT_LOSS_RULE, run="r") == []
    (inc,) = find_incidents(stream_of(list(loss)), slope, run="r")
    first = 50 + int(np.flatnonzero(relative_slopes(loss, 50) > 0.01)[0])
    assert 401 < first <= 450 and inc.step == first
    assert inc.baseline == pytest.approx(loss[first - 50 : first].mean())
    assert inc.threshold == pytest.approx(inc.baseline * (1 + 0.01 * 49 / 2))
    assert (inc.peak_step, inc.end_step) == (600, None)  # still climbing when the log ends


def test_slope_incident_closes_when_the_climb_stops_though_the_loss_stays_high():
    loss = np.concatenate([np.full(100, 2.0), 2.0 * 1.02 ** np.arange(1, 41), np.full(100, 2.0 * 1.02**40)])
    (inc,) = find_incidents(stream_of(list(loss)), rule(kind="slope", window=20), run="r")
    flagged = np.flatnonzero(relative_slopes(loss, 20) > 0.01) + 20
    assert inc.step == flagged[0] and inc.last_flagged_step == flagged[-1] and inc.end_step == flagged[-1] + 1
    assert 140 < inc.end_step <= 160  # the plateau's window no longer rises...
    assert loss[inc.end_step - 1] > inc.threshold  # ...though its values are still above the limit


@pytest.mark.parametrize(
    "relpath",
    [
        "hf_trainer/whisper_tiny_nbailab_trainer_state.json",
        "hf_trainer/mistral7b_lora_translator_trainer_state.json",
        "hf_trainer/t5_summarization_trainer_state.json",
        "jsonl/luojiu_7b_llamafactory_pretrain_trainer_log.jsonl",
        "jsonl/qwen25_7b_medical_llamafactory_trainer_log.jsonl",
        "csv/slm_training_lightning_v0_metrics.csv",
        "tfevents/lstm_textgen_lightning",
        "tfevents/satd_hmer_lightning_lr_sgd",
        "other/modded_nanogpt_scaleup1b_87bd51fd_steps.log",
        "other/build_nanogpt_agndm_bigger_254M.log",
    ],
)
def test_slope_with_its_defaults_is_silent_on_the_clean_runs_of_the_corpus(relpath):
    frame, _, _ = read_paths([CORPUS / relpath], ReadOptions())
    loss = by_metric(frame, ("loss",))["loss"]
    assert loss.height >= 240
    assert find_incidents(loss, rule(kind="slope"), run="r") == []


def test_slope_flags_the_slow_divergence_of_the_megatron_perf_log():
    # SOURCES.md: the loss decays to 11.6 by iteration 31, then climbs steadily back to 20.4 by 62.
    # The seed's rule says nothing: the blow-up at iteration 3 comes before its ten points of history,
    # and the climb never doubles the mean of nine.
    frame, _, _ = read_paths([CORPUS / "megatron/bigscience_meg_ds_3d_gpt2_perf_n16_ds_off.log"], ReadOptions())
    loss = by_metric(frame, ("loss",))["loss"]
    assert find_incidents(loss, DEFAULT_LOSS_RULE, run="r") == []
    (inc,) = find_incidents(loss, rule(kind="slope", window=20), run="r")
    assert 31 < inc.step < 50 and (inc.peak_step, inc.end_step) == (62, None)


def test_slope_waits_for_min_history():
    loss = [2.0] * 5 + [2.0 * 1.05**k for k in range(1, 40)]
    assert find_incidents(stream_of(loss), rule(kind="slope", window=5), run="r")[0].step == 7
    assert find_incidents(stream_of(loss), rule(kind="slope", window=5, min_history=30), run="r")[0].step == 30


def test_slope_of_a_resumed_segment_continues_from_the_timeline_it_replaces():
    steps = list(range(1, 61)) + list(range(55, 81))
    dip = [1.0] * 55 + [0.5] * 5  # the first timeline dips at 56..60; the replay from 55 does not
    calm = stream_of(dip + [1.0] * 26, steps)
    assert find_incidents(calm, rule(kind="slope", window=10), run="r") == []  # the dip then 1.0 would look like one
    climbing = stream_of(dip + [1.0 * 1.04**k for k in range(1, 27)], steps)
    (inc,) = find_incidents(climbing, rule(kind="slope", window=10), run="r")
    # Judged on steps 46..54 of the first timeline: flagged before the replay has ten points of its own.
    assert inc.segment == 1 and 55 < inc.step < 64
    # Rewound to step 3, the replay has two points of history: its windows fill with its own points,
    # never with the dip that ended the timeline it replaces (min_history 1: nothing else holds it back).
    early = stream_of([1.0] * 25 + [0.5] * 5 + [1.0] * 38, list(range(1, 31)) + list(range(3, 41)))
    assert find_incidents(early, rule(kind="slope", window=10, min_history=1), run="r") == []


def test_slope_is_exact_however_large_the_step_numbers():
    # A loss whose trend crosses the rate hundreds of times, some windows within 1e-5 of it: the
    # flags must be those of the slope computed directly, with steps near 1e15 (x the step itself
    # would lose the slope's digits to cancellation).
    k = np.arange(20_000)
    loss = 3.0 + 0.8 * np.sin(k / 8) + np.random.default_rng(3).normal(0, 0.05, k.size)
    steps = [10**15 + 1000 * i for i in range(k.size)]
    expected = np.asarray(steps)[29:][relative_slopes(loss, 30) > 0.01].tolist()
    assert len(expected) > 5000
    assert flagged_steps(list(loss), rule(kind="slope", window=30), steps) == expected


# --- NaN under rules that compare ---------------------------------------------------------------

TURNS_NAN = [3.0 - 0.001 * k for k in range(300)] + [12.0, 12.0] + [math.nan] * 20
ALL_NAN_AFTER = [3.0 - 0.001 * k for k in range(300)] + [math.nan] * 20


@pytest.mark.parametrize("values", [TURNS_NAN, ALL_NAN_AFTER], ids=["above the cap, then NaN", "NaN at once"])
def test_a_loss_that_turns_nan_and_stays_nan_is_one_incident_under_the_llm_foundry_preset(values):
    from pathlib import Path

    from lossguard.detection.rules import load_rules

    found = [i for r in load_rules([Path("llm-foundry")]).rules for i in find_incidents(stream_of(values), r, run="r")]
    (inc,) = found
    assert (inc.rule, inc.step, inc.end_step) == ("llm-foundry-high-loss", 301, None)
    assert inc.points == len(values) - 300 - 3  # every point from the 4th beyond the cap on


@pytest.mark.parametrize("preset", ["default", "llm-foundry", "lightning", "megatron", "metaseq", "olmo-core"])
@pytest.mark.parametrize("values", [TURNS_NAN, ALL_NAN_AFTER, TURNS_NAN[:-19] + [2.7] * 10 + [math.nan] * 5], ids=["turns NaN", "NaN at once", "NaN, back, NaN"])
def test_no_rule_opens_incidents_that_overlap(preset, values):
    from pathlib import Path

    from lossguard.detection.rules import load_rules

    rules = default_rules() if preset == "default" else load_rules([Path(preset)])
    for r in rules.rules:
        found = find_incidents(stream_of(values), r, run="r")
        for before, after in zip(found, found[1:]):
            assert before.end_step is not None and before.end_step <= after.step, (r.name, before, after)


@pytest.mark.parametrize(
    "params,values,expected",
    [
        pytest.param({"above": 10.0}, [5.0, 5.0, math.nan, math.nan, 5.0, 5.0, 5.0], [(3, 5)], id="above: NaN is over the cap until it clears"),
        pytest.param({"below": 1.0}, [5.0, 5.0, math.nan, math.nan, 5.0, 5.0, 5.0], [(3, 5)], id="below: NaN is under the floor too"),
        pytest.param({"above": 10.0, "patience": 3}, [5.0, 12.0, math.nan, 12.0, 5.0, 5.0, 5.0], [(2, 5)], id="patience counts NaN as beyond"),
        pytest.param({"above": 10.0}, [5.0, math.inf, 5.0, 5.0, 5.0], [(2, 3)], id="Inf is above"),
    ],
)
def test_a_threshold_takes_nan_as_outside_its_bound_to_flag_and_to_recover(params, values, expected):
    r = rule(kind="threshold", recovery=1, **params)
    assert [(i.step, i.end_step) for i in find_incidents(stream_of(values), r, run="r")] == expected


def test_an_incident_never_begins_inside_the_one_before_it():
    # A sustained rule's onset reaches `patience` points back, and its recovery compares with the
    # limit from before the incident: with the baseline moved since, the next onset reached back
    # into the points that closed the last one (found by a search: (4, 8) then (7, open)).
    r = rule(kind="sustained", factor=1.5, window=1, patience=2, recovery=3)
    values = [5.0, 20.0, 5.0, 10.0, 20.0, 1.0, 40.0, 5.0, 5.0, 1.0, 2.0]
    assert [(i.step, i.end_step) for i in find_incidents(stream_of(values), r, run="r")] == [(4, 8), (8, None)]
