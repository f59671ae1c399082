"""What a notification URL's service is told of a notice: a title and a body written in the markup
the service reads (plain text, Markdown or HTML: apprise says which per service), every name from
disk escaped for it, so a run named `[x](javascript:...)`, `<img onerror=...>` or holding a newline
shows as written and forges neither a link nor a line.

A service without threads cannot reply to an incident's alert, so every follow-up (grew, cause
revised, resolved) names the opening it follows: its step and when it was raised.

Pure: a notice and a few facts in, text out; no clock, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..display import fmt
from ..escaping import html_text, markdown, printable
from ..model import Notice, troubles_counted
from .message import CAUSE_TITLES, describe, title_of

FORMATS = ("text", "markdown", "html")
FOLLOW_UPS = ("updated", "relabelled", "resolved")
"""An incident's notices that follow its alert (and so name it)."""


@dataclass(frozen=True)
class Markup:
    """How one format writes a name, our own emphasis and a line break."""

    name: Callable[[str], str]
    strong: Callable[[str], str]
    newline: str


MARKUPS = {
    "text": Markup(printable, lambda s: s, "\n"),
    # (two spaces before a line's end: a break in every Markdown, not a paragraph joined up)
    "markdown": Markup(markdown, lambda s: f"**{s}**", "  \n"),
    # (<br/>, not a newline: an e-mail's HTML joins lines; Telegram's HTML mode turns it into one)
    "html": Markup(html_text, lambda s: f"<b>{s}</b>", "<br/>"),
}


def headline(notice: Notice) -> str:
    """The notice in a few words, unescaped (a title is plain text where the service shows it apart)."""
    inc = notice.incident
    if inc is None:
        return f"{notice.kind}: run {notice.run}"
    return f"{title_of(notice.kind, inc, also=notice.also)} in run {inc.shown_run}"


def when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def render(notice: Notice, *, fmt_name: str, host: str, opened_at: float | None = None, title_apart: bool = True) -> tuple[str, str]:
    """(title, body) of `notice` in the format `fmt_name`. `title_apart`: the service shows the
    title as plain text of its own (an e-mail's subject); else it blends it into the body, so it is
    escaped as the body is. `opened_at`: when its incident was raised (wall clock)."""
    m = MARKUPS[fmt_name]
    title = "lossguard " + headline(notice)
    shown_title = printable(title) if title_apart else m.name(title)
    lines = [m.strong(m.name(headline(notice)))]
    inc = notice.incident
    if inc is None:
        lines.append(m.name(describe(notice)))
    elif inc.is_crash:
        lines.append(m.name(f"last step {inc.step}, rule {inc.rule}: {inc.error}"))
        lines += [m.name(line) for line in inc.lines]  # (the log's own lines: data)
    else:
        ratio = f" ({inc.ratio:.1f}x)" if inc.ratio is not None else ""
        lines.append(m.name(f"step {inc.step} (peak at {inc.peak_step}, {inc.ending})"))
        lines.append(m.name(f"{inc.metric} {fmt(inc.value)} vs {inc.compared_with} {fmt(inc.baseline)}{ratio}, rule {inc.rule}"))
        if inc.causes:
            top = inc.causes[0]
            lines.append(m.name(f"Likely: {CAUSE_TITLES.get(top.cause, top.cause)} ({top.confidence:.0%}): {top.evidence}"))
            lines.append(m.name(f"Try: {top.suggestion}"))
        if notice.previous_cause is not None:
            lines.append(m.name(f"Cause said before: {CAUSE_TITLES.get(notice.previous_cause, notice.previous_cause)}"))
        if notice.kind in FOLLOW_UPS:
            raised = f", raised {when(opened_at)}" if opened_at is not None else ""
            lines.append(m.name(f"Follows the alert of this incident opened at step {inc.step}{raised}"))
        if notice.source:
            lines.append(m.name(f"Source: {notice.source}"))
    if notice.silenced_by is not None and inc is not None:
        lines.append(m.name(f"Silence {notice.silenced_by} has ended"))
    lines.append(m.name(f"host {host}"))
    return shown_title, m.newline.join(lines)


def burst(notices: Sequence[Notice], *, fmt_name: str, host: str, title_apart: bool = True) -> tuple[str, str]:
    """(title, body) of a burst of new incidents told in one message (a push service's phone would
    ring once per message; apprise spaces one URL's messages seconds apart): a line each."""
    m = MARKUPS[fmt_name]
    head = f"{len(notices)} new incidents: {troubles_counted(n.incident for n in notices if n.incident is not None)}"
    title = "lossguard " + head
    lines = [m.strong(m.name(head)), *(m.name(describe(n)) for n in notices), m.name(f"host {host}")]
    return (printable(title) if title_apart else m.name(title)), m.newline.join(lines)


def greeting(*, fmt_name: str, host: str) -> tuple[str, str]:
    """`lossguard alert test`'s title and body."""
    m = MARKUPS[fmt_name]
    return "lossguard test", m.name(f"lossguard test message from {host}: alerts will arrive here.")


def plot_caption(title: str, *, fmt_name: str) -> str:
    """The words sent with an incident's picture (its title: run, metric, step)."""
    return MARKUPS[fmt_name].name(f"The curves around {title}")
