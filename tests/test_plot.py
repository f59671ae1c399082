"""An incident's picture: what it keeps of the curves (pure), the PNG drawn from it (real
matplotlib, decoded with Pillow), and the Plotter that sends it after the alert: into the alert's
Slack thread through the real slack-sdk and the local Slack-like server, or named by the JSON-lines
sink; a picture that cannot be drawn or sent costs nothing but itself."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lossguard.alerts.delivery import Post
from lossguard.alerts.plots import Plot, Plotter
from lossguard.alerts.sinks import JsonlSink, SlackSink
from lossguard.alerts.slack import SlackBot
from lossguard.model import Incident, Notice
from lossguard.alerts.picture import PANEL_HEIGHT, Picture, PlotError, draw, picture, render
from lossguard.state import State

from .conftest import FIXTURES
from .images import png_size
from .slack_server import Answer

TOKEN = "xoxb-2222-PLOTSECRET"


def _incident(run: str = "exp", *, step: int = 3000, value: float = 9.0, metric: str = "loss", end: int | None = None) -> Incident:
    return Incident(run=run, metric=metric, rule="loss-spike", kind="ratio", severity="warning", step=step, peak_step=step,
                    value=value, baseline=2.0, threshold=4.0, end_step=end, last_flagged_step=step)


def _streams(n: int = 500, spike_at: int = 300) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    steps = np.arange(1, n + 1, dtype=np.int64) * 10
    loss = 2.0 + 0.05 * np.sin(steps / 30.0)
    loss[spike_at - 1] = 9.0
    grad = np.ones(n)
    grad[spike_at - 1] = 50.0
    return {"loss": (steps, loss), "lr": (steps, np.full(n, 1e-4)), "grad_norm": (steps, grad)}


def test_picture_keeps_points_before_and_after_and_the_other_curves_over_the_same_steps():
    pic = picture(_incident(), _streams())
    assert [c.metric for c in pic.curves] == ["loss", "lr", "grad_norm"]  # no loss scale logged: no band for it
    loss = pic.curves[0]
    assert loss.steps[0] == 1000 and loss.steps[-1] == 5000  # 200 points before step 3000, all 200 after
    assert all(c.steps == loss.steps for c in pic.curves)
    assert 9.0 in loss.values and pic.pixels() == (1000, 100 + 3 * PANEL_HEIGHT)


def test_a_resume_from_an_earlier_step_cuts_the_picture_at_the_rewind():
    steps = np.array([10, 20, 30, 40, 50, 30, 40, 50], np.int64)  # resumed from step 30 after 50
    values = np.array([2.0, 2.0, 9.0, 2.0, 2.0, 2.0, 7.0, 2.0])
    before = picture(_incident(step=30), {"loss": (steps, values)})  # (segment 0: before the resume)
    assert before.curves[0].steps == (10, 20, 30, 40, 50) and before.curves[0].values[2] == 9.0
    replay = picture(replace(_incident(step=40), segment=1), {"loss": (steps, values)})
    assert replay.curves[0].steps == (30, 40, 50) and replay.curves[0].values[1] == 7.0


def test_a_picture_survives_its_json_form_non_finite_values_included():
    streams = _streams()
    streams["loss"][1][310] = float("nan")
    streams["loss"][1][311] = float("inf")
    pic = picture(_incident(), streams)
    back = Picture.from_json(json.loads(json.dumps(pic.to_json())))
    assert back.incident == pic.incident and [c.steps for c in back.curves] == [c.steps for c in pic.curves]
    start = back.curves[0].steps.index(int(streams["loss"][0][310]))
    assert math.isnan(back.curves[0].values[start]) and back.curves[0].values[start + 1] == math.inf


def test_the_png_decodes_and_has_one_band_per_curve(tmp_path):
    streams = _streams()
    streams["loss_scale"] = (streams["loss"][0], np.full(500, 65536.0))
    streams["loss"][1][320] = float("nan")
    path = render(picture(_incident(), streams), tmp_path / "p.png")
    assert png_size(path) == (1000, 100 + 4 * PANEL_HEIGHT)
    assert path.stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name != "p.png"]  # no temporary file left


def test_a_dollar_in_the_run_name_is_text_not_mathtext_nor_tex(tmp_path, monkeypatch):
    import matplotlib

    # Broken mathtext raises when parsed; usetex from a matplotlibrc would call a LaTeX not installed here.
    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    run = "lr$\\frac{1}$ sweep $5 \x1b[2J"
    path = render(picture(_incident(run), _streams()), tmp_path / "p.png")
    assert png_size(path) == (1000, 100 + 3 * PANEL_HEIGHT)


def test_a_picture_that_cannot_be_written_is_a_plot_error_here_and_from_the_child_process(tmp_path):
    with pytest.raises(PlotError, match="cannot write .*missing"):
        render(picture(_incident(), _streams()), tmp_path / "missing" / "p.png")
    with pytest.raises(PlotError, match="cannot write .*missing"):
        draw(picture(_incident(), _streams()), tmp_path / "missing" / "p.png")


def test_a_drawing_that_takes_too_long_is_given_up(tmp_path):
    with pytest.raises(PlotError, match="longer than 0.01 s"):
        draw(picture(_incident(), _streams()), tmp_path / "p.png", timeout=0.01)
    assert not list(tmp_path.iterdir())


def test_neither_importing_lossguard_nor_a_scan_imports_matplotlib(tmp_path):
    code = (
        "import sys\n"
        "import lossguard.cli, lossguard.watch.daemon, lossguard.watch.follow, lossguard.alerts.picture, lossguard.alerts.plots\n"
        "assert 'matplotlib' not in sys.modules, 'on import'\n"
        f"code = lossguard.cli.main(['scan', {str(FIXTURES / 'runs')!r}, '--format', 'json', '--output', {str(tmp_path / 'r.json')!r}])\n"
        "assert code == 1 and 'matplotlib' not in sys.modules, ('on scan', code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- the Plotter: after the alert, in its sink ------------------------------------------------------

def _queued(state: State, inc: Incident, sinks: list[str], *, drawing: str | None = None) -> int:
    """As a pass raises an incident: its opened alert queued for `sinks` and its picture (or
    `drawing`, whatever JSON is given) waiting for it, in one commit."""
    with state.transaction() as tx:
        ident = tx.add_incident(inc, source="metrics.jsonl", quiet=False, now=1.0)
        tx.enqueue(Notice("opened", inc.run, inc, source="metrics.jsonl"), incident_id=ident, sinks=sinks, now=1.0)
        tx.add_plot(ident, drawing if drawing is not None else json.dumps(picture(inc, _streams()).to_json()), sinks=sinks, now=1.0)
    return ident


def _alerted(state: State, sink: str, *, thread: str | None = None, run: str = "exp") -> int:
    """An incident whose opened alert was delivered to `sink` (in `thread`), its picture waiting."""
    ident = _queued(state, _incident(run), [sink])
    assert state.due_plots(10) == []  # not before its alert went out
    state.mark_sent(state.pending(sink=sink), now=2.0, thread=thread)
    return ident


def test_the_picture_goes_into_the_alerts_slack_thread_once(tmp_path, slack):
    state = State(tmp_path / "state")
    try:
        _alerted(state, "slack", thread="C0ALERTS|1700000000.000042")
        sinks = {"slack": SlackSink(SlackBot(TOKEN, "#training", base_url=slack.base_url, retries=0))}
        plotter = Plotter(state, sinks, directory=tmp_path / "state" / "plots")
        assert plotter.round() == 1 and plotter.round() == 0
        ((done, files),) = slack.uploads()
        assert done.body["channel_id"] == "C0ALERTS" and done.body["thread_ts"] == "1700000000.000042"
        assert done.headers["authorization"] == f"Bearer {TOKEN}"
        assert png_size(files[0]) == (1000, 100 + 3 * PANEL_HEIGHT)
        (kept,) = (tmp_path / "state" / "plots").glob("*.png")
        assert kept.read_bytes() == files[0] and (tmp_path / "state" / "plots").stat().st_mode & 0o777 == 0o700
    finally:
        state.close()


def test_a_picture_slack_refuses_is_given_up_with_one_line_and_no_token(tmp_path, slack, caplog):
    state = State(tmp_path / "state")
    try:
        _alerted(state, "slack", thread="C0ALERTS|1700000000.000042")
        slack.queue.append(Answer(body={"ok": False, "error": "missing_scope"}))
        plotter = Plotter(state, {"slack": SlackSink(SlackBot(TOKEN, "#training", base_url=slack.base_url, retries=0))},
                          directory=tmp_path / "state" / "plots")
        with caplog.at_level(logging.WARNING, logger="lossguard"):
            assert plotter.round() == 0 and plotter.round() == 0
        (line,) = [r.getMessage() for r in caplog.records]
        assert "missing_scope" in line and "files:write" in line and TOKEN not in line
        assert [r.path for r in slack.requests] == ["/api/files.getUploadURLExternal"]  # not tried again
    finally:
        state.close()


def test_the_jsonl_sink_names_the_png_next_to_the_state(tmp_path):
    state = State(tmp_path / "state")
    try:
        ident = _alerted(state, "jsonl")
        out = tmp_path / "out.jsonl"
        sink = JsonlSink(out)
        Plotter(state, {"jsonl": sink}, directory=tmp_path / "state" / "plots").round()
        (record,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert record["event"] == "plot" and record["run"] == "exp" and record["step"] == 3000
        assert record["alert"] == f"{state.id}-1" and record["id"] == f"{state.id}-1-plot"
        assert Path(record["path"]) == tmp_path / "state" / "plots" / f"{state.id}-{ident}.png"
        assert png_size(Path(record["path"])) == (1000, 100 + 3 * PANEL_HEIGHT)
        # Sent again by a restarted daemon (killed before the commit that records it): no second line.
        again = JsonlSink(out)
        assert again.send_plot(Plot(Path(record["path"]), picture(_incident(), _streams()), None, record["id"], record["alert"])).ok
        assert len(out.read_text().splitlines()) == 1
    finally:
        state.close()


def test_a_picture_that_cannot_be_drawn_is_given_up_once_and_the_next_one_goes(tmp_path, caplog):
    state = State(tmp_path / "state")
    try:
        _alerted(state, "jsonl", run="broken")
        (tmp_path / "state" / "plots").write_text("a file where the folder should be")
        out = tmp_path / "out.jsonl"
        plotter = Plotter(state, {"jsonl": JsonlSink(out)}, directory=tmp_path / "state" / "plots")
        with caplog.at_level(logging.WARNING, logger="lossguard"):
            assert plotter.round() == 0 and plotter.round() == 0
        (line,) = [r.getMessage() for r in caplog.records]
        assert "run broken" in line and "went without it" in line
        assert not out.exists() and state.due_plots(10) == []
    finally:
        state.close()


def test_an_alert_post_is_not_held_back_by_its_picture(tmp_path):
    """The JSON-lines alert line is written by the outbox round alone; the picture is a later line."""
    state = State(tmp_path / "state")
    try:
        _queued(state, _incident(), ["jsonl"], drawing="{not json")
        out = tmp_path / "out.jsonl"
        sink = JsonlSink(out)
        (entry,) = state.pending(sink="jsonl")
        assert sink.send(Post((entry,))).ok
        state.mark_sent([entry], now=2.0)
        assert Plotter(state, {"jsonl": sink}, directory=tmp_path / "state" / "plots").round() == 0
        assert [json.loads(line)["event"] for line in out.read_text().splitlines()] == ["opened"]
    finally:
        state.close()


def test_a_picture_whose_alert_is_dropped_is_dropped_with_it(tmp_path):
    state = State(tmp_path / "state")
    try:
        _queued(state, _incident(), ["slack", "jsonl"])
        slack_entry = state.pending(sink="slack")[0]
        assert state.drop([slack_entry.id]) == 1
        assert state.db.execute("SELECT sink FROM plots").fetchall() == [("jsonl",)]
    finally:
        state.close()


def test_a_picture_follows_the_report_of_an_alert_a_silence_held_and_is_dropped_if_it_recovered(tmp_path):
    from lossguard.alerts.pipeline import Dispatcher

    state = State(tmp_path / "state")
    try:
        out, now = tmp_path / "out.jsonl", [1000.0]
        sender = Dispatcher(state, {"jsonl": JsonlSink(out)}, wall=lambda: now[0])
        state.add_silence(run="*", rule=None, metric=None, cause=None, starts=now[0], ends=now[0] + 60, comment="x", author="")
        for run in ("open-one", "recovers"):
            _queued(state, _incident(run), ["jsonl"])
        sender.round()
        assert state.due_plots(10) == []  # held with its alert
        row = state.incident("recovers", "loss-spike", 3000)
        with state.transaction() as tx:
            tx.update_incident(replace(row, incident=replace(row.incident, end_step=3100)))
        now[0] += 61
        sender.round()
        assert [(e["event"], e["run"]) for e in map(json.loads, out.read_text().splitlines())] == [("unsilenced", "open-one")]
        (due,) = state.due_plots(10)
        assert due.incident_id == state.incident("open-one", "loss-spike", 3000).id
        assert due.alert_key == f"{state.id}-3"  # the report is the alert it follows
        gone = state.db.execute("SELECT done_at IS NOT NULL FROM plots WHERE incident_id=?", (row.id,)).fetchone()[0]
        assert gone == 1
    finally:
        state.close()


def test_pictures_older_than_the_retention_are_removed_and_one_still_due_is_drawn_again(tmp_path):
    from lossguard.alerts.plots import KEEP_DAYS

    state = State(tmp_path / "state")
    try:
        plots = tmp_path / "state" / "plots"
        plots.mkdir(parents=True, mode=0o700)
        now = time.time()
        old, recent, other = plots / "old-1.png", plots / "recent-2.png", plots / "notes.txt"
        for path in (old, recent, other):
            path.write_bytes(b"x")
        os.utime(old, (now - KEEP_DAYS * 86400 - 60,) * 2)
        os.utime(other, (now - KEEP_DAYS * 86400 - 60,) * 2)  # not a picture: not ours to remove
        ident = _alerted(state, "jsonl")
        plotter = Plotter(state, {"jsonl": JsonlSink(tmp_path / "out.jsonl")}, directory=plots, wall=lambda: now)
        due = plotter.path_of(ident)
        due.write_bytes(b"stale")
        os.utime(due, (now - KEEP_DAYS * 86400 - 60,) * 2)  # drawn long ago, its sink not reached since
        assert plotter.round() == 1
        assert not old.exists() and recent.exists() and other.exists()
        assert png_size(due.read_bytes()) == (1000, 100 + 3 * PANEL_HEIGHT)  # drawn again, whole
    finally:
        state.close()


def test_the_hourly_prune_keeps_its_hour_when_the_wall_clock_steps_back(tmp_path):
    """How long since the last prune is a duration (the monotonic clock): a wall clock stepped back
    a day no longer puts the next prune off by a day."""
    from lossguard.alerts.plots import KEEP_DAYS, PRUNE_EVERY

    state = State(tmp_path / "state")
    try:
        plots = tmp_path / "state" / "plots"
        plots.mkdir(parents=True, mode=0o700)
        wall, mono = [time.time()], [100.0]
        plotter = Plotter(state, {}, directory=plots, wall=lambda: wall[0], clock=lambda: mono[0])
        plotter.round()
        old = plots / "old-1.png"
        old.write_bytes(b"x")
        os.utime(old, (wall[0] - KEEP_DAYS * 86400 - 2 * 86400,) * 2)
        wall[0] -= 86400
        mono[0] += PRUNE_EVERY
        plotter.round()
        assert not old.exists()
    finally:
        state.close()
