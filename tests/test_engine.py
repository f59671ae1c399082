"""The one judge (lossguard.detection.engine.judge), the incident's lossless JSON form, and the promise the
judge exists for: the daemon, fed a log in random pieces, raises what the audit of the whole log
finds."""

from __future__ import annotations

import math
import random
import shutil
import time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossguard.detection.engine import JUDGED, Seen, analyse_run, context_of, judge
from lossguard.watch.follow import Follower
from lossguard.watch.followed import offset_of
from lossguard.model import Cause, Incident, Notice
from lossguard.ingest.reader import ReadOptions, read_paths
from lossguard.detection.rules import default_rules, load_rules
from lossguard.state import State
from lossguard.detection.streams import by_metric

from .conftest import FIXTURES

numbers = st.floats(allow_nan=True, allow_infinity=True) | st.floats(min_value=-1e300, max_value=1e300)
steps = st.integers(min_value=-(2**62), max_value=2**62)
text = st.text(max_size=40)
causes = st.builds(Cause, cause=text, confidence=st.floats(0, 1), evidence=text, suggestion=text)
incidents = st.builds(
    Incident, run=text, metric=text, rule=text, kind=text, severity=text, step=steps, peak_step=steps, value=numbers,
    baseline=st.none() | numbers, threshold=st.none() | numbers, end_step=st.none() | steps,
    last_flagged_step=st.none() | steps, points=st.integers(1, 10**9), segment=st.integers(0, 10**6),
    causes=st.lists(causes, max_size=4).map(tuple),
)


def same(a: Incident, b: Incident) -> bool:
    """Equal, NaN equal to NaN (an incident's NaN value is the point of a nonfinite rule)."""
    def norm(i: Incident) -> tuple:
        return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in i.__dict__.values())

    return norm(a) == norm(b)


@given(incidents)
@settings(max_examples=300)
def test_an_incident_round_trips_through_its_json_form_losslessly(inc):
    import json

    back = Incident.from_json(json.loads(json.dumps(inc.to_json(), allow_nan=False)))
    assert same(back, inc)


@given(incidents, st.sampled_from(["opened", "updated", "resolved", "relabelled"]), text, st.none() | text)
@settings(max_examples=100)
def test_a_notice_round_trips_with_its_incident(inc, kind, source, previous):
    import json

    notice = Notice(kind, inc.run, inc, source=source, previous_cause=previous)
    back = Notice.from_json(kind, json.loads(json.dumps(notice.to_json())))
    assert same(back.incident, inc) and (back.kind, back.run, back.source, back.previous_cause) == (kind, inc.run, source, previous)


def _run(path):
    frame, _, _ = read_paths([path], ReadOptions())
    streams = by_metric(frame, JUDGED)
    return frame, streams


def test_judging_with_nothing_seen_is_the_audit():
    path = FIXTURES / "runs" / "megatron-grad-explosion"
    frame, streams = _run(path)
    found = judge(streams, context_of(frame, streams), default_rules().rules, run=".")
    assert found and found == analyse_run(frame, default_rules(), run=".").incidents
    assert all(i.causes for i in found)


def test_a_window_judged_again_raises_only_incidents_that_are_new_or_known():
    frame, streams = _run(FIXTURES / "runs" / "megatron-grad-explosion")
    rules = tuple(r for r in default_rules().rules if r.metric == "loss")
    everything = judge(streams, context_of(frame, streams), rules, run=".")
    first = everything[0]
    after = (first.last_flagged_step or first.step) + 1
    new_from = {m: after for m in JUDGED if streams[m].height}
    later = judge(streams, context_of(frame, streams), rules, run=".", seen=Seen(new_from=new_from))
    assert first.key not in {i.key for i in later} and len(later) == len(everything) - 1
    known = judge(streams, lambda: context_of(frame, streams), rules, run=".", seen=Seen(new_from=new_from, known=frozenset({(first.rule, first.step)})))
    assert first.key in {i.key for i in known}  # the state knows it: it may have grown or recovered
    assert judge(streams, lambda: pytest.fail("no context needed"), rules, run=".", seen=Seen(new_from={})) == ()


@pytest.mark.parametrize(
    "name,preset",
    [
        ("megatron-grad-explosion", None),
        ("jsonl-lr-restart", None),
        ("lightning-bad-batch", None),
        ("megatron-fp16-overflow", None),
        # Presets: min_history below the window (short windows at a stream's start only), sustained + threshold.
        ("lightning-bad-batch", "lightning"),
        ("megatron-fp16-overflow", "megatron"),
        ("megatron-grad-explosion", "llm-foundry"),
    ],
)
def test_the_daemon_fed_a_log_in_random_pieces_raises_what_the_audit_finds(tmp_path, name, preset):
    rules = default_rules() if preset is None else load_rules([Path(preset)])
    src = next(p for p in (FIXTURES / "runs" / name).rglob("*") if p.is_file())
    data = src.read_bytes()
    target = tmp_path / "runs" / name / src.name
    target.parent.mkdir(parents=True)
    target.write_bytes(b"")
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=rules, state=state, log=lambda _: None)
    follower.run_pass(0.0)
    rng, pos, now = random.Random(name), 0, 1.0
    while pos < len(data):
        n = rng.randrange(1, 20_000)
        with open(target, "ab") as fh:
            fh.write(data[pos:pos + n])
        pos, now = pos + n, now + 1
        follower.run_pass(now, {str(target)})
    # A read that outlasted a pass's budget (a loaded machine) finishes beside the passes and the
    # next pass takes it, as the daemon's next pass would: pass on until the whole file is read.
    deadline = time.monotonic() + 60
    while offset_of(state.files([str(target)])[str(target)]).offset < len(data) and time.monotonic() < deadline:
        time.sleep(0.01)
        now += 1
        follower.run_pass(now, {str(target)})
    shutil.copy(target, tmp_path / src.name)
    frame, _, _ = read_paths([tmp_path / src.name], ReadOptions())
    audit = analyse_run(frame.with_columns(pl.lit(name).alias("run")), rules, run=name).incidents
    raised = sorted((r.incident for r in _all_incidents(state, name)), key=lambda i: (i.step, i.rule))
    facts = lambda i: (i.rule, i.step, i.peak_step, i.end_step, i.points, i.segment)  # noqa: E731
    assert audit and [facts(i) for i in raised] == [facts(i) for i in audit]
    assert all(math.isclose(a.value, b.value) or (math.isnan(a.value) and math.isnan(b.value)) for a, b in zip(raised, audit))
    state.close()


def _all_incidents(state: State, run: str):
    keys = state.incident_keys(run, since=-(2**62))
    return [state.incident(run, rule, step) for rule, step in keys]
