"""The buttons on an alert and what a click on one does, as a pure decision: an envelope
Slack sent down the Socket Mode link, and what the state says (the incident, who may act, the rules
in force, the clock), in; what to do out: refuse in one ephemeral line, make a silence, or
acknowledge the incident. No I/O, no clock of its own: `alerts.clicks` looks the facts up, applies
the decision and answers Slack.

A click makes the silence `lossguard silence add` makes for the same matchers (`silences.new_silence`,
the glob of the run and of the rule the alert's own command shows), with who clicked and when in
its comment, so `silence list` and `status` show it as any other. The buttons carry only the
incident's key (`<state id>-<incident id>`, in the actions block's id): run, rule and whether the
incident is still open are read from the state at the click, never trusted from the message.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError
from ..silences import NewSilence, literal_glob, new_silence
from ..state import IncidentRow
from .message import MAX_BLOCKS, escape

SILENCE_RUN = "lossguard.silence_run"
SILENCE_RULE = "lossguard.silence_rule"
ACKNOWLEDGE = "lossguard.acknowledge"
SHOW_PLOT = "lossguard.show_plot"
ACTIONS = (SILENCE_RUN, SILENCE_RULE, ACKNOWLEDGE, SHOW_PLOT)
BLOCK = "lossguard|"
"""The actions block's id starts so; the incident's key follows."""
SAID = "lossguard-said"
"""The id of the context block that says what was done from Slack (`silenced 4 h by @ana at 03:12`)."""
SAID_SHOWN = 10
"""A context block holds at most 10 elements: the latest lines said."""
CHOICES = {"1h": ("1 h", 3600.0), "4h": ("4 h", 4 * 3600.0), "recovers": ("until it recovers", 7 * 86400.0)}
"""The run menu's options: the words the message says, and how long the silence may last (until it
recovers: at most a week, so a run that never recovers is not silenced for good by one click)."""
RULE_FOR = "4h"
EXPIRES = 30 * 60.0
"""A click older than this (made while the daemon was down, retried by Slack when it came back) is
answered as expired: whoever clicked has moved on, and may have silenced it by hand meanwhile."""
REFUSED = "You may not silence lossguard alerts here (ask to be listed in slack_actors)."
UNCHECKED = ("lossguard could not ask Slack who is in the user group {groups} (usergroups:read; see its log), so it "
             "refuses for now: nothing changed. Try again in a few minutes.")
"""A user group's members unknown (Slack would not say): refused, never taken on old membership."""


def key_of(state_id: str, incident_id: int) -> str:
    return f"{state_id}-{incident_id}"


def _text(words: str) -> dict:
    return {"type": "plain_text", "text": words, "emoji": True}


def buttons(key: str, *, acknowledged: bool = False, plot: bool = False) -> dict:
    """The actions block of an incident's alert (`acknowledged`: without the Acknowledge button;
    `plot`: with Show the plot, where no picture follows the alert by itself: `plots = false`)."""
    menu = {"type": "static_select", "action_id": SILENCE_RUN, "placeholder": _text("Silence this run"),
            "options": [{"text": _text(f"Silence this run {words}"), "value": value} for value, (words, _) in CHOICES.items()]}
    rule = {"type": "button", "action_id": SILENCE_RULE, "text": _text(f"Silence this rule {CHOICES[RULE_FOR][0]}"), "value": key}
    elements = [menu, rule]
    if not acknowledged:
        elements.append({"type": "button", "action_id": ACKNOWLEDGE, "text": _text("Acknowledge"), "style": "primary", "value": key})
    if plot:
        elements.append({"type": "button", "action_id": SHOW_PLOT, "text": _text("Show the plot"), "value": key})
    return {"type": "actions", "block_id": f"{BLOCK}{key}", "elements": elements}


@dataclass(frozen=True)
class Click:
    """A button clicked (or an option chosen) on one of our alerts, as Slack sent it."""

    envelope_id: str
    action: str
    key: str
    user: str
    name: str
    choice: str | None = None
    channel: str | None = None
    ts: str | None = None
    """The message clicked on (channel and ts): the one updated in place."""
    clicked_at: float | None = None
    text: str = ""
    blocks: tuple[dict, ...] = ()


@dataclass(frozen=True)
class Command:
    """`/lossguard status [RUN]`, typed in Slack."""

    envelope_id: str
    user: str
    name: str
    text: str
    channel: str | None = None
    """Where it was typed (an answer that cannot go in the ack goes there, seen by `user` only)."""


@dataclass(frozen=True)
class Unreadable:
    """An envelope meant for lossguard (a click on its buttons, its command) whose fields are not
    what Slack sends (a user that is a string, an option that is no object): acked, so that Slack
    does not send it again and again, and refused."""

    envelope_id: str
    kind: str
    why: str
    """Which field is wrong and how, naming no value (an envelope holds capabilities)."""


class _Bad(ValueError):
    """A field of an envelope is not what Slack sends."""


_KINDS = {dict: "an object", list: "an array", str: "a string"}


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return _KINDS.get(type(value), type(value).__name__)


def _field(parent: dict, key: str, where: str, kind: type, default: object = None):  # noqa: ANN202 - (kind's type)
    """`parent[key]` when it is of `kind`, `default` when absent or null; else the envelope is unreadable."""
    value = parent.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise _Bad(f"{where}.{key} is {_json_kind(value)}, not {_KINDS[kind]}")
    return value


def parse(envelope: dict) -> Click | Command | Unreadable | None:
    """Ours, None (a hello, an event, a click on a button of another app or an older layout), or
    Unreadable (ours, with a field that is not what Slack sends)."""
    kind, envelope_id = envelope.get("type"), envelope.get("envelope_id")
    if not isinstance(envelope_id, str) or kind not in ("interactive", "slash_commands"):
        return None
    try:
        payload = _field(envelope, "payload", "envelope", dict)
        if payload is None:
            raise _Bad("the envelope has no payload")
        return _command(envelope_id, payload) if kind == "slash_commands" else _click(envelope_id, payload)
    except _Bad as exc:
        return Unreadable(envelope_id, kind, str(exc))


def _command(envelope_id: str, payload: dict) -> Command:
    return Command(envelope_id, _field(payload, "user_id", "payload", str, ""), _field(payload, "user_name", "payload", str, ""),
                   _field(payload, "text", "payload", str, ""), channel=_field(payload, "channel_id", "payload", str))


def _click(envelope_id: str, payload: dict) -> Click | None:
    if payload.get("type") != "block_actions":
        return None
    action = next((a for a in _field(payload, "actions", "payload", list, []) if isinstance(a, dict) and a.get("action_id") in ACTIONS), None)
    if action is None or not _field(action, "block_id", "action", str, "").startswith(BLOCK):
        return None
    user = _field(payload, "user", "payload", dict, {})
    if not (user_id := _field(user, "id", "payload.user", str, "")):
        raise _Bad("payload.user has no id")
    container = _field(payload, "container", "payload", dict, {})
    message = _field(payload, "message", "payload", dict, {})
    selected = _field(action, "selected_option", "action", dict, {})
    try:
        clicked_at = float(action.get("action_ts"))
    except (TypeError, ValueError):
        clicked_at = None
    return Click(
        envelope_id, action["action_id"], action["block_id"].removeprefix(BLOCK), user_id,
        _field(user, "username", "payload.user", str) or _field(user, "name", "payload.user", str) or user_id,
        choice=_field(selected, "value", "action.selected_option", str),
        channel=_field(container, "channel_id", "payload.container", str) or _field(_field(payload, "channel", "payload", dict, {}), "id", "payload.channel", str),
        ts=_field(container, "message_ts", "payload.container", str) or _field(message, "ts", "payload.message", str), clicked_at=clicked_at,
        text=_field(message, "text", "payload.message", str, ""), blocks=tuple(b for b in _field(message, "blocks", "payload.message", list, []) if isinstance(b, dict)),
    )


@dataclass(frozen=True)
class Facts:
    """What the state and the settings say at the click."""

    state_id: str
    incident: IncidentRow | None
    acked_by: str | None
    actors: frozenset[str]
    groups: frozenset[str] = frozenset()
    """The user groups of `actors` the clicker is in."""
    unchecked: frozenset[str] = frozenset()
    """The user groups of `actors` whose members Slack would not say at the click (the clicker may be in one)."""
    rules: tuple[tuple[str, str], ...] = ()
    """(name, metric) of the rules in force."""
    causes: tuple[str, ...] = ()
    now: float = 0.0


@dataclass(frozen=True)
class Refuse:
    reply: str


@dataclass(frozen=True)
class MakeSilence:
    new: NewSilence
    reply: str
    line: str
    """What the alert says from now on (`silenced 4 h by @ana at 03:12`)."""


@dataclass(frozen=True)
class Acknowledge:
    incident_id: int
    by: str
    reply: str
    line: str


@dataclass(frozen=True)
class ShowPlot:
    incident_id: int
    reply: str


Decision = Refuse | MakeSilence | Acknowledge | ShowPlot


def _at(now: float) -> str:
    """The time in each reader's own zone (Slack's date formatting), UTC where it cannot."""
    return f"<!date^{int(now)}^{{time}}|{time.strftime('%H:%M UTC', time.gmtime(now))}>"


def allowed(user: str, facts: Facts) -> bool:
    return user in facts.actors or bool(facts.groups & facts.actors)


def refusal(unchecked: frozenset[str] = frozenset()) -> Refuse:
    """Why someone not allowed is refused: not listed, or perhaps listed through a user group whose
    members Slack would not name (`unchecked`)."""
    if unchecked:
        return Refuse(UNCHECKED.format(groups=", ".join(sorted(unchecked))))
    return Refuse(REFUSED)


def decide(click: Click, facts: Facts) -> Decision:
    """What a click does. Refused, changing nothing, when the clicker is not listed, the click is
    older than EXPIRES, the state holds no such incident (started over, or pruned), or the silence
    would hold nothing (its rule is no longer in force; the incident recovered already)."""
    if not allowed(click.user, facts):
        return refusal(facts.unchecked)
    if click.clicked_at is not None and facts.now - click.clicked_at > EXPIRES:
        return Refuse(f"This button expired: it was clicked {int((facts.now - click.clicked_at) // 60)} min ago, "
                      "while lossguard could not take it. Nothing changed; click again if it still holds.")
    state_id, _, ident = click.key.rpartition("-")
    row = facts.incident
    if state_id != facts.state_id or row is None or not ident.isdigit() or row.id != int(ident):
        return Refuse("lossguard no longer holds this incident (its state was started over): nothing changed.")
    inc = row.incident
    run, who = escape(inc.run), f"@{click.name}"  # (names from disk, and Slack's, are data: mrkdwn-escaped in every reply)
    if click.action == SHOW_PLOT:
        return ShowPlot(row.id, f"The curves of {run} around step {inc.step}, as lossguard holds them now, follow in the alert's thread.")
    if click.action == ACKNOWLEDGE:
        if facts.acked_by is not None:
            return Refuse(f"Already acknowledged by {escape(facts.acked_by)}.")
        return Acknowledge(row.id, who, f"You took {run} ({escape(inc.rule)}): its updates are no longer posted.", f"acknowledged by {escape(who)} at {_at(facts.now)}")
    choice = click.choice if click.action == SILENCE_RUN else RULE_FOR
    if choice not in CHOICES:
        return Refuse(f"lossguard does not know the choice {escape(repr(choice))}: nothing changed.")
    words, seconds = CHOICES[choice]
    recovers = row.id if choice == "recovers" else None
    if recovers is not None and row.status != "open":
        return Refuse(f"{run} has recovered already: a silence until it recovers would hold nothing.")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(facts.now))
    # (exact globs: a silence made by a click holds this run and rule only, whatever characters they have)
    rule = literal_glob(inc.rule, copyable=False) if click.action == SILENCE_RULE else None
    try:
        new = new_silence(run=literal_glob(inc.run, copyable=False), rule=rule, ends=facts.now + seconds, now=facts.now, author=who,
                          comment=f"from Slack at {stamp} by {who} ({click.user})", rules=list(facts.rules) if rule else None,
                          causes=list(facts.causes), recovers=recovers)
    except UsageError as exc:
        return Refuse(f"That silence would hold nothing ({escape(str(exc))}): nothing changed.")
    what = f"rule {escape(inc.rule)} of {run}" if rule else f"run {run}"
    return MakeSilence(new, f"Silenced the {what} {words} (`lossguard silence list` shows it).",
                       f"silenced {words} by {escape(who)} at {_at(facts.now)}" + (f" (rule {escape(inc.rule)})" if rule else ""))


def updated(click: Click, said: Sequence[str], *, acknowledged: bool) -> tuple[dict, ...]:
    """The clicked alert's blocks with what was done from Slack said under them (`said`: every line
    the state holds for this message, so an update is the same whatever order the clicks' updates
    go out in, and a retried envelope's is the same message again), and its buttons (Acknowledge gone
    once someone took it); the rest as Slack holds it, so a header the daemon rewrote stays. The
    caller sends it only while the incident is open: a click on an old copy of a resolved alert
    must not bring its buttons and open header back."""
    ours = next((b for b in click.blocks if str(b.get("block_id", "")).startswith(BLOCK)), None)
    had = {e.get("action_id") for e in ours.get("elements", ())} if ours is not None else {ACKNOWLEDGE}
    was_acked = ACKNOWLEDGE not in had
    blocks = [b for b in click.blocks if b is not ours]
    blocks.append(buttons(click.key, acknowledged=acknowledged or was_acked, plot=SHOW_PLOT in had))
    return said_in(blocks, said)


def said_in(blocks: Sequence[dict], said: Sequence[str]) -> tuple[dict, ...]:
    """`blocks` with the lines said from Slack in one context block, above the buttons if there are
    any (any such block they had is replaced): what a click's update and a header the daemon
    rewrites (resolved, escalated) both keep."""
    out = [b for b in blocks if b.get("block_id") != SAID]
    if said:
        block = {"type": "context", "block_id": SAID, "elements": [{"type": "mrkdwn", "text": line} for line in said[-SAID_SHOWN:]]}
        at = next((i for i, b in enumerate(out) if str(b.get("block_id", "")).startswith(BLOCK)), len(out))
        out.insert(at, block)
    return tuple(out if len(out) <= MAX_BLOCKS else out[:1] + out[1 - MAX_BLOCKS:])  # (the header and what was said stay)
