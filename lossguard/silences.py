"""Silences, as Alertmanager's users know them: "not now, I know" for the runs, rules, metrics or
causes an operator names, until a time. Pure: matching, durations and the command an alert shows
to silence it; the state store keeps them (state.py), the delivery pipeline honours them.

A silence hides notifications, never incidents: the daemon still records what it finds, and an
incident still open when its silence ends is reported then, once (not re-alerted as new). It never
hides the resolution of what was already announced (CLOSING). Its window is wall time, as `--for`
and `--until` mean it; once it has ended (expired, or reported as ended) it stays ended, whatever
the clock does later.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase

from .errors import UsageError
from .model import Notice

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
LONGEST = 366 * 86400
"""A silence longer than a year is a typo (`--for 2000h`), or a rule that should be changed instead."""


@dataclass(frozen=True)
class Silence:
    id: int
    run: str
    """A shell glob over run names (`*` silences every run)."""
    rule: str | None
    metric: str | None
    cause: str | None
    starts: float
    ends: float
    comment: str
    author: str = ""
    created: float = 0.0
    expired: float | None = None
    """When an operator ended it early (`silence expire`)."""
    reported: float | None = None
    """When the daemon reported its end (what it held back and was still wrong went out then)."""
    recovers: int | None = None
    """The incident whose recovery ends it (a click on "until it recovers"; state layout 9)."""

    @property
    def end(self) -> float:
        """When it ended or ends, in wall time (what `silence list` shows)."""
        return self.ends if self.expired is None else min(self.ends, self.expired)

    def ended(self, now: float) -> bool:
        """Over for good once expired or reported, whatever the clock says later: a clock stepped
        back into the window of a silence already reported would otherwise have it hold again,
        and what it held then would never be reported (its end was). Otherwise past `ends`, wall
        time as `--for` and `--until` mean it."""
        return self.expired is not None or self.reported is not None or self.ends <= now

    def active(self, now: float) -> bool:
        return not self.ended(now) and self.starts <= now

    def matches(self, notice: Notice) -> bool:
        """Every matcher given must match. A run's own notices (stalled, resumed) have no rule,
        metric or cause: only a silence of the whole run (no other matcher) covers them; a noisy
        run's notice has its rule and the loss, no cause."""
        if not fnmatchcase(notice.run, self.run):
            return False
        inc = notice.incident
        if inc is None and notice.noisy is not None:  # (a noisy run's notice: its rule's, on the loss)
            return self.cause is None and all(p is None or fnmatchcase(v, p) for p, v in ((self.rule, notice.noisy.rule), (self.metric, "loss")))
        if inc is None:
            return self.rule is None and self.metric is None and self.cause is None
        cause = inc.causes[0].cause if inc.causes else "unknown"
        return all(
            pattern is None or fnmatchcase(value, pattern)
            for pattern, value in ((self.rule, inc.rule), (self.metric, inc.metric), (self.cause, cause))
        )

    def matchers(self) -> str:
        """The matchers in words, for `silence list`, `status` and the report when it ends."""
        parts = [f"run={self.run}"] + [f"{k}={v}" for k, v in (("rule", self.rule), ("metric", self.metric), ("cause", self.cause)) if v is not None]
        return " ".join(parts)

    def describe(self) -> str:
        """`#3 (run=exp-* rule=loss-spike, by alice: restarting from 41k)`: the silence in one line."""
        who = f"by {self.author}: " if self.author else ""
        return f"#{self.id} ({self.matchers()}, {who}{self.comment})"

    @classmethod
    def from_json(cls, data: dict) -> Silence:
        """A silence back from `to_json` (whose `ends` is when it ended or ends)."""
        return cls(data["id"], data["run"], data["rule"], data["metric"], data["cause"], data["starts"], data["ends"],
                   data["comment"], data["author"], data["created"], data["expired"], data.get("reported"), data.get("recovers"))

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "run": self.run, "rule": self.rule, "metric": self.metric, "cause": self.cause,
            "starts": self.starts, "ends": self.end, "comment": self.comment, "author": self.author,
            "created": self.created, "expired": self.expired, "reported": self.reported, "recovers": self.recovers,
        }


CLOSING = ("resolved", "resumed")
"""Notices that close what an alert opened. No silence holds one back once its alert went out to
the sink (before the silence, or in the report of an earlier one): a Slack message would stay open
forever, a JSON-lines reader would never see the `resolved`. What was never announced stays held
(and an incident that recovered under its silence is never said). An `updated` or `relabelled` is
held: the silence says "I know"; the report as it ends shows how the incident stands then."""
ANNOUNCING = ("opened", "escalated", "unsilenced", "stalled")
"""Notices that announce what a CLOSING one closes (an incident's alert, a run's stall)."""


def covering(silences: list[Silence], notice: Notice, now: float) -> Silence | None:
    """The active silence that covers `notice` (the one lasting longest, if several do)."""
    hits = [s for s in silences if s.active(now) and s.matches(notice)]
    return max(hits, key=lambda s: (s.end, s.id)) if hits else None


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `2h`, `1h30m`, `1d`, `1w`: seconds."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UsageError(f"--for {text!r}: not a duration (use e.g. 90s, 30m, 2h, 1h30m, 1d)")
    seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if not 0 < seconds <= LONGEST or not math.isfinite(seconds):
        raise UsageError(f"--for {text!r}: a silence lasts more than 0 s and at most a year")
    return seconds


def parse_until(text: str, now: float) -> float:
    """An ISO 8601 time (`2026-12-01T18:00`, `2026-12-01 18:00+01:00`); without a zone, local time."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--until {text!r}: not a time (use ISO 8601, e.g. 2026-12-01T18:00 or 2026-12-01T18:00+01:00)") from None
    try:
        ends = when.timestamp()  # (a naive time is taken as local time, as a person means it)
    except (ValueError, OverflowError, OSError):
        # Only the ends of datetime's range fail (0001-01-01 local time is year 0 in UTC east of
        # it): the end it is at says which of the errors below it is.
        ends = -math.inf if when.year < 5000 else math.inf
    if ends <= now:
        raise UsageError(f"--until {text!r}: that time has passed")
    if ends - now > LONGEST:
        raise UsageError(f"--until {text!r}: a silence lasts at most a year")
    return ends


@dataclass(frozen=True)
class NewSilence:
    """A silence checked and ready to store: what `lossguard silence add` and a click in Slack both
    make (`new_silence`), so the two give the same rows for the same matchers."""

    run: str
    rule: str | None
    metric: str | None
    cause: str | None
    starts: float
    ends: float
    comment: str
    author: str
    recovers: int | None = None


def new_silence(*, run: str, rule: str | None = None, metric: str | None = None, cause: str | None = None, ends: float, now: float,
                comment: str, author: str, rules: list[tuple[str, str]] | None = None, causes: list[str] = (),  # noqa: B006
                recovers: int | None = None) -> NewSilence:
    """A silence from now to `ends`, refused (UsageError) when it would hold nothing: a --rule or
    --metric matching none of the `rules` in force ((name, metric) pairs; None: not checked), a
    --cause lossguard never names, an empty comment. A typo is said now, not found out at the next page."""
    if cause is not None and not any(fnmatchcase(c, cause) for c in causes):
        raise UsageError(f"--cause {cause!r} matches no cause lossguard names (causes: {', '.join(causes)})")
    if not comment.strip():
        raise UsageError("--comment is empty: say why, for whoever is on call next")
    if rules is not None:
        for flag, given, known in (("--rule", rule, [r for r, _ in rules]), ("--metric", metric, sorted({m for _, m in rules}))):
            if given is not None and not any(fnmatchcase(k, given) for k in known):
                raise UsageError(f"{flag} {given!r} matches none of the rules in force ({', '.join(known)})")
    return NewSilence(run, rule, metric, cause, now, ends, comment.strip(), author, recovers)


def literal_glob(name: str, *, copyable: bool = True) -> str:
    """A glob matching `name` only: glob characters of the name itself are bracketed so that they
    match only themselves. `copyable` (the command an alert shows): where a character could not
    travel safely through a shell, a chat message and a copy-paste, any character there (`?`),
    which may match another run too; a click's silence is stored, never pasted, and so is exact."""
    out = []
    for ch in name:
        if ch in "*?[":
            out.append(f"[{ch}]")
        elif copyable and (ch == "`" or not ch.isprintable() or ch in "\u2028\u2029"):
            out.append("?")
        else:
            out.append(ch)
    return "".join(out)


def command_for(notice: Notice, *, state_dir: str | None = None, duration: str = "2h") -> str:
    """The exact command that silences this alert's kind for its run: what the alert shows, so the
    on-call engineer at 3 a.m. copies it instead of reading the manual."""
    words = ["lossguard", "silence", "add"]
    if state_dir:
        words += ["--state-dir", state_dir]
    words += ["--run", literal_glob(notice.run)]
    if notice.incident is not None:
        words += ["--rule", literal_glob(notice.incident.rule)]
    words += ["--for", duration, "--comment", "why"]
    return shlex.join(words)
