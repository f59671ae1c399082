"""Everything lossguard says in Slack (and the console's one-line form of it): an incident's
message as Block Kit blocks plus a complete plain-text fallback, stall and resume notices, the
summary of a burst, the nightly digest.

Pure: an incident and a few facts (host, source, the loss around it) in, a Message out; no clock,
no I/O. Every string that came from a log or a path is escaped for mrkdwn wherever Slack parses it,
so a run named `<!channel>` cannot ping a channel and `<http://x|y>` cannot forge a link, and made
printable everywhere (the plain-text header included), so a newline in a run name cannot forge a
line of the message. Slack's limits are respected by cutting at whole lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..display import fmt, sparkline
from ..escaping import printable
from ..model import Cause, Incident, Notice, troubles_counted

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_TEXT = 40000
MAX_HEADER = 150

CAUSE_TITLES = {
    "lr_too_high": "Learning rate too high",
    "gradient_explosion": "Gradient explosion",
    "bad_batch": "Bad batch",
    "numerical_instability": "Numerical instability",
    "lr_schedule": "LR-schedule issue",
    "model_architecture": "Model architecture",
    "unknown": "Unknown",
}
EVENT_TITLES = {
    "opened": "{sev}: {metric} {what}",
    "escalated": "{sev}: the loss followed the grad-norm spike",
    "updated": "{sev}: {metric} {what} grew",
    "resolved": "Resolved: {metric} {what}",
    "relabelled": "Cause revised: {metric} {what}",
    "unsilenced": "{sev}: {metric} {what} still open as its silence ends",
}
CRASH_TITLES = {
    "opened": "{sev}: run crashed",
    "resolved": "Resolved: crashed run is logging again",
    "relabelled": "Cause revised: run crashed",
    "unsilenced": "{sev}: crash still open as its silence ends",
}
NEWS = ("opened", "escalated", "unsilenced")
"""An incident's notices that announce it: the ones that carry the buttons."""
SEVERITY_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


@dataclass(frozen=True)
class Message:
    text: str
    blocks: tuple[dict, ...] = field(default=())

    def as_kwargs(self) -> dict[str, object]:
        return {"text": self.text, "blocks": list(self.blocks)}


def escape(text: str) -> str:
    """mrkdwn control characters as entities (Slack's own rule: &, <, > and nothing else), after
    the text's own control characters and line breaks were made visible: a name stays on its line."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """An inline code span that a backtick in the text cannot end early."""
    return "`" + escape(text).replace("`", "ˋ") + "`"


def cut_lines(text: str, limit: int) -> str:
    """At most `limit` characters, cut after a whole line (a line never ends inside a code span
    here: spans are built per line), with a marker that something was left out."""
    if len(text) <= limit:
        return text
    marker = "\n…"
    room = limit - len(marker)
    cut = text.rfind("\n", 0, room + 1)
    if cut <= 0:
        # One enormous line: cut it, closing a code span the cut would leave open.
        head = text[:room - 1]
        if head.count("`") % 2:
            head += "`"
        return head + marker[1:]
    return text[:cut] + marker


def _section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut_lines(text, MAX_SECTION)}}


def _cause_lines(cause: Cause, rank: int) -> str:
    title = CAUSE_TITLES.get(cause.cause, cause.cause)
    return f"*{rank}. {escape(title)}* ({cause.confidence:.0%})\n>{escape(cause.evidence)}\n_Try:_ {escape(cause.suggestion)}"


def build(
    inc: Incident,
    *,
    event: str = "opened",
    host: str,
    source: str,
    spark: tuple[float, ...] = (),
    version: str = "",
    silence: str | None = None,
    silenced_by: str | None = None,
    actions: dict | None = None,
    also: str | None = None,
) -> Message:
    """`silence`: the command that silences alerts like this one (shown with a new alert);
    `silenced_by`: the silence that held this incident's notices back and just ended; `actions`:
    the buttons (alerts.actions), last, when Socket Mode takes their clicks."""
    sev = inc.severity.upper()
    title = title_of(event, inc, also=also)
    emoji = ":white_check_mark:" if event == "resolved" else SEVERITY_EMOJI.get(inc.severity, "")
    header = printable(f"{emoji} {title} in {inc.shown_run}".strip())
    ratio = f" ({inc.ratio:.1f}×)" if inc.ratio is not None else ""
    end = inc.ending
    facts = _crash_facts(inc) if inc.is_crash else (
        f"*Run* {code(inc.shown_run)}  ·  *step {inc.step}* (peak at {inc.peak_step}, {end}{f'; {inc.timeline_words}' if inc.timeline_words else ''})\n"
        f"*{escape(inc.metric)}* {fmt(inc.value)} vs {inc.compared_with} {fmt(inc.baseline)}{ratio}  ·  rule {code(inc.rule)}"
    )
    blocks: list[dict] = [
        {"type": "header", "text": {"type": "plain_text", "text": header[:MAX_HEADER], "emoji": True}},
        _section(facts),
    ]
    if inc.causes:
        blocks.append(_section("\n".join(_cause_lines(c, i + 1) for i, c in enumerate(inc.causes))))
    if spark:
        blocks.append(_section(f"{escape(inc.metric)} around the spike: {code(sparkline(spark))}"))
    if silenced_by:
        blocks.append(_section(f"Silence {escape(silenced_by)} has ended; this incident is still open."))
    context = f"source {code(source)}  ·  host {code(host)}" + (f"  ·  lossguard {escape(version)}" if version else "")
    if silence:
        context += f"\nTo silence: {code(silence)}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": cut_lines(context, MAX_SECTION)}]})
    if actions:
        blocks.append(actions)
    blocks = blocks[:MAX_BLOCKS]

    top = inc.causes[0] if inc.causes else None
    lines = [
        f"[{sev}] {code(inc.shown_run)}: crashed ({escape(str(inc.error))}); the last step it reached: {inc.step}"
        + (" - resolved" if event == "resolved" else ""),
        f"rule {escape(inc.rule)}; " + "; ".join(code(line) for line in inc.lines),
    ] if inc.is_crash else [
        f"[{sev}] {code(inc.shown_run)}: {escape(inc.metric)} {inc.trouble} at step {inc.step}"
        + (f" ({fmt(inc.value)} vs {inc.compared_with} {fmt(inc.baseline)}{ratio})" if inc.baseline is not None else f" ({fmt(inc.value)})")
        + (" - resolved" if event == "resolved" else ""),
        f"rule {escape(inc.rule)}; peak at step {inc.peak_step}; {end}",
    ]
    if top is not None:
        lines.append(f"likely {CAUSE_TITLES.get(top.cause, top.cause).lower()} ({top.confidence:.0%}): {escape(top.evidence)}")
        lines.append(f"try: {escape(top.suggestion)}")
        for other in inc.causes[1:]:
            lines.append(f"also possible: {CAUSE_TITLES.get(other.cause, other.cause).lower()} ({other.confidence:.0%}): {escape(other.evidence)}")
    if silenced_by:
        lines.append(f"silence {escape(silenced_by)} has ended; still open")
    lines.append(f"source {code(source)} on {code(host)}")  # (a path: its folders' names are data)
    if silence:
        lines.append(f"to silence: {escape(silence)}")
    return Message(cut_lines("\n".join(lines), MAX_TEXT), tuple(blocks))


def title_of(event: str, inc: Incident, *, also: str | None = None) -> str:
    """An incident's notice in a few words, unescaped: what every channel titles it with (`also`:
    an update saying the incident was seen on that rank too)."""
    sev = inc.severity.upper()
    if also is not None:
        return f"{title_of('opened', inc)}, also on rank {also}"
    if inc.is_crash:
        return CRASH_TITLES.get(event, "{sev}: run crashed").format(sev=sev) + f": {inc.error}"
    return EVENT_TITLES.get(event, "{sev}: {metric} {what}").format(sev=sev, metric=inc.metric.replace("_", " "), what=inc.trouble)


def _crash_facts(inc: Incident) -> str:
    """A crash's facts: the error, the last step, and the log's lines that say it (each a code span:
    a log line is data, never mrkdwn)."""
    end = f" ({inc.ending})" if inc.over else ""
    said = "\n".join(code(line) for line in inc.lines)
    return f"*Run* {code(inc.shown_run)}  ·  *last step {inc.step}*{end}  ·  rule {code(inc.rule)}\n*{escape(str(inc.error))}*" + (f"\n{said}" if said else "")


def build_test(*, host: str, channel: str | None) -> Message:
    text = f"lossguard test message from {escape(host)}" + (f" to {escape(channel)}" if channel else "") + ": alerts will arrive here."
    return Message(text, ({"type": "section", "text": {"type": "mrkdwn", "text": text}},))


def _section_message(text: str) -> Message:
    return Message(text, (_section(text),))


def _quiet(notice: Notice) -> tuple[str, str]:
    """A notice of no incident (a stall, a noisy run) as the words before its run's name and after it."""
    ended = f"; silence {notice.silenced_by} has ended" if notice.silenced_by else ""
    if notice.noisy is not None:
        return f"{notice.kind.upper()} run ", f": {notice.noisy.message}{ended}"
    tail = printable(notice.tail or "")  # (a log's line is data: its control characters shown, not played)
    if notice.kind == "stalled" and notice.finished:
        return "FINISHED run ", f" at step {notice.step}: its output ended cleanly ({tail}){ended}"
    extra = f" after {notice.minutes} min without a new step" if notice.kind == "stalled" else ""
    if notice.kind == "stalled":
        extra += f"; its log's last line: {tail}" if tail else "; its log ends in nothing"
    extra += " still stalled" if notice.kind == "unsilenced" else ""
    return f"{notice.kind.upper()} run ", f" at step {notice.step}{extra}{ended}"


def describe(notice: Notice) -> str:
    """One plain line (the console sink; the stall and resume notices' text)."""
    kind = notice.kind.upper()
    ended = f"; silence {notice.silenced_by} has ended" if notice.silenced_by else ""
    if notice.incident is None:
        before, after = _quiet(notice)
        return f"{before}{notice.run}{after}"
    inc = notice.incident
    cause = inc.causes[0].cause if inc.causes else "unknown"
    still = " still open" if notice.kind == "unsilenced" else f" also on rank {notice.also}" if notice.also is not None else ""
    if inc.is_crash:
        return f"{kind} [{inc.severity}] run {inc.shown_run}: crashed ({inc.error}) at step {inc.step}{still} (rule {inc.rule}); likely {cause}{ended}"
    return (
        f"{kind} [{inc.severity}] run {inc.shown_run}: {inc.metric} {inc.trouble} at step {inc.step}{still} "
        f"(peak {fmt(inc.value)} at {inc.peak_step}, {inc.compared_with} {fmt(inc.baseline)}, rule {inc.rule}); likely {cause}{ended}"
    )


def for_notice(notice: Notice, *, host: str, version: str = "", silence: str | None = None, actions: dict | None = None) -> Message:
    """`silence`: the command that silences it, shown with what is news (a new alert, a stall);
    `actions`: the buttons, on an incident's news only."""
    if notice.incident is None:
        before, after = _quiet(notice)
        text = f"{escape(before)}{code(notice.run)}{escape(after)}"  # (the run as code: no mrkdwn of its name is read)
        if silence and notice.kind == "stalled":
            text += f"\nTo silence: {code(silence)}"
        return _section_message(text)
    shown = silence if notice.kind in ("opened", "escalated", "unsilenced") else None
    return build(notice.incident, event=notice.kind, host=host, source=notice.source, version=version, silence=shown,
                 silenced_by=notice.silenced_by, spark=notice.spark, actions=actions if notice.kind in NEWS else None, also=notice.also)


def summary(notices: tuple[Notice, ...]) -> Message:
    """A burst of incidents as one message, each with its state (open, or resolved: the message is
    updated as they recover); each one's details go in its thread."""
    lines = []
    for n in notices:
        inc = n.incident
        cause = inc.causes[0].cause.replace("_", " ") if inc.causes else "unknown"
        state = f":white_check_mark: resolved ({inc.ending})" if inc.over else "open"
        what = f"crashed ({escape(str(inc.error))}) at step" if inc.is_crash else f"{escape(inc.metric)} {inc.trouble} at step"
        lines.append(f"• {code(inc.shown_run)}: {what} {inc.step} ({inc.severity}), likely {escape(cause)}: {state}")
    resolved = sum(n.incident.over for n in notices)
    if resolved:  # (a rewrite as members recover: what it first said, new or still open, no longer holds)
        title = f"{len(notices)} spikes, all resolved" if resolved == len(notices) else f"{len(notices)} spikes, {resolved} resolved"
    elif all(n.kind == "unsilenced" for n in notices):
        title = f"{len(notices)} spikes still open as their silence ends"
    else:
        title = f"{len(notices)} new spikes"
    text = f"{title}:\n" + "\n".join(lines)
    return Message(cut_lines(text, MAX_TEXT), (_section(text),))


def summary_again(count: int) -> Message:
    """Stands for a summary lossguard was posting when it stopped: it may be above already, so
    its incidents are not listed a second time; their details follow in this message's thread."""
    text = f"lossguard restarted while posting the summary of {count} findings (it may be above); their details follow in this thread."
    return _section_message(text)


def digest(*, host: str, totals: dict, runs: list[tuple[str, tuple[Incident, ...]]], silenced: int = 0) -> Message:
    """The nightly scan in one message: the runs with findings, by kind, and their top cause
    (`runs`: the incidents no silence covers; `silenced`: how many were left out)."""
    kinds = troubles_counted(inc for _, incidents in runs for inc in incidents)
    lines = [f"lossguard scan on {escape(host)}: {totals['findings']} finding(s) in {totals['runs_with_spikes']} of {totals['runs']} run(s)"
             + (f": {kinds}" if kinds and not silenced else "")]
    for run, incidents in runs:
        if incidents:
            top = incidents[0].causes[0].cause.replace("_", " ") if incidents[0].causes else "unknown"
            lines.append(f"• {code(run)}: {troubles_counted(incidents)}, first at step {incidents[0].step}, likely {escape(top)}")
    if silenced:
        lines.append(f"{silenced} finding(s) silenced, not listed (`lossguard silence list`)")
    if totals["warnings"]:
        lines.append(f"{totals['warnings']} file(s) could not be read completely (see the report)")
    return _section_message(cut_lines("\n".join(lines), MAX_SECTION))
