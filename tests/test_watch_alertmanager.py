"""The daemon talking to the real Alertmanager (started on 127.0.0.1 with temp storage): an alert
per incident with lossguard's labels, resolved on recovery, one alert through a kill -9 of the
daemon and a restart of Alertmanager, nothing lost while Alertmanager is down, and three machines'
alerts for one run grouped into one notification."""

from __future__ import annotations

import sqlite3

import pytest

from .am_server import Alertmanager, Webhook, needs_alertmanager, wait
from .test_watch import NO_PLOTS, Watch, _calm, _line

pytestmark = needs_alertmanager


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def am(tmp_path, webhook):
    server = Alertmanager(tmp_path / "am", webhook.url).start()
    yield server
    server.stop()


def _daemon(tmp, am_url: str, *, host: str, resend: float = 1.0, run: str = "exp") -> Watch:
    (tmp / "runs" / run).mkdir(parents=True, exist_ok=True)
    config = tmp / "lossguard.toml"
    config.write_text(
        f'[alertmanager]\nurls = ["{am_url}"]\nhost = "{host}"\nresend_interval = {resend}\nextra_labels = {{ team = "pretraining" }}\n'
    )
    return Watch(tmp, "--config", str(config), env=NO_PLOTS)  # (no test here is about pictures)


def _append(path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_a_spike_fires_one_alert_that_survives_kill_9_and_an_alertmanager_restart_and_resolves(tmp_path, am, webhook):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    w = _daemon(tmp_path, am.url, host="box-a")
    log.write_text(_calm(range(1, 20)))
    w.start()
    try:
        w.wait_ready()
        _append(log, _line(20, 9.0))
        [alert] = wait(lambda: am.alerts(run="exp"), what="the spike's alert")
        assert alert["labels"] == {
            "alertname": "LossSpike", "run": "exp", "rule": "loss-spike", "metric": "loss", "severity": "warning",
            "host": "box-a", "team": "pretraining",
        }
        notes = alert["annotations"]
        assert notes["step"] == "20" and notes["value"] == "9" and "step 20" in notes["summary"]
        assert notes["cause"] and notes["source"] == str(log)
        fingerprint, started = alert["fingerprint"], alert["startsAt"]
        # Notified (after group_wait): Alertmanager tells a resolution only to whom it told the firing.
        wait(lambda: [n for n in webhook.received if n["status"] == "firing" and n["groupLabels"] == {"run": "exp"}], what="the firing notification")

        w.kill9()
        w.start()
        w.settle()
        am.stop()  # Alertmanager keeps no alerts on disk: only the re-send brings it back
        am.start()
        [again] = wait(lambda: am.alerts(run="exp"), what="the alert re-sent after Alertmanager's restart")
        assert (again["fingerprint"], again["startsAt"]) == (fingerprint, started)

        _append(log, _calm(range(21, 30)))
        wait(lambda: not am.alerts(run="exp"), what="the resolution")
        resolved = wait(lambda: [a for n in webhook.received for a in n["alerts"] if a["status"] == "resolved" and a["labels"]["run"] == "exp"],
                        what="the resolved notification")
        assert resolved[0]["fingerprint"] == fingerprint
    finally:
        err = w.stop_and_read()
    assert w.proc.returncode == 0, err


def test_a_spike_while_alertmanager_is_down_is_delivered_when_it_is_back(tmp_path, am):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    w = _daemon(tmp_path, am.url, host="box-a", resend=3600)  # only the outbox can bring it
    log.write_text(_calm(range(1, 20)))
    w.start()
    try:
        w.wait_ready()
        am.stop()
        _append(log, _line(20, 9.0))
        w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "exp" for e in ev))

        def failed():
            with sqlite3.connect(f"file:{tmp_path / 'state' / 'state.db'}?mode=ro", uri=True) as db:
                return db.execute("SELECT count(*) FROM outbox WHERE sink='alertmanager' AND sent_at IS NULL AND attempts > 0").fetchone()[0]

        wait(failed, what="a failed delivery attempt")
        am.start()
        [alert] = wait(lambda: am.alerts(run="exp"), what="the alert delivered after Alertmanager came back")
        assert alert["labels"]["alertname"] == "LossSpike"
    finally:
        err = w.stop_and_read()
    assert "Connection refused" in err or "ConnectionRefused" in err  # said, as a temporary failure
    assert w.proc.returncode == 0, err


def test_three_machines_spiking_in_one_run_make_one_notification(tmp_path, am, webhook):
    daemons, logs = [], []
    for host in "abc":
        tmp = tmp_path / host
        log = tmp / "runs" / "job" / "metrics.jsonl"
        (tmp / "runs" / "job").mkdir(parents=True)
        log.write_text(_calm(range(1, 20)))
        daemons.append(_daemon(tmp, am.url, host=host, run="job").start())
        logs.append(log)
    try:
        for w in daemons:
            w.wait_ready()
        for log in logs:
            _append(log, _line(20, 9.0))
        wait(lambda: len(am.alerts(run="job")) == 3, what="three alerts")
        [notification] = wait(lambda: [n for n in webhook.received if n["groupLabels"] == {"run": "job"}], what="the notification")
        assert sorted(a["labels"]["host"] for a in notification["alerts"]) == ["a", "b", "c"]
        assert notification["commonLabels"]["alertname"] == "LossSpike" and notification["status"] == "firing"
    finally:
        for w in daemons:
            w.stop_and_read()
