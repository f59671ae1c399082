"""The Alertmanager sink without the daemon: what an alert says (labels are identity, the cause is an
annotation), how the client classifies failures (against a scripted local server), several
replicas, secrets kept out of errors, the re-send from the state, the [alertmanager] settings, and
the shipped alertmanager.yml checked by amtool."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

import json
import logging

from lossguard.alerts.alertmanager import AlertmanagerClient, batches
from lossguard.alerts.delivery import Post
from lossguard.alerts.labels import alertname
from lossguard.alerts.sinks import AlertmanagerSink
from lossguard.model import Cause, Incident, Notice
from lossguard.state import OutboxEntry, State

from .am_server import AMTOOL, Alertmanager, Proxy, Webhook, free_port, needs_alertmanager, wait
from .conftest import assert_one_error_line, run_lossguard, run_lossguard_in_process
from .slack_server import Answer

REPO = Path(__file__).resolve().parent.parent
SPIKE = Incident(
    run="exp", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=20, peak_step=20, value=9.0,
    baseline=2.0, threshold=4.0, causes=(Cause("bad_batch", 0.6, "one step only", "skip the batch"),),
)
RELABELLED = replace(SPIKE, causes=(Cause("gradient_explosion", 0.8, "grad norm 40x", "clip gradients"),))


def _entry(kind: str, incident: Incident | None = SPIKE, *, created: float = 1_800_000_100.0, ident: int = 1, **notice) -> OutboxEntry:  # noqa: ANN003
    run = incident.run if incident else "exp"
    return OutboxEntry(ident, 1 if incident else None, "alertmanager", Notice(kind, run, incident, source="a.log", **notice), 0,
                       created=created, opened_at=1_800_000_000.0 if incident else None)


@pytest.mark.parametrize(
    "incident,name",
    [
        pytest.param(SPIKE, "LossSpike", id="loss ratio"),
        pytest.param(replace(SPIKE, kind="nonfinite", rule="loss-nonfinite"), "LossNonFinite", id="loss NaN"),
        pytest.param(replace(SPIKE, metric="grad_norm", rule="grad-norm-spike"), "GradNormSpike", id="grad norm ratio"),
        pytest.param(replace(SPIKE, metric="grad_norm", kind="nonfinite"), "GradNormNonFinite", id="grad norm NaN"),
        pytest.param(None, "RunStalled", id="stalled run"),
    ],
)
def test_alertname_names_the_trouble(incident, name):
    assert alertname(incident) == name


def test_an_incident_keeps_its_labels_through_update_relabel_and_resolution():
    sink = AlertmanagerSink(AlertmanagerClient([]), host="box", extra_labels={"team": "ml"})
    opened = sink.alert_of(_entry("opened"))
    relabelled = sink.alert_of(_entry("relabelled", RELABELLED, previous_cause="bad_batch"))
    resolved = sink.alert_of(_entry("resolved", replace(RELABELLED, end_step=25), created=1_800_000_200.0))
    assert opened["labels"] == relabelled["labels"] == resolved["labels"] == {
        "alertname": "LossSpike", "run": "exp", "rule": "loss-spike", "metric": "loss", "severity": "warning", "host": "box", "team": "ml",
    }
    assert (opened["annotations"]["cause"], relabelled["annotations"]["cause"]) == ("bad_batch", "gradient_explosion")
    assert relabelled["annotations"]["suggestion"] == "clip gradients" and relabelled["annotations"]["previous_cause"] == "bad_batch"
    assert opened["startsAt"] == relabelled["startsAt"] == resolved["startsAt"] == "2027-01-15T08:00:00.000Z"  # the incident's time
    assert "endsAt" not in opened and "endsAt" not in relabelled
    assert resolved["endsAt"] == "2027-01-15T08:03:20.000Z"  # when the recovery was seen


def test_a_stalled_run_fires_from_its_last_step_and_a_resume_resolves_it():
    sink = AlertmanagerSink(AlertmanagerClient([]), host="box")
    stalled = sink.alert_of(_entry("stalled", None, step=500, minutes=30.0))
    resumed = sink.alert_of(_entry("resumed", None, step=501, created=1_800_000_200.0))
    assert stalled["labels"] == resumed["labels"] == {"alertname": "RunStalled", "run": "exp", "severity": "warning", "host": "box"}
    assert stalled["startsAt"] == "2027-01-15T07:31:40.000Z" and "endsAt" not in stalled  # 30 minutes before it was noticed
    assert "endsAt" in resumed


@pytest.mark.parametrize(
    "answer,permanent,fix",
    [
        pytest.param(Answer(status=500, body=""), False, None, id="5xx: temporary"),
        pytest.param(Answer(status=429, body=""), False, None, id="429: temporary"),
        pytest.param(Answer(drop=True), False, None, id="connection dropped: temporary"),
        pytest.param(Answer(status=401, body=""), True, "wants credentials", id="401: permanent, with the fix"),
        pytest.param(Answer(status=404, body="404 page not found"), True, "no Alertmanager API", id="404: permanent"),
        pytest.param(Answer(status=400, body='"bad alert"'), True, "malformed", id="400: permanent"),
    ],
)
def test_a_failure_is_classified_as_temporary_or_permanent(slack, answer, permanent, fix):
    slack.queue.append(answer)
    delivery = AlertmanagerClient([slack.base_url.removesuffix("/api/")]).post([])
    assert not delivery.ok and delivery.permanent is permanent
    assert (fix in delivery.fix) if fix else delivery.fix is None
    assert slack.requests[0].path == "/api/v2/alerts"


def test_the_bearer_token_is_sent_and_never_shown_even_when_the_server_echoes_it(slack):
    token = "am-token-0123456789"
    slack.queue.append(Answer(status=403, body=lambda req: f"denied: Authorization: {req.headers['authorization']}"))
    delivery = AlertmanagerClient([slack.base_url.removesuffix("/api/")], bearer_token=token).post([])
    assert slack.requests[0].headers["authorization"] == f"Bearer {token}"
    assert delivery.permanent and token not in delivery.describe() and "denied" in delivery.describe()


def test_basic_auth_is_sent_and_its_password_never_shown(slack):
    slack.queue.append(Answer(status=401, body=lambda req: f"no: {req.headers['authorization']}"))
    delivery = AlertmanagerClient([slack.base_url.removesuffix("/api/")], username="lg", password="pw-s3cret-pw").post([])
    assert slack.requests[0].headers["authorization"].startswith("Basic ")
    assert "pw-s3cret-pw" not in delivery.describe() and slack.requests[0].headers["authorization"][6:] not in delivery.describe()


@needs_alertmanager
def test_a_post_reaches_every_replica_and_one_down_does_not_hold_it_back(tmp_path):
    hook = Webhook()
    ams = [Alertmanager(tmp_path / f"am{i}", hook.url).start() for i in range(2)]
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        sink = AlertmanagerSink(AlertmanagerClient([ams[0].url, dead, ams[1].url]), host="box")
        now = time.time()
        assert sink.send(Post((replace(_entry("opened"), created=now, opened_at=now),))).ok
        assert all(len(am.alerts(run="exp")) == 1 for am in ams)
        down = AlertmanagerClient([dead, f"http://127.0.0.1:{free_port()}"]).post([])
        assert not down.ok and not down.permanent and down.error.count("Connection refused") == 2
    finally:
        for am in ams:
            am.stop()
        hook.close()


@needs_alertmanager
def test_a_replica_that_swallows_packets_rests_while_another_works(tmp_path):
    hook = Webhook()
    am = Alertmanager(tmp_path / "am", hook.url).start()
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        client = AlertmanagerClient([f"http://127.0.0.1:{silent.getsockname()[1]}", am.url], timeout=1.0)
        sink = AlertmanagerSink(client, host="box")
        now = time.time()
        started = time.monotonic()
        assert sink.send(Post((replace(_entry("opened"), created=now, opened_at=now),))).ok
        assert time.monotonic() - started >= 1.0  # the first post waited for the timeout
        started = time.monotonic()
        assert sink.send(Post((replace(_entry("relabelled", RELABELLED), created=now, opened_at=now),))).ok
        assert time.monotonic() - started < 0.8  # the next one did not
        assert am.alerts(run="exp")[0]["annotations"]["cause"] == "gradient_explosion"
    finally:
        silent.close()
        am.stop()
        hook.close()


@needs_alertmanager
def test_a_relabel_updates_the_annotations_of_the_same_alert(tmp_path):
    hook = Webhook()
    am = Alertmanager(tmp_path / "am", hook.url).start()
    try:
        sink = AlertmanagerSink(AlertmanagerClient([am.url]), host="box")
        now = time.time()
        assert sink.send(Post((replace(_entry("opened"), created=now, opened_at=now),))).ok
        [before] = am.alerts(run="exp")
        assert sink.send(Post((replace(_entry("relabelled", RELABELLED, previous_cause="bad_batch"), created=now + 1, opened_at=now),))).ok
        [after] = am.alerts(run="exp")
        assert after["fingerprint"] == before["fingerprint"]
        assert (before["annotations"]["cause"], after["annotations"]["cause"]) == ("bad_batch", "gradient_explosion")
    finally:
        am.stop()
        hook.close()


def test_resend_posts_the_open_announced_incidents_and_stalled_runs_every_interval(tmp_path, slack):
    state = State(tmp_path / "state")
    with state.transaction() as tx:
        tx.add_incident(SPIKE, source="a.log", quiet=False, now=1_800_000_000.0)
        tx.add_incident(replace(SPIKE, run="old"), source="a.log", quiet=True, now=1_800_000_000.0)  # history: never said
        tx.add_incident(replace(SPIKE, run="done", end_step=22), source="a.log", quiet=False, now=1_800_000_000.0)
        tx.advance_run("stuck", 500, now=1_799_990_000.0)
        tx.mark_stalled("stuck")
    clock = [0.0]
    sink = AlertmanagerSink(AlertmanagerClient([slack.base_url.removesuffix("/api/")]), host="box", resend_interval=60, clock=lambda: clock[0])
    slack.queue += [Answer(body=""), Answer(body="")]
    assert sink.resend(state).ok
    sent = slack.requests[0].body
    assert sorted((a["labels"]["alertname"], a["labels"]["run"]) for a in sent) == [("LossSpike", "exp"), ("RunStalled", "stuck")]
    assert all("endsAt" not in a for a in sent)
    clock[0] = 59.0
    assert sink.resend(state) is None and len(slack.requests) == 1  # not due yet
    clock[0] = 60.0
    assert sink.resend(state).ok and len(slack.requests) == 2
    state.close()



def _firing(path: Path, runs: list[str]) -> State:
    state = State(path)
    with state.transaction() as tx:
        for run in runs:
            tx.add_incident(replace(SPIKE, run=run), source="a.log", quiet=False, now=time.time())
    return state


def test_batches_are_bounded_by_count_and_by_bytes_and_keep_the_order():
    alerts = [{"labels": {"run": f"r{i}"}, "annotations": {"summary": "x" * (i % 7) * 100}} for i in range(250)]
    by_count = batches(alerts, count=100, size=1 << 30)
    assert [len(b) for b in by_count] == [100, 100, 50] and sum(by_count, []) == alerts
    by_size = batches(alerts, count=1000, size=4000)
    assert sum(by_size, []) == alerts and all(len(json.dumps(b).encode()) <= 4000 for b in by_size)
    assert batches([{"big": "y" * 9000}], size=4000) == [[{"big": "y" * 9000}]]  # too big alone: sent alone


@needs_alertmanager
def test_a_resend_of_more_firing_alerts_than_a_proxy_takes_in_one_body_all_reach_alertmanager(tmp_path):
    hook = Webhook()
    am = Alertmanager(tmp_path / "am", hook.url).start()
    proxy = Proxy(am.url, max_body=300_000)  # a proxy's body limit (nginx's default is 1 MB, ~2,300 of these alerts)
    try:
        state = _firing(tmp_path / "state", [f"run-{i:04d}" for i in range(1000)])
        sink = AlertmanagerSink(AlertmanagerClient([proxy.url]), host="box")
        assert sink.resend(state).ok  # before: one ~450 kB request, refused with 413: 0 alerts fired
        assert set(proxy.answers) == {200} and len(proxy.answers) == 10
        wait(lambda: len(am.alerts()) == 1000, what="1000 alerts in Alertmanager")
        state.close()
    finally:
        proxy.close()
        am.stop()
        hook.close()


def test_one_alert_refused_for_good_costs_only_itself_and_is_said_once(tmp_path, caplog):
    proxy = Proxy(bad=("bad",))  # refuses any body holding that run's alert, as Alertmanager refuses one malformed alert
    try:
        runs = [f"run-{i:03d}" for i in range(250)]
        state = _firing(tmp_path / "state", [*runs[:120], "bad", *runs[120:]])
        clock = [0.0]
        sink = AlertmanagerSink(AlertmanagerClient([proxy.url]), host="box", resend_interval=60, clock=lambda: clock[0])
        with caplog.at_level(logging.WARNING, logger="lossguard"):
            first = sink.resend(state)
            assert not first.ok and first.permanent
            assert sorted(a["labels"]["run"] for a in proxy.accepted) == runs  # before: 0 of 250 (one request, refused)
            proxy.accepted.clear()
            clock[0] = 60.0
            sink.resend(state)
        assert sorted(a["labels"]["run"] for a in proxy.accepted) == runs
        said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(said) == 1 and "1 firing alert(s)" in said[0] and "LossSpike run=bad" in said[0], said
        assert sink._due == 120.0  # a refusal for good is not retried every 10 s
        state.close()
    finally:
        proxy.close()


@pytest.mark.parametrize(
    "body,named",
    [
        pytest.param('[alertmanager]\nurls = ["ftp://am:9093"]\n', ":2: alertmanager.urls: ftp://am:9093 must start with http:// or https://", id="scheme"),
        pytest.param('[alertmanager]\nurls = "http://am:9093"\nresend_interval = 0\n', ":3: alertmanager.resend_interval: Input should be greater than or equal to 1", id="resend 0"),
        pytest.param('[alertmanager]\nextra_labels = { run = "x" }\n', ":2: alertmanager.extra_labels: 'run' is set by lossguard itself", id="reserved label"),
        pytest.param('[alertmanager]\nextra_labels = { "a-b" = "x" }\n', "'a-b' is not a label name", id="bad label name"),
        pytest.param('[alertmanager]\nurls = ["http://am:9093"]\nbearer_token = "tok-123456"\n', "must use https://", id="token over http"),
        pytest.param('[alertmanager]\nurls = ["http://u:hunter22@am:9093"]\n', "must not hold credentials", id="credentials in the URL"),
        pytest.param('[alertmanager]\nca_file = "/nonexistent/ca.pem"\n', "ca_file: /nonexistent/ca.pem: no such file", id="missing CA file"),
        pytest.param('[alertmanager]\nurl = "http://am:9093"\n', "unknown setting(s): alertmanager.url", id="typo"),
    ],
)
def test_a_bad_alertmanager_setting_is_one_line(tmp_path, body, named):
    config = tmp_path / "lossguard.toml"
    config.write_text(body)
    run = run_lossguard if "hunter22" in body else run_lossguard_in_process  # (one in a real process: the exit code as a user sees it)
    line = assert_one_error_line(run("config", "check", "--config", str(config)), named)
    assert "hunter22" not in line and "tok-123456" not in line


def test_the_password_comes_from_a_credential_file_and_is_masked(tmp_path):
    (tmp_path / "alertmanager_password").write_text("pw-from-file-1\n")
    config = tmp_path / "lossguard.toml"
    config.write_text('[alertmanager]\nurls = ["https://am:9093"]\nusername = "lg"\n')
    res = run_lossguard("config", "check", "--config", str(config), env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "pw-from-file-1" not in res.stdout + res.stderr and "alertmanager_password" in res.stdout


@pytest.mark.skipif(AMTOOL is None, reason="amtool is not installed (apt install prometheus-alertmanager)")
def test_the_shipped_alertmanager_config_passes_amtool_check_config():
    res = subprocess.run([AMTOOL, "check-config", str(REPO / "deploy/prometheus/alertmanager.yml")], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_the_shipped_alertmanager_config_groups_by_run_and_inhibits_spikes_under_nan():
    text = (REPO / "deploy/prometheus/alertmanager.yml").read_text()
    assert "group_by: [run]" in text and "send_resolved: true" in text
    assert 'source_matchers: [alertname="LossNonFinite"]' in text and 'target_matchers: [alertname="LossSpike"]' in text


@needs_alertmanager
def test_alert_test_reaches_every_replica_and_names_the_one_that_failed(tmp_path, capsys):
    from lossguard.cli import main

    hook = Webhook()
    am = Alertmanager(tmp_path / "am", hook.url).start()
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        config = tmp_path / "lossguard.toml"
        config.write_text(f'[alertmanager]\nurls = ["{am.url}"]\nhost = "trainer-07"\nextra_labels = {{ cluster = "east" }}\n')
        assert main(["alert", "test", "--config", str(config)]) == 0
        (alert,) = am.alerts(alertname="LossguardTest")
        assert alert["labels"] == {"alertname": "LossguardTest", "host": "trainer-07", "severity": "info", "cluster": "east"}
        assert f"test alert to Alertmanager {am.url}: delivered" in capsys.readouterr().out
        config.write_text(f'[alertmanager]\nurls = ["{am.url}", "{dead}"]\n')
        assert main(["alert", "test", "--config", str(config)]) == 2  # one replica down: said, and never exit 1
        out = capsys.readouterr()
        assert f"{am.url}: delivered" in out.out and f"test alert to Alertmanager {dead} failed" in out.err
    finally:
        am.stop()
        hook.close()


def test_batches_after_an_alertmanager_that_cannot_be_reached_wait_for_the_next_resend():
    client = AlertmanagerClient([f"http://127.0.0.1:{free_port()}"], timeout=2)
    alerts = [{"labels": {"run": f"r{i}"}} for i in range(250)]
    [(batch, delivery)] = client.post_batches(alerts)  # not three requests that would each wait out the same timeout
    assert len(batch) == 100 and not delivery.ok and not delivery.permanent


def test_a_resend_every_batch_of_which_is_refused_for_good_is_said_in_one_line(tmp_path, slack, caplog):
    state = _firing(tmp_path / "state", [f"run-{i:03d}" for i in range(250)])
    slack.queue += [Answer(status=401, body="") for _ in range(3)]
    sink = AlertmanagerSink(AlertmanagerClient([slack.base_url.removesuffix("/api/")]), host="box")
    with caplog.at_level(logging.WARNING, logger="lossguard"):
        assert not sink.resend(state).ok
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(slack.requests) == 3 and len(said) == 1 and "250 firing alert(s)" in said[0] and "and 245 more" in said[0], said
    state.close()
