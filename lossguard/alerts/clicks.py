"""A click from Slack applied: the facts looked up in the state, the pure decision (alerts.actions)
taken, its change committed with the envelope's id, then (after the ack, on threads of our own:
alerts.followups) the alert updated in place and the clicker answered in one ephemeral line.

Exactly once: the change and the envelope commit in one transaction (state.clicks), and the ack is
sent only after that commit. An envelope Slack sends again (the ack never came: a kill, a dropped
link) finds its row: nothing is applied a second time, and the update and the answer it may have
missed are given again. The update is built from the state as it goes out (every line said on
the message, whether the incident is still open), so it is the same message whatever order the
follow-ups run in, and never reopens an alert whose incident is over."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from ..escaping import printable
from ..state import State, StateBusy
from . import actions
from .followups import FollowUps, unexpected
from .membership import Groups, Membership
from .message import Message, escape
from .slack import SlackBot

log = logging.getLogger("lossguard")
KILL_AT = "LOSSGUARD_TEST_KILL_AT"
"""A test hook: `before-ack` makes the daemon SIGKILL itself once a click is committed, before its
ack is sent (Slack then sends the envelope again)."""
LOOKUPS = 64
"""Clicks waiting for Slack to name a user group's members; past that one is answered BUSY."""

Then = Callable[[], None] | None
COULD_NOT = "lossguard could not take this click; see its log."
"""The answer to a click that failed for a reason nobody foresaw (acked: Slack would only send it again)."""
AGAIN_LATER = "try again in a minute."
BUSY = f"lossguard has too many clicks waiting for Slack to name a user group's members: nothing changed; {AGAIN_LATER}"
AGAIN = "click Show the plot again to try again."
"""A new click draws the plot again; Slack's retry of the same envelope does not (exactly once)."""


class ClickHandler:
    """What the Socket Mode link calls for every envelope, one at a time (its own state connection);
    a click that must wait for Slack to name a user group's members is acked at once and decided
    on a lookup worker of its own (alerts.membership); what follows a click's ack runs on its own
    bounded threads (alerts.followups)."""

    def __init__(self, state: State, bot: SlackBot, *, actors: list[str], rules: Callable[[], list[tuple[str, str]]],
                 causes: list[str], status: Callable[[str], str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.state, self.bot, self.rules, self.causes, self.clock = state, bot, rules, tuple(causes), clock
        self.actors = frozenset(actors)
        self.status = status
        """`/lossguard status [RUN]`'s answer (None: the command is not offered)."""
        self._lock = threading.Lock()
        self.membership = Membership(sorted(a for a in self.actors if a.startswith("S")), bot.group_members, clock=clock)
        self.follow_ups = FollowUps()
        self.lookups = FollowUps(workers=1, pending=LOOKUPS, name="slack-lookup",
                                 what="a click waiting for Slack to name a user group's members")
        self._closed = False

    def __call__(self, envelope: dict) -> tuple[dict | None, Then]:
        parsed = _parsed(envelope)
        if parsed is None:
            return None, None
        with self._lock:
            if self._closed:  # (not acked: Slack sends it again, to the daemon that comes back)
                raise StateBusy("lossguard is stopping")
            groups = self._groups_of(parsed.user)
            if groups is not None:
                return self._apply(parsed, groups)
        # Slack must name a group's members first: acked now (Slack wants it within 3 s whatever
        # the lookup takes), decided on the lookup worker. A daemon killed meanwhile loses it.
        if not self.lookups.submit(lambda: self._after_lookup(parsed)):
            if isinstance(parsed, actions.Command):
                return {"response_type": "ephemeral", "text": BUSY}, None
            return None, self._afterwards(parsed, {"reply": BUSY})
        log.info("a click from Slack (envelope %s) waits for Slack to name the members of %s: acknowledged now, decided after",
                 printable(parsed.envelope_id)[:80], ", ".join(self.membership.groups))
        return None, None

    def _apply(self, parsed: actions.Click | actions.Command, groups: Groups) -> tuple[dict | None, Then]:
        """The click decided and committed (under the lock), or the command answered."""
        try:
            if isinstance(parsed, actions.Command):
                return self._command(parsed, groups), None
            return None, self._click(parsed, groups)
        except StateBusy as exc:  # (not acked: Slack sends it again, when the state can be written)
            log.warning("a click from Slack waits: %s", exc)
            raise
        except Exception as exc:  # noqa: BLE001 - acked, or Slack would send what cannot be applied again and again
            unexpected(f"a click from Slack could not be applied (envelope {parsed.envelope_id}); it is acknowledged and dropped", exc)
            if isinstance(parsed, actions.Command):
                return {"response_type": "ephemeral", "text": COULD_NOT}, None
            return None, self._afterwards(parsed, {"reply": COULD_NOT})

    def _after_lookup(self, parsed: actions.Click | actions.Command) -> None:
        """On the lookup worker: the groups asked of Slack (those whose knowledge is over; a click
        queued behind finds them known), then the click decided and applied as any other, its
        answer posted (acked already: a command's answer goes as an ephemeral line)."""
        self.membership.refresh()
        with self._lock:
            if self._closed:
                log.warning("a click from Slack (envelope %s) was acknowledged but not applied: lossguard stopped meanwhile",
                            printable(parsed.envelope_id)[:80])
                return
            try:
                payload, then = self._apply(parsed, self._groups_of(parsed.user, settled=True))
            except StateBusy:  # (acked already: Slack will not send it again)
                payload, then = {"text": f"lossguard could not take this now (its state is busy): nothing changed; {AGAIN_LATER}"}, None
        if payload is not None and isinstance(parsed, actions.Command):
            then = self._told(parsed.user, parsed.channel, payload["text"])
        elif payload is not None:
            then = self._afterwards(parsed, {"reply": payload["text"]})
        if then is not None:
            then()

    def _told(self, user: str, channel: str | None, text: str) -> Then:
        """`text` posted to `user` only, in `channel`, on a follow-up thread."""
        if not channel:
            return None

        def tell() -> None:
            delivery = self.bot.ephemeral(text, channel=channel, user=user)
            if not delivery.ok:
                log.warning("the answer to a command from Slack could not be posted: %s", delivery.describe())

        return lambda: self.follow_ups.submit(tell)

    def close(self, timeout: float = 5.0) -> None:
        """No more envelopes taken (those that come are left for Slack to send again); the one being
        applied, the lookups and the follow-ups under way get up to `timeout` s, so the state is
        closed under none of them."""
        deadline = time.monotonic() + timeout
        if self._lock.acquire(timeout=timeout):
            self._closed = True
            self._lock.release()
        else:
            self._closed = True
            log.warning("a click from Slack was still being applied after %.0f s as lossguard stopped", timeout)
        if not self.lookups.close(max(0.0, deadline - time.monotonic())):
            log.warning("a lookup of a user group's members was still under way as lossguard stopped")
        if not self.follow_ups.close(max(0.0, deadline - time.monotonic())):
            log.warning("a click's follow-up was still under way as lossguard stopped")

    def _click(self, click: actions.Click, groups: Groups) -> Then:
        recorded = self.state.envelope_reply(click.envelope_id)
        if recorded is not None:
            log.info("envelope %s from Slack was applied already: answered again, nothing applied twice", click.envelope_id)
            return self._afterwards(click, {**json.loads(recorded), "plot": None})  # (a picture is not drawn a second time)
        now = self.clock()
        decision = actions.decide(click, self._facts(click, now, groups))
        done = {"reply": decision.reply, "line": getattr(decision, "line", None), "acked": isinstance(decision, actions.Acknowledge),
                "plot": decision.incident_id if isinstance(decision, actions.ShowPlot) else None}
        recorded = json.dumps(done)
        said = (click.channel, click.ts, done["line"]) if done["line"] and click.channel and click.ts else None
        if isinstance(decision, actions.MakeSilence):
            s = self.state.apply_silence(click.envelope_id, decision.new, reply=recorded, now=now, said=said)
            if s is not None:
                log.info("silence %s added from Slack", s.describe())
        elif isinstance(decision, actions.Acknowledge):
            self.state.acknowledge(click.envelope_id, decision.incident_id, by=decision.by, reply=recorded, now=now, said=said)
            log.info("incident %s acknowledged from Slack by %s", decision.incident_id, decision.by)
        elif isinstance(decision, actions.ShowPlot):
            self.state.answered(click.envelope_id, reply=recorded, now=now)
        # (a refusal changed nothing and stores nothing: its retry is refused again)
        if os.environ.get(KILL_AT) == "before-ack":
            os.kill(os.getpid(), signal.SIGKILL)
        return self._afterwards(click, done)

    def _facts(self, click: actions.Click, now: float, groups: Groups) -> actions.Facts:
        _, _, ident = click.key.rpartition("-")
        found = self.state.clicked_incident(int(ident)) if ident.isdigit() else None
        row, acked_by = found if found is not None else (None, None)
        return actions.Facts(self.state.id, row, acked_by, self.actors, *groups, rules=tuple(self.rules()), causes=self.causes, now=now)

    def _groups_of(self, user: str, *, settled: bool = False) -> Groups | None:
        """The user groups listed in slack_actors that `user` is in, and those Slack would not name
        the members of; None when Slack must be asked first. Nothing asked for a user listed by ID."""
        if user in self.actors or not self.membership.groups:
            return frozenset(), frozenset()
        return self.membership.of(user, settled=settled)

    def _afterwards(self, click: actions.Click, done: dict) -> Then:
        """After the ack, on a follow-up thread: the alert updated in place (when something was done
        and the incident is still open) and the clicker told."""

        def then() -> None:
            if done.get("line") and click.channel and click.ts:
                self._update(click, acknowledged=bool(done.get("acked")))
            if click.channel:
                delivery = self.bot.ephemeral(done["reply"], channel=click.channel, user=click.user)
                if not delivery.ok:
                    log.warning("the answer to a click from Slack could not be posted: %s", delivery.describe())
            if done.get("plot") is not None and click.channel and click.ts:
                self._show_plot(click, int(done["plot"]))

        def after_ack() -> None:
            self.follow_ups.submit(then)

        return after_ack

    def _update(self, click: actions.Click, *, acknowledged: bool) -> None:
        """The clicked message with every line the state holds for it, read as the update goes out:
        not at all once the incident is over (its resolution rewrote the alert, said lines kept; a
        click on an old copy must not bring the open alert back)."""
        _, _, ident = click.key.rpartition("-")
        with self._lock:
            found = self.state.clicked_incident(int(ident)) if ident.isdigit() else None
            said = self.state.said(f"{click.channel}|{click.ts}")
        if found is None or found[0].status != "open":
            log.info("the alert a click acted on is not updated: its incident is no longer open")
            return
        blocks = actions.updated(click, said, acknowledged=acknowledged or found[1] is not None)
        delivery = self.bot.update(Message(click.text, blocks), ts=click.ts, channel=click.channel)
        if not delivery.ok:
            log.warning("the alert a click acted on could not be updated: %s", delivery.describe())

    def _show_plot(self, click: actions.Click, incident_id: int) -> None:
        """The incident's curves as the state holds them now (its streams' tails), drawn in a child
        process and uploaded into the alert's thread; the file is removed once uploaded."""
        import tempfile
        from pathlib import Path

        from .picture import PANELS, PlotError, draw, picture

        with self._lock:
            found = self.state.clicked_incident(incident_id)
            inc = found[0].incident if found else None
            tails = self.state.tails_of([inc.run], sorted({inc.metric, *PANELS})) if inc else {}
        pic = picture(inc, {m: (t.steps, t.values) for (_, m), t in tails.items()}) if inc else None
        if pic is None:
            self.bot.ephemeral("lossguard no longer holds the curve of this incident.", channel=click.channel, user=click.user)
            return
        folder = self.state.directory / "plots"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                path = draw(pic, Path(tmp) / f"incident-{incident_id}.png", cache_dir=folder / ".matplotlib")
                delivery = self.bot.upload(path, channel=click.channel, thread_ts=click.ts, title=f"{inc.run}: {inc.metric} around step {inc.step}")
        except (PlotError, OSError) as exc:
            log.warning("the plot a click asked for could not be drawn: %s", exc)
            self.bot.ephemeral(f"lossguard could not draw the plot; {AGAIN}", channel=click.channel, user=click.user)
            return
        if not delivery.ok:
            log.warning("the plot a click asked for could not be uploaded: %s", delivery.describe())
            self.bot.ephemeral(f"lossguard could not upload the plot ({escape(delivery.error or 'no answer')}); {AGAIN}", channel=click.channel, user=click.user)

    def _command(self, command: actions.Command, known: Groups) -> dict:
        """`/lossguard status [RUN]`, answered in the ack (ephemeral), from the state."""
        groups, unchecked = known
        if command.user not in self.actors and not groups:
            text = actions.refusal(unchecked).reply
        elif self.status is None:
            text = "lossguard answers no commands here."
        else:
            verb, _, run = command.text.strip().partition(" ")
            text = self.status(run.strip()) if verb in ("", "status") else "Usage: `/lossguard status [RUN]` (RUN: a run name or a glob)"
        return {"response_type": "ephemeral", "text": text}


def _parsed(envelope: dict) -> actions.Click | actions.Command | None:
    """The click or command, or None (not ours; or ours and unreadable: said in one line, naming
    the field but no value, and acked, so that Slack does not send it again and again)."""
    try:
        parsed = actions.parse(envelope)
    except Exception as exc:  # noqa: BLE001 - a reading nobody foresaw costs this envelope, acked, not the link
        unexpected(f"an envelope from Slack could not be read (envelope {printable(str(envelope.get('envelope_id')))[:80]}); "
                   "it is acknowledged and dropped", exc)
        return None
    if isinstance(parsed, actions.Unreadable):
        log.warning("an envelope from Slack (%s, envelope %s) is refused: %s; acknowledged, nothing applied",
                    printable(parsed.kind), printable(parsed.envelope_id)[:80], parsed.why)
        return None
    return parsed


STATUS_SHOWN = 20


def status_text(state: State, run: str = "") -> str:
    """`/lossguard status [RUN]`: the open incidents (of runs matching RUN) and the silences in
    force, as mrkdwn (names escaped)."""
    from fnmatch import fnmatchcase

    from .message import code, escape

    pattern = run or "*"
    incidents, stalled = state.firing()
    incidents = [r for r in incidents if fnmatchcase(r.incident.run, pattern)]
    silences = [s for s in state.silences(now=time.time()) if run == "" or fnmatchcase(run, s.run)]
    lines = [f"*{len(incidents)} open incident(s)*" + (f" in runs matching {code(run)}" if run else "")]
    lines += [f"• {code(r.incident.run)} step {r.incident.step}, rule {code(r.incident.rule)}" for r in incidents[:STATUS_SHOWN]]
    if len(incidents) > STATUS_SHOWN:
        lines.append(f"… and {len(incidents) - STATUS_SHOWN} more (`lossguard status` on the box)")
    stalled = [r for r in stalled if fnmatchcase(r.run, pattern)]
    if stalled:
        lines.append(f"*{len(stalled)} stalled run(s)*: " + ", ".join(code(r.run) for r in stalled[:STATUS_SHOWN]))
    lines.append(f"*{len(silences)} silence(s) in force*")
    lines += [f"• {escape(s.describe())}" for s in silences[:STATUS_SHOWN]]
    return "\n".join(lines)
