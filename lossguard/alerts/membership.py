"""Who is in the user groups slack_actors lists, as Slack says (usergroups.users.list), kept so that
asking never delays an ack.

Slack wants an envelope acked within 3 s, and a lookup may take the Web API's whole timeout (a
Slack answering 503 after 4 s): asked on the link's one thread before each ack, three clicks by
people not listed held the on-call's ack for 90 s. So a click that needs a group's members while
what is known of them is over is acked at once and decided after the lookup, on a worker of its
own (alerts.clicks). What Slack answers is kept GROUPS_FOR; that it would not answer is kept too,
FAILED_FOR, so a burst of clicks while Slack fails asks once, not once a click. A group whose
members are not known is never taken on what it was: its members' clicks are refused (and told
why) until Slack names them again."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable

from .delivery import Delivery

log = logging.getLogger("lossguard")
GROUPS_FOR = 300.0
"""Seconds a user group's members are trusted before they are asked again."""
FAILED_FOR = 30.0
"""Seconds after Slack would not name a group's members before it is asked again."""

Groups = tuple[frozenset[str], frozenset[str]]
"""(the listed groups a user is in, the listed groups whose members Slack would not name)."""


class Membership:
    def __init__(self, groups: Iterable[str], ask: Callable[[str], frozenset[str] | Delivery], *, clock: Callable[[], float]) -> None:
        self.groups = tuple(groups)
        self._ask, self._clock = ask, clock
        self._known: dict[str, tuple[float, frozenset[str] | None]] = {}
        """group -> (known until, its members; None: Slack would not say)."""
        self._lock = threading.Lock()  # (the lookup worker writes, the link's thread reads)

    def of(self, user: str, *, settled: bool = False) -> Groups | None:
        """What is known now of `user`'s groups; None when a group must be asked first (`settled`:
        never None, a group not known counting as one Slack would not name). A user found in one
        group is not kept waiting for the others."""
        now, mine, unknown, stale = self._clock(), set(), set(), False
        with self._lock:
            for group in self.groups:
                until, members = self._known.get(group, (-math.inf, None))
                if now >= until and not settled:
                    stale = True
                elif now >= until or members is None:
                    unknown.add(group)
                elif user in members:
                    mine.add(group)
        if mine:
            return frozenset(mine), frozenset()
        return None if stale else (frozenset(), frozenset(unknown))

    def refresh(self) -> None:
        """Asks Slack about each group whose knowledge is over, one at a time (on the lookup worker:
        a click queued behind one that asked finds the answer kept)."""
        for group in self.groups:
            with self._lock:
                if self._clock() < self._known.get(group, (-math.inf, None))[0]:
                    continue
            answer = self._ask(group)
            if isinstance(answer, Delivery):
                log.warning("Slack would not say who is in user group %s (%s; the bot needs usergroups:read): its members' clicks are "
                            "refused, asked again in %.0f s", group, answer.error or "no answer", FAILED_FOR)
                kept = (self._clock() + FAILED_FOR, None)
            else:
                kept = (self._clock() + GROUPS_FOR, answer)
            with self._lock:
                self._known[group] = kept
