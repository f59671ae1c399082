"""Clicks from Slack taken in process: the real slack-sdk Socket Mode client (the builtin one) against
a local WebSocket server that greets it and sends envelopes as Slack does, and the real WebClient
against the Slack-like HTTP server; the state is a real one. What the daemon process adds is in
test_watch_slack_actions.py."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import pytest

from lossguard.alerts import link as link_module
from lossguard.alerts.actions import ACKNOWLEDGE, REFUSED, SILENCE_RUN
from lossguard.alerts.link import slack_link
from lossguard.alerts.pipeline import Dispatcher
from lossguard.alerts.slack import SlackBot
from lossguard.state import State, read_summary

from .test_actions import ANA, envelope
from .test_pipeline import BASE, Clock, bot_sink, posts, raise_

APP_TOKEN = "xapp-1-A0TEST-1-SECRETAPPTOKEN"


@pytest.fixture
def state(tmp_path):
    s = State(tmp_path / "state")
    yield s
    s.close()


def _alerted(slack, state) -> str:
    """An incident alerted with its buttons; its key as the buttons carry it."""
    raise_(state, BASE)
    clock = Clock()
    Dispatcher(state, {"slack": bot_sink(slack, buttons=True)}, clock=clock, sleep=clock.sleep, wall=time.time).round()
    block = posts(slack)[-1]["blocks"][-1]
    return block["block_id"].removeprefix("lossguard|")


def _link(slack, state, actors=(ANA,)):
    bot = SlackBot("xoxb-2222-SECRET", "#training", base_url=slack.base_url, backoff=0.01, retries=0)
    return slack_link(app_token=APP_TOKEN, base_url=slack.base_url, bot=bot, state=state.secondary(), status_state=state.secondary(),
                      actors=list(actors), rules=lambda: [("loss-spike", "loss")]).start()


def _requests(slack, method):
    return [r.body for r in slack.requests if r.path == f"/api/{method}"]


def _wait(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_a_click_on_silence_4h_is_acked_after_the_silence_commits_and_updates_the_alert(slack, socket, state):
    key = _alerted(slack, state)
    link = _link(slack, state)
    try:
        socket.wait_connected()
        socket.send(envelope(SILENCE_RUN, key=key, choice="4h", clicked=time.time(), envelope_id="e-4h"))
        ack = socket.wait_ack("e-4h")
        assert ack == {"envelope_id": "e-4h"}
        (silence,) = state.silences(now=time.time())  # committed before the ack went out
        assert silence.run == "exp" and silence.rule is None and silence.author == "@ana" and "from Slack" in silence.comment
        assert 4 * 3600 - 60 < silence.end - time.time() <= 4 * 3600
        _wait(lambda: _requests(slack, "chat.update") and _requests(slack, "chat.postEphemeral"))
        (update,) = _requests(slack, "chat.update")
        assert update["ts"] == "1700000000.000001" and "silenced 4 h by @ana at <!date^" in json.dumps(update["blocks"])
        (reply,) = _requests(slack, "chat.postEphemeral")
        assert reply["user"] == ANA and reply["channel"] == "C0TRAIN" and "Silenced the run exp 4 h" in reply["text"]
    finally:
        link.close()


def test_the_same_envelope_sent_twice_makes_one_silence_and_is_acked_twice(slack, socket, state):
    key = _alerted(slack, state)
    link = _link(slack, state)
    try:
        socket.wait_connected()
        click = envelope(SILENCE_RUN, key=key, choice="1h", clicked=time.time(), envelope_id="e-twice")
        socket.send(click)
        socket.wait_ack("e-twice")
        socket.send(click)  # Slack's retry: it did not see the first ack in time
        socket.wait_ack("e-twice", count=2)
        assert len(state.silences(now=time.time())) == 1
        _wait(lambda: len(_requests(slack, "chat.update")) == 2)
        first, second = _requests(slack, "chat.update")
        assert first["blocks"] == second["blocks"]  # the message updated to the same message again
    finally:
        link.close()


def test_an_actor_not_listed_gets_an_ephemeral_refusal_and_nothing_is_stored(slack, socket, state):
    key = _alerted(slack, state)
    link = _link(slack, state)
    try:
        socket.wait_connected()
        socket.send(envelope(SILENCE_RUN, key=key, choice="4h", user="U0EVE00001", clicked=time.time(), envelope_id="e-eve"))
        socket.wait_ack("e-eve")
        _wait(lambda: _requests(slack, "chat.postEphemeral"))
        assert _requests(slack, "chat.postEphemeral")[0]["text"] == REFUSED and _requests(slack, "chat.postEphemeral")[0]["user"] == "U0EVE00001"
        assert state.silences() == [] and _requests(slack, "chat.update") == []
    finally:
        link.close()


def test_acknowledged_an_incident_has_its_updates_no_longer_posted_but_its_resolution_is(slack, socket, state):
    key = _alerted(slack, state)
    link = _link(slack, state)
    try:
        socket.wait_connected()
        socket.send(envelope(ACKNOWLEDGE, key=key, clicked=time.time(), envelope_id="e-ack"))
        socket.wait_ack("e-ack")
        _wait(lambda: _requests(slack, "chat.update"))
        assert "acknowledged by @ana" in json.dumps(_requests(slack, "chat.update")[0]["blocks"])
        assert read_summary(state.path)["open_incidents"][0]["acked_by"] == "@ana"
        before = len(posts(slack))
        clock = Clock()
        dispatcher = Dispatcher(state, {"slack": bot_sink(slack, buttons=True)}, clock=clock, sleep=clock.sleep, wall=time.time)
        raise_(state, replace(BASE, value=20.0), kind="updated")
        dispatcher.round()
        assert len(posts(slack)) == before and state.undelivered() == []  # settled, not posted
        raise_(state, replace(BASE, end_step=30), kind="resolved")
        dispatcher.round()
        assert len(posts(slack)) == before + 1 and "resolved" in posts(slack)[-1]["text"]
    finally:
        link.close()


def test_the_link_reconnects_after_slacks_side_drops_it(slack, socket, state, monkeypatch):
    monkeypatch.setattr(link_module, "FIRST_WAIT", 0.05)
    link = _link(slack, state)
    try:
        socket.wait_connected()
        socket.drop()
        socket.wait_connected(count=2)
        _wait(lambda: read_summary(state.path)["slack_link"]["state"] == "connected")
    finally:
        link.close()
    assert read_summary(state.path)["slack_link"]["state"] == "stopped"


def test_a_refused_app_token_is_one_loud_line_and_status_says_so(slack, state, caplog, capsys):
    from lossguard.cli import main

    slack.socket_url = None  # apps.connections.open answers invalid_auth
    with caplog.at_level(logging.INFO, logger="lossguard"):
        link = _link(slack, state)
        try:
            _wait(lambda: (read_summary(state.path)["slack_link"] or {}).get("state") == "refused")
        finally:
            link.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "invalid_auth" in errors[0].getMessage() and "LOSSGUARD_SLACK_APP_TOKEN" in errors[0].getMessage()
    assert APP_TOKEN not in caplog.text
    state.set_link({"state": "refused", "error": "invalid_auth", "fix": "the app-level token is not valid", "at": time.time()})
    assert main(["status", "--state-dir", str(state.directory)]) == 0
    out = capsys.readouterr().out
    assert "slack link REFUSED by Slack: invalid_auth: the app-level token is not valid" in out and APP_TOKEN not in out


def test_slash_lossguard_status_is_answered_in_the_ack_from_the_state(slack, socket, state):
    _alerted(slack, state)
    link = _link(slack, state)
    try:
        socket.wait_connected()
        command = {"envelope_id": "e-cmd", "type": "slash_commands", "accepts_response_payload": True,
                   "payload": {"token": "v", "team_id": "T0", "channel_id": "C0TRAIN", "user_id": ANA, "user_name": "ana",
                               "command": "/lossguard", "text": "status exp", "response_url": "https://hooks.slack.com/commands/1/2/3",
                               "trigger_id": "1.2.3", "api_app_id": "A0TEST"}}
        socket.send(command)
        ack = socket.wait_ack("e-cmd")
        assert ack["payload"]["response_type"] == "ephemeral"
        assert "*1 open incident(s)* in runs matching `exp`" in ack["payload"]["text"] and "loss-spike" in ack["payload"]["text"]
        socket.send({**command, "envelope_id": "e-cmd-eve", "payload": {**command["payload"], "user_id": "U0EVE00001"}})
        assert socket.wait_ack("e-cmd-eve")["payload"]["text"] == REFUSED
    finally:
        link.close()


def test_show_the_plot_draws_the_curves_the_state_holds_into_the_alerts_thread(slack, socket, state):
    import numpy as np

    from lossguard.alerts.actions import SHOW_PLOT
    from lossguard.state import Tail

    from .images import png_size

    steps = np.arange(1, 41, dtype=np.int64)
    with state.transaction() as tx:
        tx.put_tail("exp", "loss", Tail(steps, np.where(steps == 20, 9.0, 2.0), 40))
        tx.put_tail("exp", "lr", Tail(steps, np.full(40, 1e-4), 40))
    raise_(state, BASE)
    clock = Clock()
    Dispatcher(state, {"slack": bot_sink(slack, buttons=True, plot_button=True)}, clock=clock, sleep=clock.sleep, wall=time.time).round()
    block = posts(slack)[-1]["blocks"][-1]
    assert [e["action_id"] for e in block["elements"]][-1] == SHOW_PLOT
    link = _link(slack, state)
    try:
        socket.wait_connected()
        socket.send(envelope(SHOW_PLOT, key=block["block_id"].removeprefix("lossguard|"), clicked=time.time(), envelope_id="e-plot"))
        socket.wait_ack("e-plot")
        _wait(lambda: slack.uploads(), timeout=60)
        (request, (png,)), = slack.uploads()
        assert request.body["thread_ts"] == "1700000000.000001" and png_size(png)[0] > 0
        assert state.silences() == [] and not list((state.directory / "plots").glob("*/*.png"))  # nothing changed; no file left
    finally:
        link.close()
