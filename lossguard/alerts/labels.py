"""What an Alertmanager alert says about a notice: pure, no clock (the times are passed in).

Labels are the alert's identity, so they hold only what names the trouble (which run, which rule,
which machine): the same incident always gives the same label set, hence the same fingerprint, after
a restart, a re-send or a relabel. What changes as the incident is judged again (the peak, the
ranked cause, its evidence) is in annotations, so a new cause updates the alert instead of raising a
second one. A resolution is the same labels with `endsAt`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from ..model import Incident, Notice

RESERVED = ("alertname", "run", "rule", "metric", "severity", "host")
"""Labels lossguard sets itself: `extra_labels` may not override them."""
RESOLVING = ("resolved", "resumed")


def alertname(incident: Incident | None) -> str:
    """LossSpike, LossNonFinite, GradNormSpike, GradNormNonFinite (the grad-norm NaN rule), or
    RunCrashed for a crash, RunStalled for a run's notice."""
    if incident is None:
        return "RunStalled"
    if incident.is_crash:
        return "RunCrashed"
    what = "GradNorm" if incident.metric == "grad_norm" else "Loss"
    return what + ("NonFinite" if incident.kind == "nonfinite" else "Spike")


def labels(notice: Notice, *, host: str, extra: Mapping[str, str] = {}) -> dict[str, str]:  # noqa: B006 - never mutated
    out = {**extra, "alertname": alertname(notice.incident), "run": notice.run, "host": host}
    inc = notice.incident
    if inc is None:
        out["severity"] = "warning"
    else:
        out.update(rule=inc.rule, metric=inc.metric, severity=inc.severity)
    return out


def test_alert(*, now: float, host: str, extra: Mapping[str, str] = {}, lasts: float = 300.0) -> dict[str, object]:  # noqa: B006
    """`lossguard alert test`'s alert: routed like the real ones (same host and extra labels, severity
    info), resolved by itself after `lasts` seconds so that it never lingers in anyone's view."""
    return {
        "labels": {**extra, "alertname": "LossguardTest", "host": host, "severity": "info"},
        "annotations": {"summary": f"lossguard test alert from {host}: alerts will arrive here"},
        "startsAt": timestamp(now), "endsAt": timestamp(now + lasts),
    }


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:.6g}"


def annotations(notice: Notice) -> dict[str, str]:
    inc = notice.incident
    if inc is None:
        summary = f"run {notice.run} made no new step after step {notice.step}"
        if notice.kind == "stalled":
            summary = (f"run {notice.run} finished at step {notice.step}: its output ended cleanly" if notice.finished
                       else summary + (f"; its log's last line: {notice.tail}" if notice.tail else "; its log ends in nothing"))
        if notice.kind == "resumed":
            summary = f"run {notice.run} is logging again (step {notice.step})"
        return {"summary": summary, "step": str(notice.step)}
    top = inc.causes[0] if inc.causes else None
    ratio = inc.ratio
    if inc.is_crash:
        said = {"summary": f"run {inc.shown_run} crashed at step {inc.step}: {inc.error}", "error": str(inc.error), "lines": "\n".join(inc.lines)}
    out = {
        "summary": (
            f"{inc.metric} {'non-finite' if inc.kind == 'nonfinite' else 'spike'} in run {inc.shown_run} at step {inc.step}: "
            f"{_number(inc.value)} against a baseline of {_number(inc.baseline)}"
            + (f" ({ratio:.3g}x)" if ratio is not None else "") + (f"; likely {top.cause}" if top else "")
        ),
        "step": str(inc.step),
        "peak_step": str(inc.peak_step),
        "value": _number(inc.value),
        "baseline": _number(inc.baseline),
        "cause": top.cause if top else "unknown",
        "evidence": top.evidence if top else "",
        "suggestion": top.suggestion if top else "",
        "source": notice.source,
    }
    if inc.is_crash:
        out.update(said)
        del out["value"], out["baseline"]
    if inc.over:
        out["ending"] = inc.ending
    if notice.previous_cause:
        out["previous_cause"] = notice.previous_cause
    return {k: v for k, v in out.items() if v != ""}


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, as Alertmanager's API takes it."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alert(notice: Notice, *, starts: float, ends: float | None, host: str, extra: Mapping[str, str] = {}) -> dict[str, object]:  # noqa: B006
    """One alert for `POST /api/v2/alerts`: firing (no endsAt: Alertmanager keeps it for its
    resolve_timeout after the last re-send) or, with `ends`, resolved."""
    body: dict[str, object] = {
        "labels": labels(notice, host=host, extra=extra), "annotations": annotations(notice), "startsAt": timestamp(starts),
    }
    if ends is not None:
        body["endsAt"] = timestamp(max(ends, starts))  # Alertmanager refuses an end before the start
    return body
