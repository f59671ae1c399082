"""The alert pipeline (outbox -> stages -> sinks) with direct calls: the real slack-sdk against a
local server that answers like Slack, a real JSON-lines file, a real SQLite state, and the clock
passed in."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lossguard.alerts import sinks
from lossguard.alerts.delivery import Post
from lossguard.alerts.picture import Picture
from lossguard.alerts.pipeline import BATCH, Dispatcher, news_first
from lossguard.alerts.plots import Plot
from lossguard.alerts.sinks import JsonlSink, SlackSink
from lossguard.alerts.slack import SlackBot, SlackWebhook
from lossguard.model import Incident, Notice
from lossguard.watch.settings import SlackRoute
from lossguard.state import OutboxEntry, State

from .slack_server import Answer

TOKEN = "xoxb-2222-SECRET"
BASE = Incident(run="exp", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=20, peak_step=20,
                value=9.0, baseline=2.0, threshold=4.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def state(tmp_path):
    s = State(tmp_path / "state")
    yield s
    s.close()


def raise_(state: State, *incidents: Incident, sinks=("slack",), kind: str = "opened") -> None:
    with state.transaction() as tx:
        for inc in incidents:
            known = state.incident(inc.run, inc.rule, inc.step)
            ident = known.id if known else tx.add_incident(inc, source="runs/x.log", quiet=False, now=1.0)
            tx.enqueue(Notice(kind, inc.run, inc, source="runs/x.log"), incident_id=ident, sinks=sinks, now=1.0)


def bot_sink(slack, **manners) -> SlackSink:
    return SlackSink(SlackBot(TOKEN, "#training", base_url=slack.base_url, backoff=0.01, retries=0), **manners)


def posts(slack):
    return [r.body for r in slack.requests if r.path == "/api/chat.postMessage"]


def test_a_runs_next_incident_replies_in_its_thread_and_critical_goes_to_its_route(slack, state):
    clock = Clock()
    sink = bot_sink(slack, routes=(SlackRoute(channel="#oncall", severity=["critical"]),), min_interval=1.0, run_cooldown=600)
    dispatcher = Dispatcher(state, {"slack": sink}, clock=clock, sleep=clock.sleep, wall=clock)
    raise_(state, BASE)
    assert dispatcher.round() == 1
    clock.now += 10
    raise_(state, replace(BASE, step=900), replace(BASE, step=950, severity="critical"))
    assert dispatcher.round() == 2
    sent = posts(slack)
    assert sent[0]["channel"] == "#training" and "thread_ts" not in sent[0]
    assert sent[1]["channel"] == "#training" and sent[1]["thread_ts"] == "1700000000.000001"
    assert sent[2]["channel"] == "#oncall" and "thread_ts" not in sent[2]
    assert clock.slept == []  # 10 s apart, and #oncall's first message need not wait for #training's
    clock.now += 0.2
    raise_(state, replace(BASE, run="other"))
    dispatcher.round()
    assert clock.slept == [pytest.approx(0.8)]  # a second message to #training within a second waited its turn


def test_posts_are_paced_from_the_last_ones_answer_so_a_slow_post_cannot_arrive_close_to_the_next(slack, state):
    """A post held up on its way (its intent's commit, a busy machine) reaches Slack late: pacing
    from its start would let the next arrive less than min_interval after it (0.84 s seen in CI)."""
    clock = Clock()
    sink = bot_sink(slack, min_interval=1.0, group_threshold=10)
    send = sink.send

    def slow_send(post):  # noqa: ANN001, ANN202
        clock.now += 0.5  # the post is answered half a second after it began
        return send(post)

    sink.send = slow_send
    dispatcher = Dispatcher(state, {"slack": sink}, clock=clock, sleep=clock.sleep, wall=clock)
    raise_(state, BASE, replace(BASE, run="other"))
    assert dispatcher.round() == 2
    assert clock.slept == [pytest.approx(1.0)]  # a full interval after the first was answered


def test_follow_ups_reply_in_the_alerts_thread_and_the_resolution_rewrites_its_header(slack, state):
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)})
    raise_(state, BASE)
    dispatcher.round()
    resolved = replace(BASE, end_step=23)
    raise_(state, resolved, kind="resolved")
    dispatcher.round()
    reply = posts(slack)[1]
    assert reply["thread_ts"] == "1700000000.000001" and "resolved" in reply["text"]
    (update,) = [r.body for r in slack.requests if r.path == "/api/chat.update"]
    assert update["ts"] == "1700000000.000001" and "Resolved" in json.dumps(update["blocks"])


def test_a_burst_is_one_summary_and_a_crash_after_it_replies_in_its_thread_instead_of_posting_it_again(slack, state):
    burst = [replace(BASE, run=f"exp{i}") for i in range(4)]
    raise_(state, *burst)
    slack.queue = [Answer(), Answer(), Answer(body={"ok": False, "error": "internal_error"})]
    assert Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round() == 1  # summary, one reply, then a failure
    # A new process (the first died): no second summary; the rest reply in the first one's thread.
    assert Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round() == 3
    sent = posts(slack)
    assert sent[0]["text"].startswith("4 new spikes") and "thread_ts" not in sent[0]
    assert sum(p["text"].startswith("4 new spikes") for p in sent) == 1
    assert [p.get("thread_ts") for p in sent[1:]] == ["1700000000.000001"] * 5  # 4 replies + the failed one retried
    assert state.pending() == []


def test_a_new_spikes_alert_overtakes_the_replies_a_posted_burst_still_has_to_send(slack, state):
    """A burst's replies take a second or more of a busy Slack: an alert recorded meanwhile goes out
    next, at the top of the channel; a new incident of a run whose reply is still waiting stays
    behind that reply."""
    raise_(state, *[replace(BASE, run=f"exp{i}") for i in range(4)])
    sink = bot_sink(slack, min_interval=0)
    send = sink.send

    def send_then_spike(post):  # noqa: ANN001, ANN202
        delivery = send(post)
        if len(posts(slack)) == 2:  # the summary and its first reply are out when a pass records two spikes
            raise_(state, replace(BASE, run="late"), replace(BASE, run="exp3", step=900))
        return delivery

    sink.send = send_then_spike
    assert Dispatcher(state, {"slack": sink}).round() == 6
    sent = posts(slack)
    heads = [(p["text"].split()[0], p.get("thread_ts")) for p in sent]
    summary = "1700000000.000001"
    assert sent[0]["text"].startswith("4 new spikes") and "thread_ts" not in sent[0]
    assert "late" in sent[2]["text"] and "thread_ts" not in sent[2], heads
    assert [p.get("thread_ts") for p in sent[3:]] == [summary] * 4, heads  # (exp3's second spike: the run alerted a moment ago)
    exp3 = [i for i, p in enumerate(sent) if "exp3" in p["text"] and not p["text"].startswith("4 new")]
    assert len(exp3) == 2 and "900" in sent[exp3[1]]["text"] and "900" not in sent[exp3[0]]["text"], heads
    assert state.pending() == []


def entry(ident: int, kind: str, run: str, incident: int | None = None) -> OutboxEntry:
    return OutboxEntry(ident, incident, "slack", Notice(kind, run, BASE if incident is not None else None), 0)


@pytest.mark.parametrize("entries, listed, order", [
    pytest.param([entry(1, "resolved", "a", 1), entry(2, "opened", "b", 2)], (), [2, 1], id="an alert ahead of another run's resolution"),
    pytest.param([entry(1, "opened", "a", 1), entry(2, "opened", "b", 2)], (1,), [2, 1], id="an alert ahead of a posted summary's reply"),
    pytest.param([entry(1, "opened", "b", 1), entry(2, "escalated", "a", 2)], (), [1, 2], id="alerts keep their order"),
    pytest.param([entry(1, "opened", "a", 1), entry(2, "escalated", "a", 2)], (1,), [1, 2], id="an escalation behind its run's reply"),
    pytest.param([entry(1, "stalled", "a"), entry(2, "opened", "a", 2)], (), [1, 2], id="an alert behind its run's stall"),
    pytest.param([entry(1, "opened", "a", 1), entry(2, "resolved", "a", 1), entry(3, "unsilenced", "b", 3)], (), [1, 3, 2],
                 id="an incident's alert still before its resolution"),
])
def test_news_goes_ahead_of_follow_ups_and_never_ahead_of_its_own_runs_earlier_entries(entries, listed, order):
    assert [e.id for e in news_first(entries, listed=lambda ident: ident in listed)] == order


def test_each_post_is_recorded_as_it_is_accepted(slack, state):
    raise_(state, BASE, replace(BASE, step=900))
    slack.queue = [Answer(), Answer(body={"ok": False, "error": "internal_error"})]
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0, group_threshold=10)})
    assert dispatcher.round() == 1
    (left,) = state.pending()
    assert left.notice.incident.step == 900 and left.attempts == 1


def test_a_webhook_gets_the_summary_alone_and_it_settles_the_burst(slack, state):
    sink = SlackSink(SlackWebhook(slack.webhook_url, retries=0), min_interval=0)
    raise_(state, *[replace(BASE, run=f"exp{i}") for i in range(3)])
    assert Dispatcher(state, {"slack": sink}).round() == 3
    (summary,) = [r.body for r in slack.requests]
    assert summary["text"].startswith("3 new spikes") and state.pending() == []


def test_the_outbox_is_drained_in_one_round_and_every_sink_gets_each_notice_once(tmp_path, state):
    out = tmp_path / "alerts.jsonl"
    raise_(state, *[replace(BASE, step=s) for s in range(10, 10 + BATCH + 20)], sinks=("jsonl",))
    assert Dispatcher(state, {"jsonl": JsonlSink(out)}).round() == BATCH + 20
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["step"] for e in lines] == list(range(10, 10 + BATCH + 20)) and len({e["id"] for e in lines}) == len(lines)
    assert lines[0]["event"] == "opened" and lines[0]["source"] == "runs/x.log" and lines[0]["ratio"] == 4.5


def test_a_sink_that_is_not_configured_any_more_fails_its_entries_permanently(state):
    raise_(state, BASE, sinks=("slack",))
    assert Dispatcher(state, {}).round() == 0
    assert state.pending() == []
    error = state.db.execute("SELECT last_error, permanent FROM outbox").fetchone()
    assert error == ("sink 'slack' is not configured", 1)


def test_every_post_is_told_to_the_metrics_with_its_sink_and_whether_it_was_accepted(slack, state):
    clock = Clock()
    told: list[tuple[str, bool]] = []
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}, clock=clock, sleep=clock.sleep, wall=clock,
                            on_delivery=lambda sink, ok: told.append((sink, ok)))
    slack.queue = [Answer(), Answer(body={"ok": False, "error": "internal_error"})]
    raise_(state, BASE, replace(BASE, step=900))
    dispatcher.round()
    assert told == [("slack", True), ("slack", False)]


def top_level(slack):
    return [p for p in posts(slack) if "thread_ts" not in p]


@pytest.mark.parametrize("incidents, threshold", [(2, 10), (6, 10), (6, 3)], ids=["two", "six-no-summary", "six-in-a-summary"])
def test_incidents_that_open_and_resolve_in_one_round_are_one_top_level_message_each(slack, state, incidents, threshold):
    """(An incident already over when first announced: its alert and its resolution, in one round.)"""
    over = [replace(BASE, run=f"exp{i}", end_step=21) for i in range(incidents)]
    with state.transaction() as tx:
        for inc in over:
            ident = tx.add_incident(inc, source="runs/x.log", quiet=False, now=1.0)
            for kind in ("opened", "resolved"):
                tx.enqueue(Notice(kind, inc.run, inc, source="runs/x.log"), incident_id=ident, sinks=["slack"], now=1.0)
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0, group_threshold=threshold)})
    assert dispatcher.round() == 2 * incidents
    tops = top_level(slack)
    expected = 1 if threshold <= incidents else incidents
    assert len(tops) == expected, [p["text"].splitlines()[0] for p in tops]
    assert all("resolved" not in p["text"].splitlines()[0] or threshold <= incidents for p in tops)
    replies = [p for p in posts(slack) if "thread_ts" in p]
    assert sum("resolved" in p["text"] for p in replies) == incidents


def resolve_(state: State, *incidents: Incident) -> None:
    """What a pass commits when incidents recover: each row as now judged, and its resolution queued."""
    with state.transaction() as tx:
        for inc in incidents:
            row = state.incident(inc.run, inc.rule, inc.step)
            over = replace(inc, end_step=inc.step + 3)
            tx.update_incident(replace(row, incident=over, status="resolved"))
            tx.enqueue(Notice("resolved", inc.run, over, source="runs/x.log"), incident_id=row.id, sinks=["slack"], now=2.0)


def updates(slack):
    return [r.body for r in slack.requests if r.path == "/api/chat.update"]


def test_a_grad_norm_spike_that_replied_in_a_loss_alerts_thread_never_rewrites_that_alert(slack, state):
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0, run_cooldown=600)})
    raise_(state, BASE)
    dispatcher.round()
    nan = replace(BASE, metric="grad_norm", rule="grad-norm-nonfinite", step=30, peak_step=30, value=float("nan"), severity="critical")
    raise_(state, nan)
    dispatcher.round()
    assert posts(slack)[1]["thread_ts"] == "1700000000.000001"  # (the run's cooldown: in the loss alert's thread)
    resolve_(state, nan)
    dispatcher.round()
    assert "resolved" in posts(slack)[2]["text"] and posts(slack)[2]["thread_ts"] == "1700000000.000001"
    assert updates(slack) == []  # the loss alert still says loss spike, open
    resolve_(state, BASE)
    dispatcher.round()
    (update,) = updates(slack)
    assert update["ts"] == "1700000000.000001" and "Resolved: loss spike" in json.dumps(update["blocks"])


def test_a_burst_summary_shows_each_members_state_as_they_resolve_and_keeps_its_listing(slack, state):
    burst = [replace(BASE, run=f"exp{i}") for i in range(3)]
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)})
    raise_(state, *burst)
    dispatcher.round()
    assert posts(slack)[0]["text"].startswith("3 new spikes")
    resolve_(state, burst[1])
    dispatcher.round()
    resolve_(state, burst[0], burst[2])
    dispatcher.round()
    first, *_, last = updates(slack)
    assert len(updates(slack)) == 3 and all(u["ts"] == "1700000000.000001" for u in updates(slack))
    lines = first["text"].splitlines()
    assert lines[0] == "3 spikes, 1 resolved:" and len(lines) == 4
    assert lines[1].endswith(": open") and "resolved" in lines[2] and lines[3].endswith(": open")
    assert last["text"].startswith("3 spikes, all resolved:") and all("resolved" in line for line in last["text"].splitlines()[1:])


def test_the_resolved_header_is_rewritten_by_a_new_process_and_for_an_unsilenced_alert(slack, state):
    raise_(state, BASE)
    Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round()
    resolve_(state, BASE)
    Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round()  # a restart in between
    (update,) = updates(slack)
    assert update["ts"] == "1700000000.000001" and "Resolved" in json.dumps(update["blocks"])
    # An alert a silence held back, first posted as its silence ends: its header is rewritten too.
    other = replace(BASE, run="held")
    silence = state.add_silence(run="held", rule=None, metric=None, cause=None, starts=0.0, ends=4e9, comment="", author="t")
    raise_(state, other)
    Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round()
    state.expire_silence(silence.id, now=time.time())
    Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round()
    unsilenced = posts(slack)[-1]
    assert "still open as its silence ends" in json.dumps(unsilenced["blocks"]) and "thread_ts" not in unsilenced
    resolve_(state, other)
    Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round()
    assert updates(slack)[-1]["ts"] == "1700000000.000004"  # (the server counts the update too)
    assert "Resolved" in json.dumps(updates(slack)[-1]["blocks"])


def test_a_silence_ending_over_many_open_incidents_is_one_summary_with_replies(slack, state):
    silence = state.add_silence(run="*", rule=None, metric=None, cause=None, starts=0.0, ends=4e9, comment="", author="t")
    raise_(state, *[replace(BASE, run=f"exp{i}") for i in range(8)])
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)})
    dispatcher.round()
    assert posts(slack) == []
    state.expire_silence(silence.id, now=time.time())
    assert dispatcher.round() == 8
    tops = top_level(slack)
    assert len(tops) == 1 and tops[0]["text"].startswith("8 spikes still open as their silence ends")
    assert [p.get("thread_ts") for p in posts(slack)[1:]] == ["1700000000.000001"] * 8
    resolve_(state, replace(BASE, run="exp3"))
    dispatcher.round()
    (update,) = updates(slack)  # the listing rewritten: its title says what now holds, not "new spikes"
    assert update["ts"] == "1700000000.000001" and update["text"].startswith("8 spikes, 1 resolved:")


class Dies(Exception):
    """The process killed (here: raised) right after Slack accepted a post."""


def test_a_kill_during_the_summarys_post_does_not_list_its_incidents_again(slack, state):
    class Killed(SlackBot):
        def post(self, message, **kw):  # noqa: ANN001, ANN003
            super().post(message, **kw)
            raise Dies

    burst = [replace(BASE, run=f"exp{i}") for i in range(4)]
    raise_(state, *burst)
    with pytest.raises(Dies):
        Dispatcher(state, {"slack": SlackSink(Killed(TOKEN, "#training", base_url=slack.base_url, retries=0), min_interval=0)}).round()
    assert Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)}).round() == 4
    first, again, *replies = posts(slack)
    assert first["text"].startswith("4 new spikes")
    assert "thread_ts" not in again and not any(f"exp{i}" in again["text"] for i in range(4))  # listed once, above
    assert [r["thread_ts"] for r in replies] == ["1700000000.000002"] * 4 and state.pending() == []


def test_an_escalated_alerts_header_says_resolved_only_when_both_spikes_are_over(slack, state):
    gn = replace(BASE, metric="grad_norm", rule="grad-norm-spike", step=61, peak_step=61)
    loss = replace(BASE, step=62, peak_step=62)
    raise_(state, gn)
    dispatcher = Dispatcher(state, {"slack": bot_sink(slack, min_interval=0)})
    dispatcher.round()
    with state.transaction() as tx:
        ident = tx.add_incident(loss, source="runs/x.log", quiet=False, now=1.0, parent=state.incident(gn.run, gn.rule, gn.step).id)
        tx.enqueue(Notice("escalated", loss.run, loss, source="runs/x.log"), incident_id=ident, sinks=["slack"], now=1.0)
    dispatcher.round()
    assert len(updates(slack)) == 1  # (the header now says the loss followed)
    resolve_(state, gn)
    dispatcher.round()
    assert len(updates(slack)) == 1  # the loss spike it announces is still open
    resolve_(state, loss)
    dispatcher.round()
    assert len(updates(slack)) == 2 and "Resolved: loss spike" in json.dumps(updates(slack)[-1]["blocks"])


def test_a_jsonl_line_a_kill_cut_short_does_not_swallow_the_next_record(tmp_path, state):
    out = tmp_path / "alerts.jsonl"
    out.write_text('{"event": "opened", "id": "x-1", "ru')  # the write a kill -9 interrupted
    raise_(state, BASE, sinks=("jsonl",))
    Dispatcher(state, {"jsonl": JsonlSink(out)}).round()
    torn, line = out.read_text().splitlines()
    assert json.loads(line)["step"] == 20 and torn.endswith('"ru')


def test_a_jsonl_alert_a_kill_left_unrecorded_is_not_written_again_while_the_plotter_reads_the_file(tmp_path, state, monkeypatch):
    """The restarted daemon's sender and plotter share one sink, on two threads: the sender's retry
    must find the line the killed daemon wrote even when the plotter is the one reading the file
    (it used to see the ids read so far: none, and wrote the alert a second time)."""
    out = tmp_path / "alerts.jsonl"
    raise_(state, BASE, sinks=("jsonl",))
    (entry,) = state.pending(sink="jsonl")
    assert JsonlSink(out).send(Post((entry,))).ok  # the killed daemon's write; its record never came
    sink = JsonlSink(out)
    reading, go = threading.Event(), threading.Event()
    real_open = open

    def read_halfway(file, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if isinstance(file, Path) and file == out and not reading.is_set():  # the first look at the file's ids
            reading.set()
            go.wait(30)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(sinks, "open", read_halfway, raising=False)
    plot = Plot(tmp_path / "plot.png", Picture(BASE, ()), None, f"{entry.key}-plot", entry.key)
    plotter = threading.Thread(target=sink.send_plot, args=(plot,))
    plotter.start()
    assert reading.wait(30)
    sender = threading.Thread(target=Dispatcher(state, {"jsonl": sink}).round)
    sender.start()
    sender.join(0.5)  # (a sender that does not wait for the plotter's read is done by now)
    go.set()
    plotter.join(30)
    sender.join(30)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [entry.key, plot.key]
    assert state.pending() == []
