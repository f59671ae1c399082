"""The daemon talking to Slack (the real slack-sdk, a local server that answers like Slack): routing,
threads, the resolved header, bursts grouped, pacing, and a permanent error left in the outbox."""

from __future__ import annotations

import json
import time


from .images import png_size
from .slack_server import Answer
from .test_watch import Watch, _calm, _line

TOKEN = "xoxb-1111-SECRET"


def _daemon(tmp, slack, extra_toml: str = "") -> Watch:
    config = tmp / "lossguard.toml"
    config.write_text(f'[slack]\nchannel = "#training"\nbase_url = "{slack.base_url}"\n{extra_toml}')
    return Watch(tmp, "--config", str(config), env={"LOSSGUARD_SLACK_TOKEN": TOKEN})


def _calm_run(tmp, steps: int):
    """runs/exp/metrics.jsonl with `steps - 1` calm steps: history for the daemon's first pass."""
    log = tmp / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, steps)))
    return log


def _posts(slack, path="/api/chat.postMessage"):
    return [r for r in slack.requests if r.path == path]


def _wait(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_spike_is_routed_then_resolved_in_its_thread_with_the_parent_updated(tmp_path, slack):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack, '[[slack.routes]]\nchannel = "#oncall"\nseverity = ["critical"]\n').start()
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
    w = _daemon(tmp_path, slack).start()
    try:
        w.wait_ready()
        for i in range(4):
            with open(runs / f"exp{i}" / "metrics.jsonl", "a") as fh:
                fh.write(_line(20, 9.0))
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
    w = _daemon(tmp_path, slack).start()
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
    w = _daemon(tmp_path, slack).start()
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
    w = _daemon(tmp_path, slack).start()
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
