"""The buttons on an alert and the pure decision a click becomes (alerts.actions), table-driven with
named cases as lifecycle's are; the envelopes are shaped as Slack sends them over Socket Mode
(docs.slack.dev, "Using Socket Mode" and the block_actions payload reference)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lossguard.alerts import actions, message
from lossguard.alerts.actions import ACKNOWLEDGE, SILENCE_RULE, SILENCE_RUN, Acknowledge, Facts, MakeSilence, Refuse, decide, parse
from lossguard.alerts.sinks import SlackSink
from lossguard.alerts.delivery import Post
from lossguard.alerts.slack import SlackBot
from lossguard.detection.engine import analyse_run
from lossguard.detection.rules import default_rules
from lossguard.model import Notice
from lossguard.silences import Silence
from lossguard.state import IncidentRow, OutboxEntry

from . import synth

NOW = 1_790_000_000.0
STATE = "a1b2c3d4e5f6"
ANA = "U0ANA00001"


def _incident(run: str = "exp/7b", *, status: str = "open") -> IncidentRow:
    inc = analyse_run(synth.long_frame("gradient_explosion"), default_rules(), run=run).incidents[0]
    return IncidentRow(7, status, inc, "/runs/exp/7b/train.log", False, inc.value, NOW - 60, None, "C1|1.1")


def envelope(action: str, *, key: str = f"{STATE}-7", choice: str | None = None, user: str = ANA, envelope_id: str = "env-1",
             clicked: float = NOW - 2) -> dict:
    """An `interactive` envelope as Slack sends it down the socket for a click on one of our blocks."""
    act = {"action_id": action, "block_id": f"lossguard|{key}", "type": "button", "action_ts": f"{clicked:.6f}"}
    if choice is not None:
        act = {**act, "type": "static_select", "selected_option": {"text": {"type": "plain_text", "text": choice}, "value": choice}}
    else:
        act["value"] = key
    return {
        "envelope_id": envelope_id, "type": "interactive", "accepts_response_payload": False,
        "payload": {
            "type": "block_actions", "user": {"id": user, "username": "ana", "name": "ana", "team_id": "T0"},
            "api_app_id": "A0", "token": "verification-token", "trigger_id": "1.2.3",
            "container": {"type": "message", "message_ts": "1700000000.000001", "channel_id": "C0TRAIN", "is_ephemeral": False},
            "channel": {"id": "C0TRAIN", "name": "training"},
            "message": {"type": "message", "ts": "1700000000.000001", "text": "[CRITICAL] exp/7b: grad_norm spike",
                        "blocks": [{"type": "header", "block_id": "h", "text": {"type": "plain_text", "text": "CRITICAL"}},
                                   actions.buttons(key)]},
            "response_url": "https://hooks.slack.com/actions/T0/1/x", "actions": [act],
        },
    }


def _facts(**changes) -> Facts:
    base = Facts(STATE, _incident(), None, frozenset({ANA, "S0ONCALL01"}), rules=(("grad-norm-spike", "grad_norm"), ("loss-spike", "loss")),
                 causes=tuple(message.CAUSE_TITLES), now=NOW)
    return replace(base, **changes)


def _click(action: str, **kw):
    return parse(envelope(action, **kw))


@pytest.mark.parametrize("click, facts, expected", [
    pytest.param(_click(SILENCE_RUN, choice="4h", user="U0EVE00001"), _facts(), Refuse(actions.REFUSED), id="an actor not listed is refused"),
    pytest.param(_click(SILENCE_RUN, choice="4h", user="U0BOB00001"), _facts(groups=frozenset({"S0ONCALL01"})), MakeSilence, id="a member of a listed user group may act"),
    pytest.param(_click(SILENCE_RUN, choice="4h", key="0ther5tate00-7"), _facts(), Refuse, id="a button of a state started over"),
    pytest.param(_click(SILENCE_RUN, choice="4h"), _facts(incident=None), Refuse, id="an incident the state no longer holds"),
    pytest.param(_click(SILENCE_RUN, choice="4h", clicked=NOW - 3600), _facts(), Refuse, id="a click an hour old has expired"),
    pytest.param(_click(SILENCE_RUN, choice="4h"), _facts(), MakeSilence, id="silence the run 4 h"),
    pytest.param(_click(SILENCE_RUN, choice="2d"), _facts(), Refuse, id="a choice no menu offers"),
    pytest.param(_click(SILENCE_RUN, choice="recovers"), _facts(incident=_incident(status="resolved")), Refuse, id="until it recovers, recovered already"),
    pytest.param(_click(SILENCE_RULE), _facts(rules=(("loss-spike", "loss"),)), Refuse, id="a rule no longer in force holds nothing"),
    pytest.param(_click(SILENCE_RULE), _facts(), MakeSilence, id="silence the rule"),
    pytest.param(_click(ACKNOWLEDGE), _facts(), Acknowledge, id="acknowledge"),
    pytest.param(_click(ACKNOWLEDGE), _facts(acked_by="@bob"), Refuse("Already acknowledged by @bob."), id="acknowledged already"),
    pytest.param(_click(actions.SHOW_PLOT), _facts(), actions.ShowPlot, id="show the plot"),
    pytest.param(_click(actions.SHOW_PLOT, user="U0EVE00001"), _facts(), Refuse(actions.REFUSED), id="show the plot, not listed"),
])
def test_what_a_click_does(click, facts, expected):
    got = decide(click, facts)
    if isinstance(expected, type):
        assert isinstance(got, expected), got
    else:
        assert got == expected


def test_silence_this_run_4h_is_the_silence_the_cli_makes_for_the_run_with_who_and_when():
    got = decide(_click(SILENCE_RUN, choice="4h"), _facts())
    assert got.new.run == "exp/7b" and got.new.rule is None and got.new.metric is None and got.new.cause is None
    assert got.new.starts == NOW and got.new.ends == NOW + 4 * 3600 and got.new.recovers is None
    assert got.new.author == "@ana" and "from Slack" in got.new.comment and ANA in got.new.comment and "UTC" in got.new.comment
    assert got.line.startswith("silenced 4 h by @ana at <!date^")


def test_silence_this_rule_matches_the_run_and_rule_as_the_alerts_own_command_does():
    got = decide(_click(SILENCE_RULE), _facts())
    inc = _incident().incident
    hint = message.escape(" ".join(["--run", inc.run, "--rule", inc.rule]))
    assert (got.new.run, got.new.rule) == (inc.run, inc.rule) and hint.split()[-1] == got.new.rule


def test_silence_until_it_recovers_names_the_incident_and_lasts_a_week_at_most():
    got = decide(_click(SILENCE_RUN, choice="recovers"), _facts())
    assert got.new.recovers == 7 and got.new.ends == NOW + 7 * 86400 and "until it recovers" in got.line


def test_a_run_name_with_glob_characters_is_silenced_literally():
    got = decide(_click(SILENCE_RUN, choice="1h"), _facts(incident=_incident("exp[1]*")))
    assert got.new.run == "exp[[]1][*]"


def test_clicks_of_other_apps_hellos_and_events_are_not_ours():
    assert parse({"type": "hello", "num_connections": 1}) is None
    assert parse({**envelope(ACKNOWLEDGE), "type": "events_api"}) is None
    other = envelope(ACKNOWLEDGE)
    other["payload"]["actions"][0]["action_id"] = "someone_else.approve"
    assert parse(other) is None


def test_a_slash_command_is_parsed_with_its_text():
    got = parse({"envelope_id": "e", "type": "slash_commands", "accepts_response_payload": True,
                 "payload": {"command": "/lossguard", "text": "status exp/7b", "user_id": ANA, "user_name": "ana"}})
    assert got == actions.Command("e", ANA, "ana", "status exp/7b")


def test_the_update_says_what_was_done_keeps_the_rest_and_drops_acknowledge_once_taken():
    click = _click(ACKNOWLEDGE)
    blocks = actions.updated(click, ["acknowledged by @ana at 03:12"], acknowledged=True)
    assert blocks[0]["type"] == "header" and blocks[-2]["elements"][0]["text"] == "acknowledged by @ana at 03:12"
    assert [e["action_id"] for e in blocks[-1]["elements"]] == [SILENCE_RUN, SILENCE_RULE]
    again = actions.updated(replace(click, blocks=blocks), ["acknowledged by @ana at 03:12"], acknowledged=True)
    assert again == blocks  # a retried envelope updates the message to the same message


def test_the_update_says_every_line_the_state_holds_whatever_copy_of_the_message_was_clicked():
    first = actions.updated(_click(SILENCE_RUN, choice="1h"), ["silenced 1 h by @ana"], acknowledged=False)
    # Bob clicked the copy from before Ana's click: the state's lines are what the message says.
    second = actions.updated(_click(ACKNOWLEDGE), ["silenced 1 h by @ana", "acknowledged by @bob"], acknowledged=True)
    said = [b for b in second if b.get("block_id") == actions.SAID]
    assert [e["text"] for e in said[0]["elements"]] == ["silenced 1 h by @ana", "acknowledged by @bob"] and len(said) == 1
    assert len(second) == len(first) and second[-1]["type"] == "actions"


def test_a_header_rewritten_keeps_the_lines_said_above_its_buttons():
    plain = ({"type": "header", "text": {"type": "plain_text", "text": "resolved"}}, {"type": "context", "elements": []})
    assert actions.said_in(plain, []) == plain  # nothing said: the message as it was built, byte for byte
    kept = actions.said_in((*plain, actions.buttons("k-1")), ["silenced 4 h by @ana"])
    assert [b.get("block_id") for b in kept][-2:] == [actions.SAID, "lossguard|k-1"]


HOSTILE = "<!channel> *all* & `x` <https://evil|click>"


@pytest.mark.parametrize("action, choice, facts", [
    pytest.param(actions.SHOW_PLOT, None, {}, id="show the plot"),
    pytest.param(ACKNOWLEDGE, None, {}, id="acknowledge"),
    pytest.param(ACKNOWLEDGE, None, {"acked_by": "@<!here>"}, id="acknowledged already"),
    pytest.param(SILENCE_RUN, "4h", {}, id="silence the run"),
    pytest.param(SILENCE_RULE, None, {}, id="silence the rule"),
    pytest.param(SILENCE_RUN, "recovers", {"status": "resolved"}, id="recovered already"),
    pytest.param(SILENCE_RUN, "<!everyone>", {}, id="a choice no menu offers"),
])
def test_a_reply_shows_a_hostile_run_name_as_text_never_as_a_mention_or_markup(action, choice, facts):
    row = _incident(HOSTILE, status=facts.pop("status", "open"))
    got = decide(_click(action, choice=choice), _facts(incident=row, **facts))
    assert "<!" not in got.reply and "<http" not in got.reply and " & " not in got.reply, got.reply
    assert "&lt;!channel&gt;" in got.reply or "&lt;!here&gt;" in got.reply or "&lt;!everyone&gt;" in got.reply


def test_a_member_of_a_user_group_slack_would_not_name_is_refused_and_told_why():
    got = decide(_click(SILENCE_RUN, choice="4h", user="U0BOB00001"), _facts(unchecked=frozenset({"S0ONCALL01"})))
    assert got == Refuse(actions.UNCHECKED.format(groups="S0ONCALL01"))


def test_a_run_name_with_a_control_character_is_silenced_for_that_run_only():
    got = decide(_click(SILENCE_RUN, choice="1h"), _facts(incident=_incident("exp\x1b7b`")))
    silence = Silence(1, got.new.run, None, None, None, NOW, NOW + 3600, "c")
    assert silence.matches(Notice("stalled", "exp\x1b7b`", step=1))
    assert not silence.matches(Notice("stalled", "expX7b`", step=1)) and not silence.matches(Notice("stalled", "exp\x1b7bX", step=1))


def _sink(slack, *, buttons: bool) -> SlackSink:
    return SlackSink(SlackBot("xoxb-1-SECRET", "#training", base_url=slack.base_url), buttons=buttons)


def _post(kind: str = "opened") -> Post:
    inc = _incident().incident
    return Post((OutboxEntry(12, 7, "slack", Notice(kind, inc.run, inc, source="/runs/a.log"), 0, key=f"{STATE}-12"),), channel="#training")


def test_without_the_app_token_an_alert_is_byte_for_byte_what_it_was(slack):
    sink = _sink(slack, buttons=False)
    sink.send(_post())
    (req,) = slack.requests
    from lossguard import silences
    from lossguard.version import __version__

    hint = silences.command_for(_post().notice)
    want = message.for_notice(_post().notice, host=sink.host, version=__version__, silence=hint)
    assert req.body["text"] == want.text and req.body["blocks"] == json.loads(json.dumps(list(want.blocks)))
    assert "actions" not in json.dumps(req.body["blocks"])


def test_with_the_app_token_the_alert_gains_its_buttons_last_and_nothing_else(slack):
    _sink(slack, buttons=False).send(_post())
    _sink(slack, buttons=True).send(_post())
    plain, with_buttons = slack.requests
    assert with_buttons.body["text"] == plain.body["text"]
    assert with_buttons.body["blocks"][:-1] == plain.body["blocks"]
    block = with_buttons.body["blocks"][-1]
    assert block["type"] == "actions" and block["block_id"] == f"lossguard|{STATE}-7"
    assert [e["action_id"] for e in block["elements"]] == [SILENCE_RUN, SILENCE_RULE, ACKNOWLEDGE]


def test_a_resolution_carries_no_buttons(slack):
    _sink(slack, buttons=True).send(_post("resolved"))
    assert "actions" not in json.dumps(slack.requests[0].body["blocks"])
