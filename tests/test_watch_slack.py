"""The daemon talking to Slack (the real slack-sdk, a local server that answers like Slack): routing,
threads, the resolved header, bursts grouped, pacing, and a permanent error left in the outbox."""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time

import pytest


from .images import png_size
from .slack_server import Answer
from .test_watch import NO_PLOTS, PATIENCE, Watch, _calm, _line

TOKEN = "xoxb-1111-SECRET"


def _daemon(tmp, slack, extra_toml: str = "", *, env: dict | None = None) -> Watch:
    config = tmp / "lossguard.toml"
    config.write_text(f'[slack]\nchannel = "#training"\nbase_url = "{slack.base_url}"\n{extra_toml}')
    return Watch(tmp, "--config", str(config), env={"LOSSGUARD_SLACK_TOKEN": TOKEN, **(env or {})})


def _calm_run(tmp, steps: int):
    """runs/exp/metrics.jsonl with `steps - 1` calm steps: history for the daemon's first pass."""
    log = tmp / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, steps)))
    return log


def _posts(slack, path="/api/chat.postMessage"):
    return [r for r in slack.requests if r.path == path]


def _wait(predicate, timeout=PATIENCE):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_spike_is_routed_then_resolved_in_its_thread_with_the_parent_updated(tmp_path, slack):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack, '[[slack.routes]]\nchannel = "#oncall"\nseverity = ["critical"]\n', env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0, gn=50.0))
        _wait(lambda: len(_posts(slack)) >= 1)
        parent = _posts(slack)[0]
        assert parent.body["channel"] == "#training" and parent.headers["authorization"] == f"Bearer {TOKEN}"
        assert "step 20" in parent.body["text"] and "Gradient explosion" in json.dumps(parent.body["blocks"])
        assert str(log) in json.dumps(parent.body["blocks"]) and str(log) in parent.body["text"]  # the source file
        with open(log, "a") as fh:
            fh.write(_calm(range(21, 26)) + json.dumps({"step": 26, "loss": float("nan")}).replace("NaN", "NaN") + "\n")
        _wait(lambda: _posts(slack, "/api/chat.update") and any(p.body["channel"] == "#oncall" for p in _posts(slack)))
        reply = next(p for p in _posts(slack) if p.body.get("thread_ts"))
        assert reply.body["thread_ts"] == "1700000000.000001" and "resolved" in reply.body["text"]
        update = _posts(slack, "/api/chat.update")[0]
        assert update.body["ts"] == "1700000000.000001" and "Resolved" in json.dumps(update.body["blocks"])
        nan_alert = next(p for p in _posts(slack) if p.body["channel"] == "#oncall")
        assert "NaN" in nan_alert.body["text"]
    finally:
        err = w.stop_and_read()
    assert TOKEN not in err


def test_a_burst_of_spikes_is_one_message_with_details_in_its_thread_paced(tmp_path, slack):
    runs = tmp_path / "runs"
    for i in range(4):
        (runs / f"exp{i}").mkdir(parents=True)
        (runs / f"exp{i}" / "metrics.jsonl").write_text(_calm(range(1, 20)))
    w = _daemon(tmp_path, slack, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        # The four spikes written while no daemon runs: the next one's first pass meets them all, as
        # a burst does. (With the daemon only stopped, SIGSTOP, a pass it was in, or inotify's events
        # arriving one by one, let a pass in between the writes: "3 new spikes", or a lone alert.)
        w.kill9()
        for i in range(4):
            with open(runs / f"exp{i}" / "metrics.jsonl", "a") as fh:
                fh.write(_line(20, 9.0))
        w = _daemon(tmp_path, slack, env=NO_PLOTS).start()
        _wait(lambda: len(_posts(slack)) >= 5)
        posts = _posts(slack)
        summary = posts[0]
        assert summary.body["text"].startswith("4 new spikes") and summary.body.get("thread_ts") is None
        assert all(p.body.get("thread_ts") == "1700000000.000001" for p in posts[1:5])
        gaps = [b.at - a.at for a, b in zip(posts, posts[1:5])]
        assert min(gaps) >= 0.9  # about one message a second per channel
    finally:
        w.stop_and_read()


def test_a_permanent_error_is_logged_once_loudly_and_kept_in_the_outbox(tmp_path, slack):
    from lossguard.state import read_summary

    log = _calm_run(tmp_path, 20)
    slack.queue.extend([Answer(body={"ok": False, "error": "not_in_channel"})] * 5)
    w = _daemon(tmp_path, slack, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: len(_posts(slack)) >= 1)
        # A later spike of another run is posted (and refused) after any retry of the first would be.
        (tmp_path / "runs" / "later").mkdir()
        (tmp_path / "runs" / "later" / "metrics.jsonl").write_text(_calm(range(1, 16)) + _line(16, 9.0))
        _wait(lambda: any("later" in p.body["text"] for p in _posts(slack)))
        assert sum("exp" in p.body["text"] for p in _posts(slack)) == 1  # not retried in a loop
        status = read_summary(tmp_path / "state" / "state.db")
        assert status["undelivered"][0]["permanent"] and "/invite" in status["undelivered"][0]["error"]
    finally:
        err = w.stop_and_read()
    assert err.count("not_in_channel") == 2 and err.count("ERROR cannot deliver to slack") == 2 and TOKEN not in err  # once each


def test_a_loss_spike_after_a_grad_norm_spike_escalates_that_alert_in_its_thread(tmp_path, slack):
    log = _calm_run(tmp_path, 61)
    w = _daemon(tmp_path, slack, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:  # the grad norm jumps 30x; the loss has not moved yet
            fh.write(_line(61, 2.01, gn=30.0))
        _wait(lambda: len(_posts(slack)) >= 1)
        (first,) = _posts(slack)
        assert "grad_norm spike at step 61" in first.body["text"] and "has not followed yet" in json.dumps(first.body["blocks"])
        with open(log, "a") as fh:  # and then it does
            fh.write(_line(62, 9.0, gn=45.0))
        _wait(lambda: len(_posts(slack)) >= 2 and _posts(slack, "/api/chat.update"))
        second = _posts(slack)[1]
        assert second.body.get("thread_ts") == "1700000000.000001"  # one thread: the trouble, grown
        assert "loss spike at step 62" in second.body["text"]
        update = _posts(slack, "/api/chat.update")[0]
        assert update.body["ts"] == "1700000000.000001" and "the loss followed the grad-norm spike" in json.dumps(update.body["blocks"])
    finally:
        w.stop_and_read()
    events = [(e["event"], e["rule"]) for e in w.events() if e["event"] in ("opened", "escalated")]
    assert events == [("opened", "grad-norm-spike"), ("escalated", "loss-spike")]


def test_a_grad_norm_and_loss_spike_on_one_line_are_one_thread(tmp_path, slack):
    log = _calm_run(tmp_path, 61)
    w = _daemon(tmp_path, slack, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(61, 9.0, gn=40.0))
        _wait(lambda: len(_posts(slack)) >= 2)
        first, second = _posts(slack)[:2]
        assert "grad_norm spike at step 61" in first.body["text"] and "thread_ts" not in first.body
        assert second.body.get("thread_ts") == "1700000000.000001" and "loss spike" in second.body["text"]
    finally:
        w.stop_and_read()


def test_the_spike_plot_is_uploaded_into_the_alerts_thread_after_it(tmp_path, slack):
    log = _calm_run(tmp_path, 40)
    w = _daemon(tmp_path, slack).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(40, 9.0, gn=50.0))
        _wait(lambda: slack.uploads())
        alert = _posts(slack)[0]
        ((done, files),) = slack.uploads()
        assert done.at > alert.at and done.headers["authorization"] == f"Bearer {TOKEN}"
        assert done.body["channel_id"] == "#training" and done.body["thread_ts"] == "1700000000.000001"  # the alert's thread
        assert png_size(files[0]) == (1000, 100 + 3 * 200)  # loss, learning rate, grad norm
        assert "exp" in json.loads(done.body["files"])[0]["title"]
        # Drawn in a child process: matplotlib never enters the daemon's own memory.
        assert "matplotlib" not in open(f"/proc/{w.proc.pid}/maps").read()
    finally:
        err = w.stop_and_read()
    assert TOKEN not in err
    (plot,) = [e for e in w.events() if e["event"] == "plot"]  # the JSON-lines sink names the same picture
    assert (tmp_path / "state" / "plots").stat().st_mode & 0o777 == 0o700
    path = tmp_path / "state" / "plots" / plot["path"].rsplit("/", 1)[1]
    assert plot["path"] == str(path) and path.stat().st_mode & 0o777 == 0o600 and path.read_bytes() == files[0]


def test_a_plot_shown_is_not_shown_again_after_a_restart(tmp_path, slack):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: slack.uploads())
    finally:
        w.stop_and_read()
    w.start()
    try:
        w.settle()  # a spike in another run: alerted, and its plot uploaded, after anything left over
        _wait(lambda: len(slack.uploads()) >= 2)
        time.sleep(0.5)
    finally:
        w.stop_and_read()
    titles = [json.loads(done.body["files"])[0]["title"] for done, _ in slack.uploads()]
    assert len(titles) == 2 and "exp" in titles[0] and "zz-settle" in titles[1]


def test_a_webhook_gets_the_alert_and_no_upload(tmp_path, slack):
    log = _calm_run(tmp_path, 20)
    config = tmp_path / "lossguard.toml"
    config.write_text("[slack]\n")
    w = Watch(tmp_path, "--config", str(config), env={"LOSSGUARD_SLACK_WEBHOOK_URL": slack.webhook_url}).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        w.wait_for(lambda ev: any(e["event"] == "plot" for e in ev))  # the JSON-lines sink's picture is drawn
        time.sleep(0.5)
    finally:
        w.stop_and_read()
    assert [r.path for r in slack.requests] == ["/hooks/T000/B000/XXXXSECRETXXXX"]  # the alert, and nothing else


def test_the_resolved_header_is_rewritten_after_a_clean_restart(tmp_path, slack):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: len(_posts(slack)) >= 1)
    finally:
        w.stop_and_read()  # SIGTERM: what it posted was in its memory only
    assert w.proc.returncode == 0
    w.start()
    try:
        with open(log, "a") as fh:
            fh.write(_calm(range(21, 26)))
        _wait(lambda: _posts(slack, "/api/chat.update"))
    finally:
        w.stop_and_read()
    (update,) = _posts(slack, "/api/chat.update")
    assert update.body["ts"] == "1700000000.000001" and "Resolved: loss spike" in json.dumps(update.body["blocks"])


SPIKE = re.compile(r"(?:^\[\w+\] |^• )`([^`]+)`: (\w+) spike at step (\d+)", re.M)
"""An alert's first line, or a summary's line: the run (as code), the metric and the step."""


def _grow(runs: list, stop: threading.Event, every: float = 0.01) -> None:
    """Each run a line every `every` seconds; a one-step spike every 10 steps, recovered on the next."""
    step = 20
    while not stop.is_set():
        for log in runs:
            with open(log, "a") as fh:
                fh.write(_line(step, 9.0) if step % 10 == 0 else _line(step, 2.0 + (step % 5) * 0.01))
        step += 1
        time.sleep(every)
    for log in runs:  # calm to the end: every spike recovers
        with open(log, "a") as fh:
            fh.write(_calm(range(step, step + 5)))


@pytest.mark.parametrize("attempt", range(int(os.environ.get("LOSSGUARD_CRASH_REPEAT", "1"))))
def test_runs_growing_live_through_three_kills_post_each_incident_once_at_top_level(tmp_path, slack, attempt):
    """The crash test (LOSSGUARD_CRASH_REPEAT=20 runs it 20 times in a row)."""
    import sqlite3

    runs = []
    for name in ("a", "b", "c"):
        log = tmp_path / "runs" / name / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text(_calm(range(1, 20)))
        runs.append(log)
    w = _daemon(tmp_path, slack, "min_interval = 0\nrun_cooldown = 0\n").start()
    stop = threading.Event()
    writer = threading.Thread(target=_grow, args=(runs, stop))
    rng = random.Random(attempt)
    try:
        w.wait_ready(files=3)
        writer.start()
        for _ in range(3):
            time.sleep(rng.uniform(0.4, 1.2))
            w.kill9()
            w.start()
        time.sleep(rng.uniform(0.3, 0.8))
        stop.set()
        writer.join()
        w.settle()
        db = tmp_path / "state" / "state.db"
        _wait(lambda: sqlite3.connect(db).execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL AND sink='slack'").fetchone()[0] == 0)
        w.kill9()  # (a fourth: a SIGTERM waited for the round of plots it was uploading)
    finally:
        stop.set()
        w.stop_and_read()
    incidents = {(r, "loss", s) for r, s in sqlite3.connect(db).execute("SELECT run, step FROM incidents WHERE quiet=0 AND run IN ('a','b','c')")}
    whole = [p.body for p in _posts(slack) if "text" in p.body]  # (not a request a kill cut short: Slack never got it whole)
    top = [body["text"] for body in whole if not body.get("thread_ts")]
    said = [(m[0], m[1], int(m[2])) for text in top for m in SPIKE.findall(text)]
    twice = {key for key in said if said.count(key) > 1}
    everywhere = {(m[0], m[1], int(m[2])) for body in whole for m in SPIKE.findall(body["text"])}
    assert len(incidents) >= 10 and twice == set(), (len(top), len(incidents), sorted(twice))
    assert incidents <= everywhere  # (and none lost)


def test_an_alert_recorded_while_a_round_is_in_flight_goes_out_as_that_round_ends(tmp_path, slack):
    # Slack takes 3 s to answer the first alert; a second run spikes meanwhile. Its alert is posted
    # right after the first's answer, not a round interval (10 s) later; and the daemon's log says
    # each notice it sent, one line each.
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.jsonl").write_text(_calm(range(1, 20)))
    slack.answers["/api/chat.postMessage"] = [Answer(delay=3.0)]
    w = _daemon(tmp_path, slack, "min_interval = 0.1\n", env=NO_PLOTS)
    w.args[w.args.index("--poll-interval") + 1] = "10"  # the round interval the second alert must not wait for
    w.start()
    try:
        w.wait_ready(files=2)
        w.wait_settled()
        with open(runs / "a" / "metrics.jsonl", "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: len(_posts(slack)) >= 1)
        with open(runs / "b" / "metrics.jsonl", "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: len(_posts(slack)) >= 2)
        first, second = _posts(slack)[:2]
        assert second.at - first.at < 3.0 + 2.0, second.at - first.at
        out = w.wait_logged("sent to slack: OPENED [warning] run b")
    finally:
        w.stop_and_read()
    assert "sent to slack: OPENED [warning] run a: loss spike at step 20" in out
