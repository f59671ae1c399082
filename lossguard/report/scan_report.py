"""Scan output: a terminal table for people, JSON for programs, Markdown for PRs and chat, and one
self-contained HTML file with the curves. All four render the same ScanResult. Names from disk (runs,
tags, files, and the warnings quoting them) go through `escaping` for the three made for people;
JSON keeps them exact (its own escaping covers control characters)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

from ..version import __version__
from . import svg
from ..display import fmt, sparkline, table_lines
from ..escaping import html_text, markdown, markdown_code, printable
from ..model import Incident, json_number, troubles_counted
from .audit import RunReport, ScanResult


def _worst(rep: RunReport) -> float | None:
    ratios = [i.ratio for i in rep.incidents if i.ratio is not None]
    return max(ratios) if ratios else None


def _top_cause(rep: RunReport) -> str:
    counts = Counter(i.causes[0].cause for i in rep.incidents if i.causes)
    if counts:
        return counts.most_common(1)[0][0]
    # No spike because nothing could be judged is not "no spike": the warnings say how short.
    return "no loss to judge" if rep.analysis.unjudged else "too short to judge" if rep.analysis.short else "-"


def _notes(result: ScanResult) -> list[str]:
    """The runs with no loss to judge, and those (or their segments) too short for every loss rule,
    one line each, run first."""
    return [f"{rep.run}: {note.message}" for rep in result.runs for note in rep.analysis.notes]


def summary(result: ScanResult) -> dict[str, object]:
    incidents = result.incidents
    problems = result.all_problems
    return {
        "runs": len(result.runs),
        "runs_with_spikes": sum(1 for r in result.runs if r.incidents),
        "spikes": sum(1 for i in incidents if not i.is_crash),
        "crashes": sum(1 for i in incidents if i.is_crash),
        "findings": len(incidents),
        "by_kind": dict(Counter(i.trouble for i in incidents)),
        "by_severity": dict(Counter(i.severity for i in incidents)),
        "by_cause": dict(Counter(i.causes[0].cause for i in incidents if i.causes)),
        "files": result.files,
        "bytes": result.bytes,
        "warnings": len(problems) + sum(len(r.analysis.notes) for r in result.runs),
    }


def to_json(result: ScanResult) -> str:
    return json.dumps(document(result), indent=2, default=json_number) + "\n"


def document(result: ScanResult) -> dict[str, object]:
    """The JSON report as a dict (the notebook API's Report holds these fields)."""
    return {
        "lossguard_version": __version__,
        "rules": [asdict(r) for r in (*result.rules.rules, *result.rules.crashes)],
        "runs": [
            {
                "run": rep.run,
                "source": rep.source,
                "format": ",".join(rep.formats),
                "metrics": rep.analysis.metrics,
                "steps": rep.analysis.steps,
                "first_step": rep.analysis.first_step,
                "last_step": rep.analysis.last_step,
                "spikes": [i.to_report() for i in rep.incidents],
                "warnings": [
                    *({"kind": "read", **p.to_json()} for p in rep.problems),
                    *(note.to_report(rep.source) for note in rep.analysis.notes),
                ],
            }
            for rep in result.runs
        ],
        "warnings": [{"kind": "read", **p.to_json()} for p in result.problems],
        "summary": summary(result),
    }


class _Style:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour else text


SEVERITY_COLOUR = {"critical": "1;31", "warning": "33", "info": "36"}


def _incident_head(inc: Incident) -> str:
    if inc.is_crash:
        # (the error names the rank that said it; the others that said the same are added)
        also = f" (seen on {inc.where})" if len(inc.rank_list) > 1 and inc.where else ""
        return f"crashed: {inc.error}{also}; the last step the run reached: {inc.step}"
    if inc.where:
        return f"{inc.where}: {_spike_head(inc)}"
    return _spike_head(inc)


def _spike_head(inc: Incident) -> str:
    ratio = f" ({inc.ratio:.1f}x)" if inc.ratio is not None else ""
    end = inc.ending if inc.over else "still open at the end of the log"
    follows = f"; it followed the {inc.follows[0]} incident at step {inc.follows[1]}" if inc.follows else ""
    return f"{inc.metric} {fmt(inc.value)} vs {inc.compared_with} {fmt(inc.baseline)}{ratio}, peak at step {inc.peak_step}, {end}{follows}"


def _counted(result: ScanResult) -> str:
    """The findings in words, by kind where there are any: `3 finding(s) in 2 of 4 run(s): 1 spike,
    1 crash, 1 slowdown` (findings are spikes, crashes, divergences, slowdowns, overfitting)."""
    s = summary(result)
    kinds = troubles_counted(result.incidents)
    return f"{s['findings']} finding(s) in {s['runs_with_spikes']} of {s['runs']} run(s)" + (f": {kinds}" if kinds else "")


def _span(rep: RunReport) -> str:
    a = rep.analysis
    return "-" if a.first_step is None else f"{a.first_step}..{a.last_step}"


def to_text(result: ScanResult, *, colour: bool = False) -> str:
    st = _Style(colour)
    p = printable
    out = [
        st(f"lossguard {__version__}", "1")
        + f": {len(result.runs)} run(s), {result.files} file(s), rules: {p(result.rules.origin)} ({len(result.rules.rules) + len(result.rules.crashes)})",
        "",
    ]
    rows = [
        [p(rep.run), p(",".join(rep.formats)), _span(rep), str(rep.analysis.steps),
         str(len(rep.incidents)), f"{_worst(rep):.1f}x" if _worst(rep) else "-", p(_top_cause(rep))]
        for rep in result.runs
    ]
    # STEPS is the span the run covers; POINTS the loss values logged in it (one every 500 steps...).
    out += table_lines(rows, ["RUN", "FORMAT", "STEPS", "POINTS", "FINDINGS", "WORST", "TOP CAUSE"], {2, 3, 4, 5}, ruled=True)
    for rep in result.runs:
        for inc in rep.incidents:
            out.append("")
            sev = st(p(inc.severity.upper()), SEVERITY_COLOUR.get(inc.severity, "0"))
            out.append(f"{sev} {st(p(rep.run), '1')} {inc.at} · rule {p(inc.rule)}")
            out.append(f"  {p(_incident_head(inc))}")
            out += [f"  | {p(line)}" for line in inc.lines]
            spark = rep.sparks.get((inc.rule, inc.step))
            if spark:
                out.append(f"  {p(inc.metric)}: {sparkline(spark)}")
            for cause in inc.causes:
                out.append(f"  {st(f'{cause.confidence:4.0%}', '1')} {p(cause.cause)}: {p(cause.evidence)}")
                out.append(f"       → {p(cause.suggestion)}")
    problems = [str(problem) for problem in result.all_problems] + _notes(result)
    if problems:
        out += ["", st(f"{len(problems)} warning(s):", "33")]
        out += [f"  {p(problem)}" for problem in problems]
    out += ["", f"{_counted(result)}."]
    return "\n".join(out) + "\n"


def to_markdown(result: ScanResult) -> str:
    """GitHub renders this in pull requests: every name and evidence string is escaped (`markdown`),
    so a run named `"><img src=x onerror=...>`, `[x](javascript:...)` or `a|b` shows as written and
    cannot add a tag, a link or a table cell."""
    md = markdown
    out = [f"## lossguard scan: {_counted(result)}", ""]
    out += ["| run | format | steps | last step | findings | worst | top cause |", "|---|---|--:|--:|--:|--:|---|"]
    for rep in result.runs:
        worst = _worst(rep)
        out.append(
            f"| {md(rep.run)} | {md(','.join(rep.formats))} | {rep.analysis.steps} | {rep.analysis.last_step} | {len(rep.incidents)} | "
            f"{f'{worst:.1f}x' if worst else '-'} | {md(_top_cause(rep))} |"
        )
    incidents = [(rep, inc) for rep in result.runs for inc in rep.incidents]
    if incidents:
        out += ["", "### Findings", "", "| run | step | rule | severity | value | baseline | ratio | end | likely cause | evidence |", "|---|--:|---|---|--:|--:|--:|--:|---|---|"]
        for rep, inc in incidents:
            top = inc.causes[0] if inc.causes else None
            out.append(
                f"| {md(rep.run)} | {inc.step}{f' ({md(inc.timeline_words)})' if inc.timeline_words else ''}{f' ({md(inc.where)})' if inc.where else ''} | {md(inc.rule)} | {md(inc.severity)} | "
                f"{md(inc.error) if inc.is_crash else fmt(inc.value)} | {fmt(inc.baseline)} | "
                f"{f'{inc.ratio:.1f}x' if inc.ratio else '-'} | {inc.end_step if inc.end_step is not None else f'resumed from {inc.resumed_from}' if inc.resumed_from is not None else 'open'} | "
                f"{md(top.cause) + f' ({top.confidence:.0%})' if top else '-'} | {md(top.evidence) if top else ''} |"
            )
    problems = [str(problem) for problem in result.all_problems] + _notes(result)
    if problems:
        out += ["", "### Warnings", ""] + [f"- {markdown_code(p)}" for p in problems]
    return "\n".join(out) + "\n"


# --- HTML -----------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-top:1px solid #dde2ea;padding-top:16px}
table{border-collapse:collapse;margin:8px 0} th,td{padding:4px 10px;border-bottom:1px solid #e6e9ef;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums} .muted{color:#6b7383}
.run{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap} .plots{flex:0 0 auto}
.evidence{flex:1 1 360px;max-width:640px} .inc{border-left:4px solid #d9534f;padding:4px 12px;margin:0 0 12px;background:#fcf6f5}
.inc.warning{border-color:#e6a23c;background:#fdf9f2} .inc.info{border-color:#409eff;background:#f3f8fe}
.cause{margin:4px 0} .conf{font-weight:600;display:inline-block;min-width:3em} .sugg{color:#3b4a63;margin-left:3em}
svg text{font:11px system-ui,sans-serif;fill:#4a5263} svg text.axis{fill:#6b7383} .log{display:none} body.logscale .log{display:block} body.logscale .lin{display:none}
label{user-select:none;cursor:pointer}
"""

COLOURS = {"loss": "#2f6fdf", "eval_loss": "#7a4fd6", "lr": "#1f9d55", "grad_norm": "#d97706", "loss_scale": "#6b7280"}
ZOOM = 40
"""Logged intervals shown either side of an incident in its card's zoomed plot."""


def _marks(incidents: list[Incident]) -> list[svg.Mark]:
    return [svg.Mark(i.step, i.end_step if i.end_step is not None else max(i.peak_step, i.step)) for i in incidents]


def _cards(incidents: list[Incident]) -> list[list[Incident]]:
    """Incidents that overlap (one starts before the other has recovered) with the same top cause
    are one card: an fp16 overflow trips loss-nonfinite, grad-norm-nonfinite and the loss-spike rule
    at once, and a grad-norm spike the loss follows is one trouble growing. One story, one card."""
    groups: list[list[Incident]] = []
    ends: list[int] = []
    for inc in sorted(incidents, key=lambda i: (i.step, i.rule)):
        cause = inc.causes[0].cause if inc.causes else None
        end = inc.end_step if inc.end_step is not None else max(inc.peak_step, inc.step)
        last = groups[-1][0] if groups else None
        if last is not None and inc.step <= ends[-1] and cause == (last.causes[0].cause if last.causes else None):
            groups[-1].append(inc)
            ends[-1] = max(ends[-1], end)
        else:
            groups.append([inc])
            ends.append(end)
    return groups


def _zoom(rep: RunReport, group: list[Incident]) -> str:
    """The incident's metric around it, on its own y-range: a 1.1x spike late in a run is visible."""
    lead = next((i for i in group if i.metric == "loss"), group[0])  # the loss, when it is in the story
    curve = rep.curves.get(lead.metric) or rep.curves.get("loss")
    if curve is None or len(curve.steps) < 2:
        return ""
    steps = curve.steps
    gaps = sorted(b - a for a, b in zip(steps, steps[1:]) if b > a)
    interval = gaps[len(gaps) // 2] if gaps else 1
    end = max(i.end_step if i.end_step is not None else max(i.peak_step, i.step) for i in group)
    x0, x1 = lead.step - ZOOM * interval, end + ZOOM * interval
    near = [(s, v) for s, v in zip(curve.steps, curve.values) if x0 <= s <= x1]
    if len(near) < 2:
        return ""
    peaks = [i.value for i in group if i.metric == lead.metric]
    return svg.panel([s for s, _ in near], [v for _, v in near], title=lead.metric, x_range=(near[0][0], near[-1][0]),
                     marks=_marks(group), colour=COLOURS.get(lead.metric, "#2f6fdf"), keep=peaks, width=430, height=140)


def _card(rep: RunReport, group: list[Incident]) -> str:
    inc = group[0]
    rules = ", ".join(html_text(i.rule) for i in group)
    severity = max(group, key=lambda i: {"critical": 2, "warning": 1}.get(i.severity, 0)).severity
    causes = "".join(
        f'<div class="cause"><span class="conf">{c.confidence:.0%}</span> <b>{html_text(c.cause)}</b>: {html_text(c.evidence)}'
        f'<div class="sugg">→ {html_text(c.suggestion)}</div></div>'
        for c in inc.causes
    )
    heads = "".join(f"<div>{html_text(_incident_head(i))}</div>" + "".join(f"<pre>{html_text(line)}</pre>" for line in i.lines) for i in group)
    return f'<div class="inc {html_text(severity)}"><b>{html_text(inc.at)}</b> · {rules} ({html_text(severity)}){heads}{_zoom(rep, group)}{causes}</div>'


def _run_html(rep: RunReport, anchor: str) -> str:
    steps = [s for c in rep.curves.values() for s in c.steps]
    x_range = (min(steps), max(steps)) if steps else (0, 1)
    incs = list(rep.incidents)
    plots = []
    for metric in ("loss", "lr", "grad_norm", "loss_scale"):
        curve = rep.curves.get(metric)
        if curve is None:
            continue
        mine = [i for i in incs if i.metric == metric]
        marks = _marks(mine or incs)
        keep = [i.value for i in mine]
        draw = dict(title=metric, x_range=x_range, marks=marks, colour=COLOURS[metric], keep=keep)
        if metric == "loss":
            plots.append(f'<div class="lin">{svg.panel(curve.steps, curve.values, **draw)}</div>')
            plots.append(f'<div class="log">{svg.panel(curve.steps, curve.values, log=True, **draw)}</div>')
        else:
            plots.append(f"<div>{svg.panel(curve.steps, curve.values, log=metric == 'loss_scale', **draw)}</div>")
    cards = "".join(_card(rep, group) for group in _cards(incs))
    return (
        f'<h2 id="{anchor}">{html_text(rep.run)} <span class="muted">({html_text(",".join(rep.formats))}, '
        f"{rep.analysis.steps} steps, {html_text(rep.source)})</span></h2>"
        f'<div class="run"><div class="plots">{"".join(plots)}</div><div class="evidence">{cards}</div></div>'
    )


def to_html(result: ScanResult) -> str:
    # Only runs with findings get a section: only they are linked (ids from their place, not their
    # names, which may hold anything).
    anchors = {rep.run: f"run-{k}" for k, rep in enumerate(r for r in result.runs if r.incidents)}

    def name_cell(rep: RunReport) -> str:
        if rep.run in anchors:
            return f'<a href="#{anchors[rep.run]}">{html_text(rep.run)}</a>'
        return html_text(rep.run)

    rows = "".join(
        f'<tr><td>{name_cell(rep)}</td><td>{html_text(",".join(rep.formats))}</td>'
        f'<td class="n">{rep.analysis.steps}</td><td class="n">{len(rep.incidents)}</td><td class="n">{f"{_worst(rep):.1f}x" if _worst(rep) else "-"}</td>'
        f"<td>{html_text(_top_cause(rep))}</td></tr>"
        for rep in result.runs
    )
    runs = "".join(_run_html(rep, anchors[rep.run]) for rep in result.runs if rep.incidents)
    problems = "".join(f"<li><code>{html_text(p)}</code></li>" for p in [*map(str, result.all_problems), *_notes(result)])
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>lossguard scan</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>lossguard scan: {html_text(_counted(result))}</h1>"
        f'<div class="muted">lossguard {__version__} · rules: {html_text(result.rules.origin)} · '
        f'<label><input type="checkbox" id="logscale" onchange="document.body.classList.toggle(\'logscale\', this.checked)"> log-scale loss</label></div>'
        f"<table><tr><th>run</th><th>format</th><th>steps</th><th>findings</th><th>worst</th><th>top cause</th></tr>{rows}</table>"
        f"{runs}"
        + (f"<h2>Warnings</h2><ul>{problems}</ul>" if problems else "")
        + "</body></html>\n"
    )


def render(result: ScanResult, fmt_name: str, *, colour: bool = False) -> str:
    if fmt_name == "json":
        return to_json(result)
    if fmt_name == "markdown":
        return to_markdown(result)
    if fmt_name == "html":
        return to_html(result)
    return to_text(result, colour=colour)
