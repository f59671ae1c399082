"""Silences: which notices they cover, the command an alert shows, the sender holding notices back
and reporting what is still wrong when a silence ends (real SQLite state, real JSON-lines file, the
real slack-sdk against the local Slack-like server), the CLI, and the daemon honouring a silence
added while it runs."""

from __future__ import annotations

import json
import shlex
import sqlite3
import time
from dataclasses import replace

import pytest

from lossguard.alerts.pipeline import Dispatcher
from lossguard.alerts.sinks import AlertmanagerSink, JsonlSink, SlackSink
from lossguard.alerts.slack import SlackBot
from lossguard.cli import build_parser
from lossguard.errors import UsageError
from lossguard.model import Cause, Incident, Notice
from lossguard.silences import Silence, command_for, covering, literal_glob, parse_duration, parse_until
from lossguard.state import VERSION, State

from .conftest import assert_one_error_line, run_lossguard, run_lossguard_in_process

INC = Incident(run="gpt-7b-a", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=20, peak_step=20,
               value=9.0, baseline=2.0, threshold=4.0, causes=(Cause("bad_batch", 0.6, "one step", "skip it"),))


def silence(run="*", rule=None, metric=None, cause=None, starts=0.0, ends=1000.0, ident=1) -> Silence:
    return Silence(ident, run, rule, metric, cause, starts, ends, "why")


def test_every_given_matcher_must_match_and_unset_ones_match_anything():
    opened = Notice("opened", INC.run, INC)
    assert silence(run="gpt-7b-*").matches(opened)
    assert not silence(run="gpt-13b-*").matches(opened)
    assert silence(run="gpt-*", rule="loss-*", metric="loss", cause="bad_batch").matches(opened)
    assert not silence(run="gpt-*", rule="grad-norm-spike").matches(opened)
    assert not silence(run="gpt-*", metric="grad_norm").matches(opened)
    assert not silence(run="gpt-*", cause="lr_*").matches(opened)
    assert silence(cause="unknown").matches(Notice("opened", INC.run, replace(INC, causes=())))


def test_a_runs_own_notices_are_covered_only_by_a_silence_of_the_whole_run():
    stalled = Notice("stalled", "gpt-7b-a", step=400, minutes=31.0)
    assert silence(run="gpt-7b-a").matches(stalled)
    assert not silence(run="gpt-7b-a", rule="loss-spike").matches(stalled)
    assert not silence(run="gpt-7b-a", cause="bad_batch").matches(stalled)


def test_a_silence_covers_only_while_it_is_in_force_and_the_longest_wins():
    opened = Notice("opened", INC.run, INC)
    short, long_ = silence(ends=100.0, ident=1), silence(ends=500.0, ident=2)
    assert covering([short, long_], opened, 50.0) is long_
    assert covering([short], opened, 100.0) is None  # ends is exclusive
    assert covering([silence(starts=60.0)], opened, 50.0) is None
    assert covering([replace(long_, expired=80.0)], opened, 90.0) is None


@pytest.mark.parametrize("name", ["plain-run", "a[1]*b?", "tick`tock", "new\nline", "\x1b]52;c;x\x07", "ÿ ünï çødé", "$(reboot)"])
def test_the_shown_command_selects_exactly_the_alerts_run_and_rule(name):
    """What the alert shows, pasted into a shell, makes a silence that covers this alert and not a
    run named almost alike."""
    inc = replace(INC, run=name)
    words = shlex.split(command_for(Notice("opened", name, inc), state_dir="/var/lib/lossguard"))
    args = build_parser().parse_args(words[1:])
    assert (args.state_dir.as_posix(), args.duration, args.comment) == ("/var/lib/lossguard", "2h", "why")
    made = silence(run=args.run, rule=args.rule)
    assert made.matches(Notice("opened", name, inc))
    assert not made.matches(Notice("opened", name + "x", replace(inc, run=name + "x")))
    assert not made.matches(Notice("opened", name, replace(inc, rule="grad-norm-spike")))
    assert "`" not in args.run and all(ch.isprintable() for ch in args.run)


def test_literal_glob_brackets_glob_characters_of_the_name():
    assert literal_glob("a*b") == "a[*]b"
    assert silence(run=literal_glob("a*b")).matches(Notice("stalled", "a*b", step=1))
    assert not silence(run=literal_glob("a*b")).matches(Notice("stalled", "aXXb", step=1))


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("1.5h", 5400)])
def test_durations_read_as_people_write_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "-1h", "0s", "2h junk", "9999d"])
def test_a_bad_duration_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--for"):
        parse_duration(text)


def test_until_takes_iso_times_and_refuses_the_past():
    assert parse_until("2026-12-01T18:00+00:00", now=1796140000.0) == 1796148000.0
    assert parse_until("2026-12-01T19:00+01:00", now=1796140000.0) == 1796148000.0
    with pytest.raises(UsageError, match="at most a year"):
        parse_until("2028-12-01T18:00+00:00", now=1796140000.0)
    with pytest.raises(UsageError, match="has passed"):
        parse_until("2020-01-01T00:00+00:00", now=1796148000.0)
    with pytest.raises(UsageError, match="not a time"):
        parse_until("tomorrow", now=0.0)


# --- the sender ---------------------------------------------------------------------------------

class Wall:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state(tmp_path):
    s = State(tmp_path / "state")
    yield s
    s.close()


def _raise(state: State, inc: Incident, *, kind="opened", sinks=("jsonl",)) -> int:
    """As a pass does: the incident recorded (or updated) and its notice queued, in one commit."""
    with state.transaction() as tx:
        known = state.incident(inc.run, inc.rule, inc.step)
        ident = known.id if known else tx.add_incident(inc, source="runs/x.log", quiet=False, now=1.0)
        if known:
            tx.update_incident(replace(known, incident=inc))
        tx.enqueue(Notice(kind, inc.run, inc, source="runs/x.log"), incident_id=ident, sinks=sinks, now=1.0)
    return ident


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_silenced_incident_is_recorded_not_sent_and_reported_once_when_the_silence_ends(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    s = state.add_silence(run="gpt-7b-*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 3600, comment="restarting from 41k", author="ana")
    other = replace(INC, run="gpt-13b")
    _raise(state, INC)
    _raise(state, other)
    sender.round()
    assert [(e["event"], e["run"]) for e in _events(out)] == [("opened", "gpt-13b")]
    assert state.incident(INC.run, INC.rule, INC.step).status == "open"  # recorded all the same
    assert state.undelivered() == []  # held, not waiting
    grown = replace(INC, value=12.0, peak_step=22)
    _raise(state, grown, kind="updated")
    wall.now += 600
    sender.round()
    assert len(_events(out)) == 1
    wall.now = s.ends
    sender.round()
    report = _events(out)[1:]
    assert [(e["event"], e["run"], e["value"]) for e in report] == [("unsilenced", "gpt-7b-a", 12.0)]  # as it stands now
    sender.round()
    Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall).round()  # a restart: nothing said twice
    assert len(_events(out)) == 2


def test_an_incident_that_recovered_under_its_silence_is_not_reported(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    state.add_silence(run="*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="x", author="")
    _raise(state, INC)
    _raise(state, replace(INC, end_step=30), kind="resolved")
    sender.round()
    wall.now += 120
    sender.round()
    assert _events(out) == []


def test_expiring_a_silence_early_reports_at_the_next_round(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    s = state.add_silence(run="*", rule="loss-*", metric=None, cause=None, starts=wall.now, ends=wall.now + 86400, comment="x", author="")
    _raise(state, INC)
    sender.round()
    assert _events(out) == []
    wall.now += 5
    assert state.expire_silence(s.id, now=wall.now).end == wall.now
    sender.round()
    assert [e["event"] for e in _events(out)] == ["unsilenced"]
    assert state.expire_silence(999, now=wall.now) is None


def test_when_one_silence_ends_another_still_in_force_keeps_holding(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    state.add_silence(run="gpt-*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="short", author="")
    state.add_silence(run="*", rule=None, metric="loss", cause=None, starts=wall.now + 30, ends=wall.now + 600, comment="long", author="")
    _raise(state, INC)
    sender.round()
    wall.now += 90  # the first ended; the second covers the incident
    sender.round()
    assert _events(out) == []
    wall.now += 600
    sender.round()
    assert [(e["event"], e["silenced_by"].split()[0]) for e in _events(out)] == [("unsilenced", "#2")]


def test_a_stalled_run_still_stalled_when_its_silence_ends_is_said_again(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    state.add_silence(run="exp", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="x", author="")
    with state.transaction() as tx:
        tx.advance_run("exp", 400, now=1.0)
        tx.mark_stalled("exp")
        tx.enqueue(Notice("stalled", "exp", step=400, minutes=31.0), incident_id=None, sinks=["jsonl"], now=1.0)
    sender.round()
    wall.now += 120
    sender.round()
    assert [(e["event"], e["run"], e["step"]) for e in _events(out)] == [("unsilenced", "exp", 400)]


def test_alertmanager_is_not_held_back_it_has_silences_of_its_own(state, tmp_path):
    """(Its sink's posts go through; a stand-in client records them: the real server is in
    test_alertmanager.py, and whether a silence holds does not depend on the wire.)"""

    class Recorder:
        def __init__(self) -> None:
            self.alerts: list = []

        def post(self, alerts):
            from lossguard.alerts.delivery import Delivery

            self.alerts += alerts
            return Delivery(ok=True)

    am, wall = Recorder(), Wall()
    state.add_silence(run="*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="x", author="")
    _raise(state, INC, sinks=("alertmanager",))
    Dispatcher(state, {"alertmanager": AlertmanagerSink(am, host="h")}, wall=wall).round()
    assert [a["labels"]["run"] for a in am.alerts] == ["gpt-7b-a"]


def test_the_slack_alert_shows_the_silence_command_and_the_report_starts_the_thread(state, slack):
    wall = Wall()
    sink = SlackSink(SlackBot("xoxb-1-SECRET", "#training", base_url=slack.base_url, backoff=0.01, retries=0), state_dir=state.directory)
    sender = Dispatcher(state, {"slack": sink}, wall=wall, sleep=lambda s: None)
    _raise(state, replace(INC, run="other"), sinks=("slack",))
    sender.round()
    first = [r.body for r in slack.requests if r.path == "/api/chat.postMessage"][0]
    shown = f"lossguard silence add --state-dir {state.directory} --run other --rule loss-spike --for 2h --comment why"
    assert shown in first["text"] and shown in json.dumps(first["blocks"])
    state.add_silence(run="gpt-*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="restart", author="ana")
    ident = _raise(state, INC, sinks=("slack",))
    sender.round()
    assert len([r for r in slack.requests if r.path == "/api/chat.postMessage"]) == 1
    wall.now += 61
    sender.round()
    report = [r.body for r in slack.requests if r.path == "/api/chat.postMessage"][1]
    assert "still open as its silence ends" in json.dumps(report["blocks"]) and "by ana: restart" in report["text"]
    assert "thread_ts" not in report or not report["thread_ts"]
    assert state.thread(ident) is not None  # its follow-ups reply to the report


# --- clock steps: what ended and was reported stays ended ---------------------

def test_a_silence_ended_and_reported_or_expired_holds_nothing_whatever_the_clock_says():
    opened = Notice("opened", INC.run, INC)
    assert covering([replace(silence(ends=500.0), reported=600.0)], opened, 50.0) is None
    assert covering([replace(silence(ends=500.0), expired=80.0)], opened, 70.0) is None  # the clock back before the expiry
    assert replace(silence(ends=500.0), reported=600.0).ended(0.0) and not silence(ends=500.0).ended(0.0)


def test_a_new_spike_after_the_clock_steps_back_into_a_reported_silence_is_delivered(state, tmp_path):
    """The clock stepped back (an NTP correction, a VM restored) into the window of a silence that
    has ended and been reported: the spike is delivered, not held by a silence nobody will report."""
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    state.add_silence(run="*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="x", author="")
    sender.round()
    wall.now += 120
    sender.round()  # ended and reported (it held nothing)
    wall.now -= 90  # back inside its window
    _raise(state, INC)
    sender.round()
    assert [(e["event"], e["run"]) for e in _events(out)] == [("opened", "gpt-7b-a")]
    assert state.silences(now=wall.now) == []  # nor is it listed as in force


def test_an_expired_silence_is_reported_at_once_even_with_the_clock_stepped_back_before_the_expiry(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    s = state.add_silence(run="*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 86400, comment="x", author="")
    _raise(state, INC)
    sender.round()
    wall.now += 3600
    state.expire_silence(s.id, now=wall.now)
    wall.now -= 1800  # stepped back before the expiry
    sender.round()
    assert [e["event"] for e in _events(out)] == ["unsilenced"]
    _raise(state, replace(INC, run="gpt-7b-b"))
    sender.round()
    assert [e["event"] for e in _events(out)] == ["unsilenced", "opened"]


# --- resolutions of what was announced ----------------------------------------

def test_an_alerted_incident_that_recovers_under_a_silence_is_resolved_and_its_growth_held(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    _raise(state, INC)
    sender.round()
    state.add_silence(run="*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 3600, comment="I know", author="")
    _raise(state, replace(INC, value=12.0, peak_step=22), kind="updated")
    _raise(state, replace(INC, value=12.0, peak_step=22, end_step=30), kind="resolved")
    sender.round()
    assert [e["event"] for e in _events(out)] == ["opened", "resolved"]
    wall.now += 3600
    sender.round()  # the silence ends: the incident is over, nothing to report
    assert [e["event"] for e in _events(out)] == ["opened", "resolved"]


def test_a_resolution_goes_out_when_its_alert_went_out_in_the_same_batch(state, tmp_path):
    """The resolution revised the cause, which a silence covers; the alert, of the first cause, did not."""
    out, wall = tmp_path / "out.jsonl", Wall()
    state.add_silence(run="*", rule=None, metric=None, cause="lr_*", starts=wall.now, ends=wall.now + 3600, comment="x", author="")
    _raise(state, INC)
    revised = replace(INC, end_step=30, causes=(Cause("lr_warmup", 0.7, "warm-up", "wait"),))
    _raise(state, revised, kind="resolved")
    Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall).round()
    assert [e["event"] for e in _events(out)] == ["opened", "resolved"]


def test_a_stalled_run_that_resumes_under_a_silence_is_said_to_resume(state, tmp_path):
    out, wall = tmp_path / "out.jsonl", Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=wall)
    with state.transaction() as tx:
        tx.enqueue(Notice("stalled", "exp", step=400, minutes=31.0), incident_id=None, sinks=["jsonl"], now=1.0)
    sender.round()
    state.add_silence(run="exp", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 60, comment="x", author="")
    with state.transaction() as tx:
        tx.enqueue(Notice("resumed", "exp", step=401), incident_id=None, sinks=["jsonl"], now=1.0)
        tx.enqueue(Notice("stalled", "exp", step=401, minutes=31.0), incident_id=None, sinks=["jsonl"], now=1.0)
        tx.enqueue(Notice("resumed", "exp", step=402), incident_id=None, sinks=["jsonl"], now=1.0)
    sender.round()
    assert [(e["event"], e["step"]) for e in _events(out)] == [("stalled", 400), ("resumed", 401)]  # the second stall never said


def test_a_slack_alert_that_recovers_under_a_silence_gets_its_resolution_in_its_thread(state, slack):
    wall = Wall()
    sink = SlackSink(SlackBot("xoxb-1-SECRET", "#training", base_url=slack.base_url, backoff=0.01, retries=0), state_dir=state.directory)
    sender = Dispatcher(state, {"slack": sink}, wall=wall, sleep=lambda s: None)
    ident = _raise(state, INC, sinks=("slack",))
    sender.round()
    alert_ts = state.thread(ident).split("|")[1]
    state.add_silence(run="gpt-*", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 3600, comment="x", author="")
    _raise(state, replace(INC, end_step=30), kind="resolved", sinks=("slack",))
    sender.round()
    replies = [r.body for r in slack.requests if r.path == "/api/chat.postMessage" and r.body.get("thread_ts") == alert_ts]
    assert len(replies) == 1 and replies[0]["text"].split("\n")[0].endswith(" - resolved")


# --- many ended silences -----------------------------------------------------

def _ended(state: State, n: int, *, ended: float, reported: float | None = None) -> None:
    with state.transaction():
        state.db.executemany(
            "INSERT INTO silences (run, rule, metric, cause, starts, ends, comment, author, created, reported) VALUES (?,?,?,?,?,?,?,?,?,?)",
            [(f"r{i}", None, None, None, ended - 60, ended, "old", "", ended - 60, ended if reported is None else reported) for i in range(n)],
        )


def _vm_steps(state: State, call) -> int:  # noqa: ANN001
    """SQLite's work for `call`, in thousands of virtual-machine steps (deterministic, unlike time)."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    state.db.set_progress_handler(tick, 1000)
    try:
        call()
    finally:
        state.db.set_progress_handler(None, 0)
    return steps[0]


def test_a_round_reads_only_the_silences_in_force_however_many_have_ended(state, tmp_path):
    wall = Wall()
    sender = Dispatcher(state, {"jsonl": JsonlSink(tmp_path / "out.jsonl")}, wall=wall)
    state.add_silence(run="live", rule=None, metric=None, cause=None, starts=wall.now, ends=wall.now + 3600, comment="x", author="")
    sender.round()
    alone = _vm_steps(state, sender.round)
    _ended(state, 20_000, ended=wall.now - 86400)
    crowded = _vm_steps(state, sender.round)
    assert crowded <= alone + 1, (alone, crowded)  # (20,000 rows read: ~200)
    assert [s.run for s in state.silences(now=wall.now)] == ["live"]


def test_ended_silences_are_kept_a_month_then_pruned_and_no_id_is_given_twice(state):
    now = 100 * 86400.0
    _ended(state, 3, ended=now - 31 * 86400)
    _ended(state, 2, ended=now - 29 * 86400)
    s = state.add_silence(run="new", rule=None, metric=None, cause=None, starts=now, ends=now + 60, comment="x", author="")
    assert [x.id for x in state.silences()] == [4, 5, 6]
    with state.transaction():
        state.db.execute("UPDATE silences SET reported=ends")
    state.end_silences(now + 40 * 86400)  # (nothing left to report: nothing pruned by it)
    state.add_silence(run="later", rule=None, metric=None, cause=None, starts=now + 40 * 86400, ends=now + 41 * 86400, comment="x", author="")
    assert [x.id for x in state.silences()] == [7]  # #6, the newest then, outlived its month but kept its id
    assert s.id == 6


def test_silence_list_all_shows_the_last_ended_ones_and_says_how_many_more(tmp_path):
    state = State(tmp_path / "state")
    now = time.time()
    _ended(state, 150, ended=now - 3600)
    state.add_silence(run="live", rule=None, metric=None, cause=None, starts=now, ends=now + 3600, comment="in force", author="")
    state.close()
    res = run_lossguard("silence", "list", "--all", "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "101 silence(s) (ended ones too):" and lines[1].startswith("  #51  run=r50") and "#151  run=live" in lines[-2]
    assert lines[-1] == "  ... and 50 older ended silence(s) not shown (`--limit 0` lists every one)"
    res = run_lossguard_in_process("silence", "list", "--all", "--limit", "0", "--format", "json", "--state-dir", str(tmp_path / "state"))
    assert len(json.loads(res.stdout)) == 151 and res.stderr == ""
    res = run_lossguard_in_process("silence", "list", "--state-dir", str(tmp_path / "state"))
    assert res.stdout.splitlines()[0] == "1 silence(s) in force:"


# --- the CLI ------------------------------------------------------------------------------------

def test_silence_cli_adds_lists_expires_and_status_shows_it(tmp_path):
    d = str(tmp_path / "state")
    added = run_lossguard_in_process("silence", "add", "--state-dir", d, "--run", "gpt-*", "--metric", "loss", "--for", "2h", "--comment", "restarting from 41k")
    assert added.returncode == 0 and "#1  run=gpt-* metric=loss" in added.stdout
    listed = json.loads(run_lossguard_in_process("silence", "list", "--state-dir", d, "--format", "json").stdout)
    assert [(s["id"], s["run"], s["metric"], s["comment"]) for s in listed] == [(1, "gpt-*", "loss", "restarting from 41k")]
    assert listed[0]["ends"] - listed[0]["starts"] == pytest.approx(7200)
    assert "1 silence(s) in force:" in run_lossguard_in_process("status", "--state-dir", d).stdout
    assert run_lossguard_in_process("silence", "expire", "1", "--state-dir", d).returncode == 0
    assert json.loads(run_lossguard_in_process("silence", "list", "--state-dir", d, "--format", "json").stdout) == []
    assert len(json.loads(run_lossguard_in_process("silence", "list", "--all", "--state-dir", d, "--format", "json").stdout)) == 1
    assert "0 silence(s) in force" in run_lossguard_in_process("status", "--state-dir", d).stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--for", "2x"], "not a duration"),
    (["--until", "2001-01-01T00:00"], "has passed"),
    (["--for", "1h", "--rule", "los-spike"], "matches none of the rules in force (loss-spike"),
    (["--for", "1h", "--metric", "gradnorm"], "matches none of the rules in force"),
    (["--for", "1h", "--cause", "lr"], "matches no cause"),
])
def test_a_silence_that_could_never_hold_anything_is_refused_in_one_line(tmp_path, args, says):
    run = run_lossguard if says == "not a duration" else run_lossguard_in_process  # (one in a real process)
    res = run("silence", "add", "--state-dir", str(tmp_path / "s"), "--run", "x", "--comment", "c", *args)
    assert res.returncode == 2 and says in assert_one_error_line(res)


def test_expiring_an_unknown_silence_is_a_usage_error(tmp_path):
    d = str(tmp_path / "state")
    State(tmp_path / "state").close()
    res = run_lossguard("silence", "expire", "7", "--state-dir", d)
    assert res.returncode == 2 and "no silence #7" in assert_one_error_line(res)


def test_a_silence_on_an_older_layout_state_brings_it_up_to_date(tmp_path):
    State(tmp_path / "state").close()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("DROP TABLE silences")
    db.execute("ALTER TABLE outbox DROP COLUMN silenced")
    db.execute("PRAGMA user_version=6")
    db.commit()
    db.close()
    res = run_lossguard("silence", "add", "--state-dir", str(tmp_path / "state"), "--run", "x", "--for", "1h", "--comment", "c")
    assert res.returncode == 0, res.stderr
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION and db.execute("SELECT count(*) FROM silences").fetchone()[0] == 1


# --- the daemon ---------------------------------------------------------------------------------

def test_the_running_daemon_honours_a_silence_at_once_and_reports_what_is_open_when_it_ends(tmp_path):
    """A real daemon with a JSON-lines sink: a silence added from the CLI while it runs holds the next
    spike of its runs (another run's still alerts), a kill -9 and restart keep it, and expiring
    it reports the incident still open, once."""
    from .test_watch import NO_PLOTS, Watch, _calm, _line

    for run in ("gpt-a", "other"):
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "metrics.jsonl").write_text(_calm(range(1, 20)))
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready(files=2)
        res = run_lossguard_in_process("silence", "add", "--state-dir", str(tmp_path / "state"), "--run", "gpt-*", "--for", "1h", "--comment", "restarting")
        assert res.returncode == 0, res.stderr
        for run in ("gpt-a", "other"):
            with open(tmp_path / "runs" / run / "metrics.jsonl", "a") as fh:
                fh.write(_line(20, 9.0))
        ev = w.settle()
        assert [(e["event"], e["run"]) for e in ev if e["event"] != "resolved"] == [("opened", "other")]
        status = run_lossguard("status", "--state-dir", str(tmp_path / "state")).stdout
        assert "gpt-a  step 20  loss-spike" in status and "run=gpt-*" in status  # recorded, and the silence shown
        w.kill9()
        assert "held back by silence #1 (run=gpt-*, by " in w.output()
        w.start()
        w.wait_settled()
        assert run_lossguard_in_process("silence", "expire", "1", "--state-dir", str(tmp_path / "state")).returncode == 0
        ev = w.wait_for(lambda ev: any(e["event"] == "unsilenced" for e in ev))
        time_to_repeat = w.settle()
        unsilenced = [e for e in time_to_repeat if e["event"] == "unsilenced"]
        assert [(e["run"], e["step"], e["silenced_by"].startswith("#1 (run=gpt-*")) for e in unsilenced] == [("gpt-a", 20, True)]
    finally:
        w.stop_and_read()


def test_the_daemon_delivers_a_spike_after_the_clock_stepped_back_into_a_reported_silence(tmp_path):
    """A real daemon on the state a clock stepped back leaves behind: a silence of gpt-* that the
    daemon reported as ended (at a wall time now an hour ahead) and that, by the clock, is again
    in its window. The next spike of gpt-a reaches the JSON-lines sink (it was held, never said)."""
    from .test_watch import NO_PLOTS, Watch, _calm, _line

    (tmp_path / "runs" / "gpt-a").mkdir(parents=True)
    (tmp_path / "runs" / "gpt-a" / "metrics.jsonl").write_text(_calm(range(1, 20)))
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready(files=1)
        now = time.time()
        with sqlite3.connect(tmp_path / "state" / "state.db") as db:
            db.execute("INSERT INTO silences (run, starts, ends, comment, author, created, reported) VALUES ('gpt-*', ?, ?, 'restart', 'ana', ?, ?)",
                       (now - 1800, now + 1800, now - 1800, now + 3600))
        with open(tmp_path / "runs" / "gpt-a" / "metrics.jsonl", "a") as fh:
            fh.write(_line(20, 9.0))
        assert [(e["event"], e["run"]) for e in w.settle() if e["event"] != "resolved"] == [("opened", "gpt-a")]
    finally:
        w.stop_and_read()


def test_the_daemon_sends_the_resolution_of_an_alert_that_recovers_under_a_silence(tmp_path):
    """The alert went out; the operator silences the run (`silence add`); the run recovers: the
    JSON-lines sink gets its `resolved` (a Slack message would otherwise stay open for good)."""
    from .test_watch import NO_PLOTS, Watch, _calm, _line

    (tmp_path / "runs" / "gpt-a").mkdir(parents=True)
    log = tmp_path / "runs" / "gpt-a" / "metrics.jsonl"
    log.write_text(_calm(range(1, 20)))
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready(files=1)
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "gpt-a" for e in ev))
        res = run_lossguard_in_process("silence", "add", "--state-dir", str(tmp_path / "state"), "--run", "gpt-*", "--for", "1h", "--comment", "I know")
        assert res.returncode == 0, res.stderr
        with open(log, "a") as fh:
            fh.write(_calm(range(21, 40)))
        ev = w.settle()
        assert [(e["event"], e["run"], e["step"]) for e in ev] == [("opened", "gpt-a", 20), ("resolved", "gpt-a", 20)]
    finally:
        w.stop_and_read()


def test_a_silence_another_sinks_sender_reported_meanwhile_holds_nothing(state, tmp_path):
    """Each sink has its own sender: one reads the silences in force, then (before it holds its
    entry) the silence is expired and the other sender's round reports its end. Held then, the
    alert would never be said (its silence's report was made without it)."""
    from lossguard.alerts.sinks import ConsoleSink

    out = tmp_path / "out.jsonl"
    s = state.add_silence(run="*", rule=None, metric=None, cause=None, starts=1000.0, ends=4600.0, comment="x", author="")
    _raise(state, INC)
    other = Dispatcher(state.secondary(), {"console": ConsoleSink(print)}, wall=lambda: 1005.0, configured=["jsonl", "console"])
    calls = []

    def wall() -> float:
        calls.append(1)
        if len(calls) == 2:  # the jsonl sender's _hold: the silence expired and reported meanwhile
            state.expire_silence(s.id, now=1004.0)
            other.round()
        return 1003.0 if len(calls) < 2 else 1005.0

    sender = Dispatcher(state.secondary(), {"jsonl": JsonlSink(out)}, wall=wall, configured=["jsonl", "console"])
    sender.round()
    sender.round()
    assert [e["event"] for e in _events(out)] == ["opened"]
