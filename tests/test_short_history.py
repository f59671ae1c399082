"""Short histories: a rule whose min_history is below its window judges a short stream against the
values there are, the seed rule still needs its 10 (the default loss-spike-short judges a run's first
points from its 4th), and a run or segment too short for every loss rule is said to be so in every
report format instead of a silent "no spike"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from lossguard.cli import main
from lossguard.detection.spikes import find_incidents
from lossguard.detection.engine import analyse_run, too_short
from lossguard.detection.rules import default_rules, load_rules, rule_from
from lossguard.detection.streams import collapse

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
    assert analysis.short == ()


@pytest.mark.parametrize("n", [9, 10, 11])
def test_the_default_rule_still_needs_ten_values(n):
    values = [1.0] * (n - 1) + [100.0]
    found = [i.step for i in find_incidents(stream_of(values), DEFAULT_LOSS_RULE, run="r")]
    assert found == ([n] if n >= 10 else [])
    assert bool(found) == seed_detect_loss_spike(values)
    assert DEFAULT_LOSS_RULE.history == 10 and DEFAULT_LOSS_RULE.least == 9


# --- "too short to judge" ---------------------------------------------------------------------


def shorts(values, rules, steps=None):
    return [(s.segment, s.first_step, s.last_step, s.points, s.held, s.needed, s.message) for s in too_short(stream_of(values, steps), rules, run="r")]


def test_a_run_shorter_than_every_loss_rule_says_so():
    assert shorts([1.0] * 3, default_rules().rules) == [(0, 1, 3, 3, 3, 4, "too short to judge spikes: 3 loss points, rules need 4")]


@pytest.mark.parametrize("n", [4, 7, 10])
def test_a_run_as_long_as_the_rule_needs_is_not_too_short(n):
    assert shorts([1.0] * n, default_rules().rules) == []


@pytest.mark.parametrize(
    "values,flagged",
    [
        pytest.param([2.77, 2.75, 2.74, 2.76, 2.73, 2.74, 2.72, 7.34], [("loss-spike-short", 8)], id="a jump after 7 steady points (an excerpt)"),
        pytest.param([1.70, 1.69, 1.71, 11.46], [("loss-spike-short", 4)], id="after 3 points"),
        pytest.param([1.70, 11.46, 1.69, 1.70], [], id="not before 3 earlier points"),
        pytest.param([2.0, 2.1, 2.0, 2.05, 3.9, 2.0], [], id="under 2x the mean of the points before"),
        pytest.param([2.0] * 9 + [4.5], [("loss-spike", 10)], id="the tenth point is the seed rule's alone"),
    ],
)
def test_a_short_run_is_judged_against_the_points_it_has(values, flagged):
    frame = pl.DataFrame(
        {"run": "r", "source": "s", "step": list(range(1, len(values) + 1)), "metric": "loss", "tag": "loss", "value": values, "wall_time": None},
        schema={"run": pl.String, "source": pl.String, "step": pl.Int64, "metric": pl.String, "tag": pl.String, "value": pl.Float64, "wall_time": pl.Float64},
    )
    analysis = analyse_run(frame, default_rules(), run="r")
    assert [(i.rule, i.step) for i in analysis.incidents] == flagged
    assert analysis.short == ()


def test_nan_does_not_count_toward_a_window_rule_history():
    assert shorts([1.0] * 3 + [math.nan] * 3, default_rules().rules)[0][-1] == "too short to judge spikes: 3 finite loss points of 6, rules need 4"


def test_the_warning_is_honest_when_one_loss_rule_can_judge_the_run():
    # A threshold needs no history: the run is judged, so it is not "too short" (the NaN rule, which
    # judges any point, is not a spike rule and never makes a run judged on its own).
    cap = rule_from({"name": "cap", "metric": "loss", "kind": "threshold", "above": 10.0})
    assert shorts([1.0] * 7, (*default_rules().rules, cap)) == []
    only_nan = tuple(r for r in default_rules().rules if r.kind == "nonfinite")
    assert shorts([1.0] * 7, only_nan) == []
    eval_only = rule_from({"name": "e", "metric": "eval_loss", "kind": "ratio"})
    assert shorts([1.0] * 7, (eval_only,)) == []


def test_the_closest_rule_is_the_one_quoted():
    rules = load_rules([Path("olmo-core")]).rules + (rule_from({"name": "r", "metric": "loss", "kind": "ratio", "window": 20}),)
    assert shorts([1.0] * 7, rules)[0][-1] == "too short to judge spikes: 7 loss points, rules need 21"


def test_a_segment_resumed_before_any_history_is_too_short_on_its_own():
    steps = list(range(1, 21)) + [1, 2, 3]  # (other values: a resume, not the same history replayed)
    assert shorts([1.0] * 20 + [1.1] * 3, default_rules().rules, steps) == [
        (1, 1, 3, 3, 3, 4, "segment resumed at step 1: too short to judge spikes: 3 loss points, rules need 4")
    ]


def test_a_resumed_segment_judged_with_the_history_it_continues_from_is_not_too_short():
    steps = list(range(1, 21)) + [15, 16, 17]
    assert shorts([1.0] * 20 + [1.1] * 3, default_rules().rules, steps) == []


def test_a_short_first_timeline_before_a_resume_is_named_by_its_steps():
    steps = [1, 2, 3, 2, 3]
    assert [s[-1] for s in shorts([1.0] * 3 + [1.1] * 2, default_rules().rules, steps)] == [
        "steps 1-3, before a resume: too short to judge spikes: 3 loss points, rules need 4",
        "segment resumed at step 2: too short to judge spikes: 3 loss points (with the history it resumes from), rules need 4",
    ]


@pytest.fixture
def runs(tmp_path):
    for name, n in (("short", 3), ("long", 30)):
        (tmp_path / name).mkdir()
        lines = (json.dumps({"step": i, "loss": 2.0 + 0.01 * i}) for i in range(1, n + 1))
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


MESSAGE = "too short to judge spikes: 3 loss points, rules need 4"


def test_json_report_lists_a_too_short_run_under_its_warnings(runs, capsys):
    assert main(["scan", str(runs), "--format", "json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_run = {r["run"]: r for r in doc["runs"]}
    assert by_run["long"]["warnings"] == []
    (warning,) = by_run["short"]["warnings"]
    assert warning == {
        "kind": "too_short", "source": str(runs / "short" / "metrics.jsonl"), "line": None, "offset": None, "message": MESSAGE,
        "metric": "loss", "segment": 0, "first_step": 1, "last_step": 3, "points": 3, "held": 3, "needed": 4,
    }
    assert doc["summary"]["warnings"] == 1 and doc["warnings"] == []


@pytest.mark.parametrize(
    "fmt,row,warning",
    [
        pytest.param("table", "too short to judge", f"  short: {MESSAGE}", id="table"),
        pytest.param("markdown", "| short | jsonl | 3 | 3 | 0 | - | too short to judge |", f"- `short: {MESSAGE}`", id="markdown"),
        pytest.param("html", '<td class="n">0</td><td class="n">-</td><td>too short to judge</td>', f"<li><code>short: {MESSAGE}</code></li>", id="html"),
    ],
)
def test_every_report_for_people_says_which_run_was_too_short(runs, capsys, fmt, row, warning):
    assert main(["scan", str(runs), "--format", fmt, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert row in out and warning in out
    assert out.count("too short to judge spikes") == 1  # the long run is judged: nothing said of it


def test_a_too_short_run_is_no_read_problem_for_strict(runs):
    assert main(["scan", str(runs), "--strict", "--quiet"]) == 0


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
