"""The daemon's Prometheus metrics in-process: what a scrape shows for real runs followed by a real
Follower over a real SQLite state, parsed back with prometheus-client's own parser; the settings
that turn them on; the textfile for node_exporter. The real daemon scraped by the real Prometheus is
tests/test_prometheus.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lossguard.errors import ConfigError
from lossguard.watch.follow import Follower
from lossguard.watch.metrics import Exposition, Health, Metrics, MetricsError
from lossguard.detection.rules import default_rules
from lossguard.watch.settings import Endpoint, load_settings, parse_listen
from lossguard.state import State, StateReader, Tail

from .conftest import WAIT_FOR_EVERY_READ

from .test_watch import _calm, _line

DAY = 86400.0


def samples(registry_or_text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape as {(name, sorted labels): value}, read by prometheus-client's parser."""
    text = registry_or_text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def scrape(state: State, *, now: float, ttl: float = DAY, health: Health | None = None) -> dict:
    reader = StateReader(state.path)
    try:
        return samples(Exposition(reader, health or Health(["jsonl"]), run_ttl=ttl, host="box1", clock=lambda: now).render().decode())
    finally:
        reader.close()


def run_labels(run: str, **more: str) -> tuple:
    return tuple(sorted({"run": run, "host": "box1", **more}.items()))


def test_a_scrape_shows_each_runs_step_update_latest_values_open_incidents_and_spikes(tmp_path):
    root = tmp_path / "runs"
    for run in ("a", "b"):
        (root / run).mkdir(parents=True)
        (root / run / "metrics.jsonl").write_text(_calm(range(1, 30)))
    state = State(tmp_path / "state")
    follower = Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1000.0)  # history
    with open(root / "a" / "metrics.jsonl", "a") as fh:
        fh.write(_line(30, 9.0, gn=2.5))  # a spike, still open
    follower.run_pass(1010.0)
    got = scrape(state, now=1020.0)
    assert got[("lossguard_run_last_step", run_labels("a"))] == 30
    assert got[("lossguard_run_last_step", run_labels("b"))] == 29
    assert got[("lossguard_run_last_update_timestamp_seconds", run_labels("a"))] == 1010.0
    assert got[("lossguard_run_last_update_timestamp_seconds", run_labels("b"))] == 1000.0
    assert got[("lossguard_run_loss", run_labels("a"))] == 9.0
    assert got[("lossguard_run_grad_norm", run_labels("a"))] == 2.5
    assert got[("lossguard_run_learning_rate", run_labels("b"))] == 1e-4
    assert got[("lossguard_run_open_incidents", run_labels("a", severity="warning"))] == 1
    assert got[("lossguard_run_spikes_total", run_labels("a", rule="loss-spike"))] == 1
    assert got[("lossguard_run_stalled", run_labels("a"))] == 0
    assert not any(name == "lossguard_run_spikes_total" and dict(labels)["run"] == "b" for name, labels in got)
    assert got[("lossguard_files_followed", ())] == 2
    assert got[("lossguard_outbox_pending", ())] == 1  # the spike's notification, not delivered here
    assert got[("lossguard_outbox_oldest_pending_age_seconds", ())] == 10.0
    assert got[("lossguard_state_size_bytes", ())] > 0
    assert got[("lossguard_build_info", (("version", "0.1.0"),))] == 1
    state.close()


def test_the_daemon_health_counts_passes_in_buckets_read_problems_and_deliveries_per_sink(tmp_path):
    state = State(tmp_path / "state")
    health = Health(["slack", "jsonl"])
    for seconds in (0.002, 0.02, 3.0):
        health.passed(seconds, problems=1)
    health.delivery("slack", False)
    health.delivery("slack", False)
    health.delivery("jsonl", True)
    got = scrape(state, now=0.0, health=health)
    assert got[("lossguard_passes_total", ())] == 3
    assert got[("lossguard_pass_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert got[("lossguard_pass_duration_seconds_bucket", (("le", "0.025"),))] == 2
    assert got[("lossguard_pass_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("lossguard_pass_duration_seconds_sum", ())] == pytest.approx(3.022)
    assert got[("lossguard_read_problems_total", ())] == 3
    assert got[("lossguard_delivery_failures_total", (("sink", "slack"),))] == 2
    assert got[("lossguard_deliveries_total", (("sink", "slack"),))] == 0  # present from the start: rules compare both
    assert got[("lossguard_deliveries_total", (("sink", "jsonl"),))] == 1
    state.close()


def test_runs_silent_for_the_ttl_are_dropped_so_1000_runs_stay_at_7_series_each(tmp_path):
    state = State(tmp_path / "state")
    now = 10 * DAY
    steps = np.arange(1, 51, dtype=np.int64)
    with state.transaction() as tx:
        for i in range(1500):
            run = f"run-{i:04d}"
            tx.advance_run(run, 50, now=now - 60 if i < 1000 else now - 2 * DAY)  # the last 500: silent two days
            for metric in ("loss", "lr", "grad_norm", "loss_scale"):
                tx.put_tail(run, metric, Tail(steps, np.full(50, 2.0), 50))
    started = time.process_time()  # (its CPU: a scrape is this thread's work, whatever else the machine runs)
    got = scrape(state, now=now)
    took = time.process_time() - started
    runs = {dict(labels)["run"] for name, labels in got if dict(labels).get("run")}
    per_run = sum(1 for name, labels in got if dict(labels).get("run"))
    assert runs == {f"run-{i:04d}" for i in range(1000)}
    assert per_run == 1000 * 7  # last step, last update, stalled, loss, lr, grad norm, loss scale
    assert took < 1.0, f"a scrape of 1,000 runs took {took:.2f} s of CPU"
    state.close()


def test_the_runs_text_is_rendered_again_only_after_a_commit_or_when_a_run_leaves_the_ttl(tmp_path):
    state = State(tmp_path / "state")
    with state.transaction() as tx:
        tx.advance_run("a", 1, now=1000.0)
        tx.advance_run("b", 1, now=1500.0)
    reader = StateReader(state.path)
    clock = [1600.0]
    exposition = Exposition(reader, Health([]), run_ttl=1000.0, host="box1", clock=lambda: clock[0])
    exposition.render()
    kept = exposition._cached[1]
    exposition.render()
    assert exposition._cached[1] is kept  # nothing committed: not rendered again
    with state.transaction() as tx:
        tx.advance_run("a", 2, now=1700.0)
    assert samples(exposition.render().decode())[("lossguard_run_last_step", run_labels("a"))] == 2
    assert exposition._cached[1] is not kept
    clock[0] = 2600.0  # b's last step is 1,100 s old now: b leaves though nothing was committed
    got = samples(exposition.render().decode())
    assert ("lossguard_run_last_step", run_labels("b")) not in got and ("lossguard_run_last_step", run_labels("a")) in got
    reader.close()
    state.close()


def test_a_scrape_reading_the_state_never_holds_up_a_pass(tmp_path):
    """WAL: a scrape in the middle of its reads (its snapshot open) while a pass commits."""
    root = tmp_path / "runs"
    (root / "exp").mkdir(parents=True)
    log = root / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 30)))
    state = State(tmp_path / "state")
    follower = Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)
    reader = StateReader(state.path)
    with reader._lock:  # a scrape mid-way: its read transaction holds a snapshot
        reader.db.execute("BEGIN")
        reader.db.execute("SELECT count(*) FROM runs").fetchone()
        with open(log, "a") as fh:
            fh.write(_line(30, 9.0))
        done = threading.Event()
        worker = threading.Thread(target=lambda: (follower.run_pass(2.0), done.set()))
        worker.start()
        assert done.wait(5.0), "the pass waited for the scrape"
        reader.db.execute("COMMIT")
    worker.join()
    assert state.run("exp").last_step == 30
    reader.close()
    state.close()


def test_the_textfile_is_replaced_whole_and_holds_no_process_metrics(tmp_path):
    state = State(tmp_path / "state")
    with state.transaction() as tx:
        tx.advance_run("exp", 7, now=time.time())
    metrics = Metrics(state.path, sinks=["jsonl"], textfile=tmp_path / "lossguard.prom")
    metrics.start()
    metrics.write_textfile()
    metrics.write_textfile()
    text = (tmp_path / "lossguard.prom").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lossguard.prom", "state"]  # no temp file left
    got = samples(text)
    assert any(name == "lossguard_run_last_step" for name, _ in got)
    assert not any(name.startswith("process_") for name, _ in got)  # node_exporter has its own
    metrics.stop()
    state.close()


def test_a_textfile_folder_that_does_not_exist_stops_the_start_and_a_failing_write_is_said_once(tmp_path, caplog):
    state = State(tmp_path / "state")
    with pytest.raises(MetricsError, match=r"^metrics_textfile: .*/nowhere: no such folder$"):
        Metrics(state.path, sinks=[], textfile=tmp_path / "nowhere" / "lossguard.prom").start()
    blocked = tmp_path / "lossguard.prom"
    blocked.mkdir()  # (a folder in its place: the rename fails, even for root)
    metrics = Metrics(state.path, sinks=[], textfile=blocked)
    metrics.start()
    for _ in range(3):
        metrics.write_textfile()
    said = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(said) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lossguard.prom", "state"]  # its temp file removed
    metrics.stop()
    state.close()


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        pytest.param("9464", Endpoint("127.0.0.1", 9464), id="a port alone: localhost only"),
        pytest.param("0.0.0.0:9464", Endpoint("0.0.0.0", 9464), id="every address, when written"),
        pytest.param("[::1]:9464", Endpoint("::1", 9464), id="IPv6 in brackets"),
        pytest.param("box1.lan:80", Endpoint("box1.lan", 80), id="a host name"),
    ],
)
def test_metrics_listen_takes_host_port_and_a_bare_port_means_localhost(text, endpoint):
    assert parse_listen(text) == endpoint


def test_metrics_are_off_unless_asked_for(monkeypatch):
    for name in ("LOSSGUARD_METRICS_LISTEN", "LOSSGUARD_METRICS_TEXTFILE", "LOSSGUARD_METRICS_RUN_TTL"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert (settings.metrics_listen, settings.metrics_textfile, settings.metrics_run_ttl) == (None, None, DAY)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        pytest.param("LOSSGUARD_METRICS_LISTEN", "127.0.0.1:99999", "port from 1 to 65535", id="port out of range"),
        pytest.param("LOSSGUARD_METRICS_LISTEN", "127.0.0.1:", "port from 1 to 65535", id="no port"),
        pytest.param("LOSSGUARD_METRICS_LISTEN", ":9464", "no host before the port", id="no host"),
        pytest.param("LOSSGUARD_METRICS_LISTEN", "::1:9464", "IPv6 address goes in brackets", id="IPv6 without brackets"),
        pytest.param("LOSSGUARD_METRICS_TEXTFILE", "/var/lib/node/lossguard.txt", "must end in .prom", id="not .prom"),
        pytest.param("LOSSGUARD_METRICS_RUN_TTL", "0", "greater than 0", id="ttl zero"),
        pytest.param("LOSSGUARD_METRICS_RUN_TTL", "inf", "finite number", id="ttl infinite"),
    ],
)
def test_a_bad_metrics_setting_is_one_line_naming_it(monkeypatch, variable, value, says):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    message = str(err.value)
    assert "\n" not in message and f"{variable}: " in message and says in message, message


def test_a_bad_metrics_setting_in_the_config_file_names_its_line(tmp_path):
    config = tmp_path / "lossguard.toml"
    config.write_text('log_level = "info"\nmetrics_listen = "localhost:http"\n')
    with pytest.raises(ConfigError, match=r"lossguard.toml:2: metrics_listen: must be host:port"):
        load_settings(config)


def test_the_runs_text_is_what_prometheus_clients_generate_latest_writes(tmp_path):
    """The runs' part of a scrape is written directly (at a fraction of generate_latest's cost):
    byte for byte what prometheus-client would write, names needing escapes included."""
    import time as _time

    from prometheus_client import CollectorRegistry, generate_latest

    from lossguard.watch.follow import Follower
    from lossguard.watch.metrics import Exposition, Health, text_format
    from lossguard.detection.rules import default_rules
    from lossguard.state import State, StateReader

    from .test_watch import _calm, _line

    for name in ("plain", 'we"ird\\name\nx', "spiky"):
        log = tmp_path / "runs" / name / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text(_calm(range(1, 30)))
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    now = _time.time()
    follower.run_pass(now)
    with open(tmp_path / "runs" / "spiky" / "metrics.jsonl", "a") as fh:
        fh.write(_line(30, 9.0))
    follower.run_pass(now + 1)
    state.close()
    exposition = Exposition(StateReader(tmp_path / "state" / "state.db"), Health(["console"]))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exposition.runs)
    expected = generate_latest(registry)
    assert b'run="we\\"ird\\\\name\\nx"' in expected and b"lossguard_run_spikes_total" in expected
    assert text_format(exposition.runs.rows()) == expected


def test_runs_rendered_again_only_where_a_commit_changed_them_read_as_a_full_render_would(tmp_path):
    """The runs a pass changed are rendered again, the others reused: after each pass (a spike, its
    recovery, a new run, a stall, a run leaving the ttl) the text equals a render from scratch."""
    from lossguard.watch.metrics import text_format

    for i in range(5):
        log = tmp_path / "runs" / f"r{i}" / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text(_calm(range(1, 30)))
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, stall_after=60, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    clock = [time.time()]
    reader = StateReader(tmp_path / "state" / "state.db")
    kept = Exposition(reader, Health(["console"]), run_ttl=600, clock=lambda: clock[0])

    def same_as_from_scratch() -> bytes:
        fresh = Exposition(StateReader(tmp_path / "state" / "state.db"), Health(["console"]), run_ttl=600, clock=lambda: clock[0])
        got, want = kept.runs.text(), text_format(fresh.runs.rows())
        assert got == want
        return got

    def write(run: str, text: str) -> None:
        with open(tmp_path / "runs" / run / "metrics.jsonl", "a") as fh:
            fh.write(text)

    follower.run_pass(clock[0])
    same_as_from_scratch()
    steps = [(lambda: write("r1", _line(30, 9.0)), b'lossguard_run_open_incidents{host='),
             (lambda: write("r1", _calm(range(31, 40))), b'lossguard_run_last_step{host="'),
             (lambda: (tmp_path / "runs" / "r9").mkdir() or write("r9", _calm(range(1, 12))), b'run="r9"'),
             (lambda: write("r2", _calm(range(30, 33))), b"lossguard_run_loss{")]
    for act, shown in steps:
        act()
        clock[0] += 10
        follower.run_pass(clock[0])
        assert shown in same_as_from_scratch()
    clock[0] += 120  # r0, r3, r4 stall (60 s without a step)
    follower.run_pass(clock[0])
    assert same_as_from_scratch().count(b" 1.0\n") >= 3
    clock[0] += 560  # r0, r3, r4 leave the ttl; the others logged since
    assert b'run="r0"' not in same_as_from_scratch()
    state.close()


def test_watch_serves_metrics_where_the_command_line_says(tmp_path):
    import urllib.request

    from .am_server import free_port
    from .test_watch import NO_PLOTS, Watch

    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, 20)))
    port = free_port()
    w = Watch(tmp_path, "--metrics-listen", str(port), "--metrics-textfile", str(tmp_path / "lossguard.prom"), env=NO_PLOTS).start()
    try:
        w.wait_ready()
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310 - localhost
                if 'lossguard_run_last_step{host="' in body:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no metrics served"
            time.sleep(0.1)
        assert 'run="exp"} 19.0' in body
        assert (tmp_path / "lossguard.prom").exists()
    finally:
        w.stop_and_read()


def _scrape(port: int, timeout: float = 5) -> str:
    import urllib.request

    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()  # noqa: S310 - localhost


def test_idle_connections_to_metrics_neither_take_the_daemons_files_nor_hold_back_a_spike_or_a_scrape(tmp_path):
    import os
    import resource
    import socket

    from .am_server import free_port
    from .test_watch import NO_PLOTS, Watch

    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, 30)))
    port = free_port()
    w = Watch(tmp_path, "--metrics-listen", str(port), env=NO_PLOTS)
    limit = 160  # the daemon's open-file limit, lowered so that a few hundred idle sockets are more than it has

    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    w.start(preexec_fn=lowered)
    idle: list[socket.socket] = []
    try:
        w.wait_settled()
        for _ in range(2 * limit):  # connect and say nothing
            s = socket.socket()
            s.settimeout(3.0)  # (a SYN dropped while the accept queue is full is sent again after 1 s)
            idle.append(s)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:  # the kernel's queue is full: the daemon takes no more (before: it ran out of files)
                break
        time.sleep(0.2)
        used = len(os.listdir(f"/proc/{w.proc.pid}/fd"))
        with open(log, "a") as fh:
            fh.write(_line(30, 9.0))
        started = time.monotonic()
        w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "exp" for e in ev))  # before: never
        alerted = time.monotonic() - started
        deadline = time.monotonic() + 20
        while True:  # a scrape answers (at once if a slot is free, else once the idle ones time out)
            try:
                body = _scrape(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "no scrape answered"
                time.sleep(0.1)
        assert 'lossguard_run_last_step{host="' in body and "lossguard_files_followed 1.0" in body
        assert alerted < 10, alerted  # (not held until the idle ones' 15 s deadline; ~0.5 s here)
        assert used < limit // 2, used  # before: every descriptor (160) taken by idle connections
    finally:
        for s in idle:
            s.close()
        err = w.stop_and_read()
    assert "no longer followed" not in err and "Traceback" not in err, err[-3000:]


def test_clients_trickling_a_request_byte_by_byte_keep_no_slot_past_the_deadline(tmp_path, monkeypatch):
    """Slowloris: each client sends a byte before the idle timeout, never a whole request. Every slot
    taken that way is freed at the connection's deadline, and a scrape answers again."""
    import socket

    from lossguard.watch import metrics as m

    from .am_server import free_port

    state = State(tmp_path / "state")
    monkeypatch.setattr(m._Server, "max_connections", 4)
    monkeypatch.setattr(m._Server, "deadline", 1.5)
    port = free_port()
    served = Metrics(state.path, sinks=[], listen=Endpoint("127.0.0.1", port))
    served.start()
    slow = []
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"G")
            slow.append(s)
        time.sleep(0.3)
        with pytest.raises(OSError):  # every slot held: a scrape is closed at once
            _scrape(port, timeout=1)
        started = time.monotonic()
        while True:
            for s in slow:
                try:
                    s.sendall(b"E")  # (a byte, well within the idle timeout)
                except OSError:
                    pass
            try:
                body = _scrape(port, timeout=1)
                break
            except OSError:
                assert time.monotonic() - started < 10, "the trickling clients kept their slots"  # (freed at 1.5 s)
                time.sleep(0.2)
        assert "lossguard_files_followed" in body
    finally:
        for s in slow:
            s.close()
        served.stop()
        state.close()


def test_firings_folded_into_a_noisy_notice_are_no_open_alerts_in_a_scrape_nor_in_status(tmp_path, capsys):
    # The real Lightning control run (its loss moves 2x from batch to batch) followed a chunk at a
    # time: its firings within its own noise are folded into one noisy notice, never alerted.
    import json

    from lossguard.cli import main

    from .test_real_trainers import REAL

    lines = (REAL / "lightning_clean" / "csv" / "digits" / "version_0" / "metrics.csv").read_text().splitlines(keepends=True)
    log = tmp_path / "runs" / "control" / "metrics.csv"
    log.parent.mkdir(parents=True)
    log.write_text("".join(lines[:200]))
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1000.0)
    open_folded = "SELECT count(*) FROM incidents WHERE status='open' AND folded=1"
    for k, start in enumerate(range(200, len(lines), 20), 1):  # (until a folded firing is open: each recovers in a few steps)
        with open(log, "a") as fh:
            fh.write("".join(lines[start : start + 20]))
        follower.run_pass(1000.0 + k)
        if state.db.execute("SELECT count(*) FROM noisy").fetchone()[0] and state.db.execute(open_folded).fetchone()[0]:
            break
    folded, alerted = (state.db.execute(f"SELECT count(*) FROM incidents WHERE status='open' AND folded={f}").fetchone()[0] for f in (1, 0))
    assert folded >= 1
    got = scrape(state, now=1100.0)
    assert got[("lossguard_run_folded_incidents", run_labels("control"))] == folded
    assert sum(n for (name, _), n in got.items() if name == "lossguard_run_open_incidents") == alerted
    state.close()
    assert main(["status", "--state-dir", str(tmp_path / "state"), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["open_incidents"]) == alerted
    assert summary["folded_incidents"] == [{"run": "control", "rule": "loss-spike", "folded": folded}]
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    table = capsys.readouterr().out
    assert f"{alerted} open incident(s)" in table
    assert f"control  loss-spike  {folded} folded into the noisy notice" in table
