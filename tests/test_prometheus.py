"""lossguard's metrics and shipped rules against the real Prometheus tools: promtool checks the rules
and runs their unit tests, checks a real scrape of the real daemon, and a real Prometheus scraping
it every second fires RunStalled for a run that stops writing and sends it to a real Alertmanager.
Each skips, saying which binary is missing, only where that binary is absent (`.ci/run` installs them)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .am_server import free_port, listening_port
from .test_watch import NO_PLOTS, Watch, _calm, _line

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "lossguard.rules.yml"
PROMTOOL, PROMETHEUS, ALERTMANAGER = (shutil.which(b) for b in ("promtool", "prometheus", "prometheus-alertmanager"))
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus; .ci/run installs it)")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package prometheus; .ci/run installs it)")


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - localhost only
        return reply.read().decode()


def wait_until(what: str, predicate, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except OSError as exc:  # not listening yet
            last = exc
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited: {log.read_text(errors='replace')[-3000:] if log else proc.returncode}")
        time.sleep(0.2)
    raise AssertionError(f"{what}: timed out (last: {last!r})")


@needs_promtool
def test_the_shipped_rules_pass_promtool_check_rules():
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0 and "SUCCESS: 4 rules found" in done.stdout, done.stdout + done.stderr


@needs_promtool
def test_the_shipped_rules_pass_their_promtool_unit_tests():
    done = subprocess.run([PROMTOOL, "test", "rules", "lossguard.rules.test.yml"], capture_output=True, text=True, cwd=RULES.parent)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def metrics_watch(tmp: Path, port: int) -> Watch:
    (tmp / "runs").mkdir(exist_ok=True)
    return Watch(tmp, env={**NO_PLOTS, "LOSSGUARD_METRICS_LISTEN": f"127.0.0.1:{port}"})


@needs_promtool
def test_a_real_scrape_of_the_daemon_passes_promtool_and_parses_and_counts_its_alert(tmp_path):
    port = free_port()
    watch = metrics_watch(tmp_path, port)
    (tmp_path / "runs" / "exp").mkdir()
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.write_text(_calm(range(1, 30)))
    watch.start()
    try:
        watch.wait_settled()
        with open(log, "a") as fh:
            fh.write(_line(30, 9.0))
        watch.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "exp" for e in ev))
        url = f"http://127.0.0.1:{port}/metrics"
        counted = 'lossguard_deliveries_total{sink="jsonl"} 1.0'
        text = wait_until("the delivery is counted", lambda: next((t for t in [get(url)] if counted in t), None), 60)
        done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"lossguard_run_last_step", "lossguard_run_spikes", "lossguard_passes", "lossguard_pass_duration_seconds", "process_cpu_seconds"} <= names
    finally:
        watch.stop_and_read()


def test_a_metrics_port_already_taken_stops_the_daemon_with_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        watch = metrics_watch(tmp_path, port).start()
        watch.proc.wait(timeout=30)
    err = watch.output().strip().splitlines()
    assert watch.proc.returncode == 2
    assert err[-1] == f"lossguard: error: metrics_listen: 127.0.0.1:{port}: cannot listen: Address already in use", err


STALL_AFTER = 3
"""Seconds without a step before RunStalled fires in the test (the shipped rule says 1800, for 1m)."""


def stalled_rules_for_the_test(tmp: Path) -> Path:
    """The shipped rules with RunStalled's threshold and wait cut to seconds; nothing else changes.
    Each substitution must hit exactly once, so the test fails if the shipped rule is reshaped."""
    text = RULES.read_text()
    text, n = re.subn(r"(lossguard_run_last_update_timestamp_seconds > )1800\n(\s+for: )1m", rf"\g<1>{STALL_AFTER}\n\g<2>0s", text)
    assert n == 1, "RunStalled changed shape: update the test's substitution"
    path = tmp / "lossguard.rules.yml"
    path.write_text(text)
    return path


def start(args: list[str], log: Path) -> tuple[subprocess.Popen, int]:
    """A Prometheus-family server given `--web.listen-address=127.0.0.1:0`, and the port it bound
    (read from its log: chosen by the kernel, never raced for by a test beside it)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    return proc, listening_port(proc, log)


@needs_prometheus
def test_real_prometheus_fires_run_stalled_for_a_run_that_stops_writing_and_alertmanager_gets_it(tmp_path):
    lg_port = free_port()  # (lossguard's metrics_listen takes no port 0)
    watch = metrics_watch(tmp_path, lg_port)
    for run in ("steady", "quitter"):
        (tmp_path / "runs" / run).mkdir()
        (tmp_path / "runs" / run / "metrics.jsonl").write_text(_calm(range(1, 10)))
    procs: list[subprocess.Popen] = []
    stop = threading.Event()

    def keep_writing() -> None:  # the steady run logs a step every 0.3 s; the quitter never again
        step = 10
        while not stop.wait(0.3):
            with open(tmp_path / "runs" / "steady" / "metrics.jsonl", "a") as fh:
                fh.write(_line(step, 2.0))
            step += 1

    writer = threading.Thread(target=keep_writing)
    am_port = None
    alerting = ""
    if ALERTMANAGER is not None:
        (tmp_path / "am.yml").write_text("route:\n  receiver: nobody\n  group_wait: 0s\nreceivers:\n  - name: nobody\n")
        am, am_port = start([
            ALERTMANAGER, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
            "--web.listen-address=127.0.0.1:0", "--cluster.listen-address=",
        ], tmp_path / "alertmanager.log")
        procs.append(am)
        alerting = f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n"
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {stalled_rules_for_the_test(tmp_path)}\n{alerting}"
        f"scrape_configs:\n  - job_name: lossguard\n    static_configs:\n      - targets: ['127.0.0.1:{lg_port}']\n"
    )
    try:
        watch.start()
        writer.start()
        prom, prom_port = start([
            PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            "--web.listen-address=127.0.0.1:0",
        ], tmp_path / "prometheus.log")
        procs.append(prom)

        def firing() -> list[dict]:
            alerts = json.loads(get(f"http://127.0.0.1:{prom_port}/api/v1/alerts"))["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "RunStalled" and a["state"] == "firing"]

        stalled = wait_until("RunStalled fires in Prometheus", firing, 60, prom, tmp_path / "prometheus.log")
        assert {a["labels"]["run"] for a in stalled} == {"quitter"}
        assert stalled[0]["labels"]["host"] == socket.gethostname() and stalled[0]["labels"]["job"] == "lossguard"
        up = json.loads(get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=up"))["data"]["result"]
        assert [r["value"][1] for r in up] == ["1"]  # LossguardDown's input: the daemon is scraped
        if am_port is not None:
            def received() -> list[dict]:
                alerts = json.loads(get(f"http://127.0.0.1:{am_port}/api/v2/alerts"))
                return [a for a in alerts if a["labels"]["alertname"] == "RunStalled"]

            got = wait_until("RunStalled reaches Alertmanager", received, 60, procs[0], tmp_path / "alertmanager.log")
            assert {a["labels"]["run"] for a in got} == {"quitter"}
            assert got[0]["labels"]["severity"] == "warning"
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        watch.stop_and_read()
