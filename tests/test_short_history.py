"""Short histories (issue 14, item 4): a rule whose min_history is below its window judges a short
stream against the values there are, and the seed rule still needs its 10."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from lossguard.detect import find_incidents
from lossguard.engine import analyse_run
from lossguard.rules import load_rules, rule_from
from lossguard.streams import collapse

from .test_detect import DEFAULT_LOSS_RULE, seed_detect_loss_spike


def stream_of(values, steps=None):
    steps = list(range(1, len(values) + 1)) if steps is None else steps
    return collapse(pl.DataFrame({"step": steps, "value": values}, schema={"step": pl.Int64, "value": pl.Float64}))


def steps_flagged(values, **params):
    rule = rule_from({"name": "r", "metric": "loss", **params})
    return [i.step for i in find_incidents(stream_of(values), rule, run="r")]


RATIO = {"kind": "ratio", "factor": 3.0, "window": 10}
ZSCORE = {"kind": "zscore", "k": 6.0, "window": 128}


@pytest.mark.parametrize(
    "params,values,flagged",
    [
        pytest.param({**RATIO, "min_history": 2}, [2.0, 9.0], [2], id="ratio, min_history 2: the second value against the first"),
        pytest.param({**RATIO, "min_history": 3}, [2.0, 9.0, 2.0, 2.0], [], id="ratio, min_history 3: not at the second value"),
        pytest.param({**RATIO, "min_history": 3}, [2.0, 2.0, 9.0], [3], id="ratio, min_history 3: at the third"),
        pytest.param({**RATIO, "min_history": 5}, [2.0, 2.1, 1.9, 2.0, 9.0], [5], id="ratio, min_history 5: a spike after 4 points"),
        pytest.param({**RATIO}, [2.0, 2.1, 1.9, 2.0, 9.0], [], id="ratio without min_history: needs its full window"),
        pytest.param({**ZSCORE, "min_history": 4}, [1.0, 1.1, 0.9, 5.0], [4], id="zscore, min_history 4: mean and std of 3 values"),
        pytest.param({**ZSCORE, "min_history": 5}, [1.0, 1.1, 0.9, 5.0, 1.0], [], id="zscore, min_history 5: not at the fourth value"),
        pytest.param({**ZSCORE, "min_history": 2}, [1.0, 5.0, 1.0], [], id="zscore, min_history 2: a std needs 2 values before"),
        pytest.param({**ZSCORE, "min_history": 2}, [1.0, 1.2, 5.0], [3], id="zscore, min_history 2: so the third is the first judged"),
        pytest.param({**ZSCORE}, [1.0, 1.1, 0.9, 5.0], [], id="zscore without min_history: needs its full window"),
    ],
)
def test_a_window_rule_judges_from_min_history_on_against_the_values_there_are(params, values, flagged):
    assert steps_flagged(values, **params) == flagged


def test_a_short_window_compares_with_the_mean_of_every_value_before_it():
    (inc,) = find_incidents(stream_of([2.0, 4.0, 20.0]), rule_from({"name": "r", "metric": "loss", **RATIO, "min_history": 2}), run="r")
    assert (inc.step, inc.baseline, inc.threshold) == (3, 3.0, 9.0)


def test_once_the_window_is_full_it_slides_as_before():
    # Past `window` values the short history no longer matters: the baseline is the last 3 only.
    values = [100.0, 100.0, 100.0, 1.0, 1.0, 1.0, 5.0]
    assert steps_flagged(values, kind="ratio", factor=3.0, window=3, min_history=2) == [7]
    assert steps_flagged(values, kind="ratio", factor=3.0, window=3) == [7]


@pytest.mark.parametrize("preset,rule", [("lightning", "lightning-spike"), ("megatron", "megatron-spiky-loss")])
def test_presets_with_a_short_min_history_flag_a_spike_after_four_points(preset, rule):
    rules = load_rules([Path(preset)])
    frame = pl.DataFrame(
        {"run": "r", "source": "s", "step": [1, 2, 3, 4, 5], "metric": "loss", "tag": "loss", "value": [2.0, 2.1, 2.0, 2.05, 40.0], "wall_time": None},
        schema={"run": pl.String, "source": pl.String, "step": pl.Int64, "metric": pl.String, "tag": pl.String, "value": pl.Float64, "wall_time": pl.Float64},
    )
    analysis = analyse_run(frame, rules, run="r")
    assert [(i.rule, i.step) for i in analysis.incidents] == [(rule, 5)]


@pytest.mark.parametrize("n", [9, 10, 11])
def test_the_default_rule_still_needs_ten_values(n):
    values = [1.0] * (n - 1) + [100.0]
    found = [i.step for i in find_incidents(stream_of(values), DEFAULT_LOSS_RULE, run="r")]
    assert found == ([n] if n >= 10 else [])
    assert bool(found) == seed_detect_loss_spike(values)
    assert DEFAULT_LOSS_RULE.history == 10 and DEFAULT_LOSS_RULE.least == 9


def test_the_daemon_judges_a_cut_tail_on_full_windows_only():
    # The daemon keeps a tail of each stream; a short window is the stream's own start only. Judged on
    # the two 300s its tail happens to begin with, the first 400 after them looked like a spike that
    # never recovered, and swallowed the real one at 700 (the audit sees ten 400s in that window).
    from .test_incremental import _judged_in_passes

    values = [400.0] * 20 + [300.0, 300.0] + [400.0] * 18 + [700.0] + [400.0] * 5
    rule = rule_from({"name": "r", "metric": "loss", "kind": "ratio", "factor": 1.1, "window": 12, "min_history": 2})
    (whole,) = find_incidents(stream_of(values), rule, run="r")
    assert whole.step == 41
    assert _judged_in_passes(values, [32], rule, spare=False) == [whole]
