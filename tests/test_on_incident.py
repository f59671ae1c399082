"""`on_incident`: the command a notice runs, as a real process: the notice in its environment and on
its stdin, the event id each notice keeps through retries, no shell unless the command names one,
a timeout that stops what the command started, its exit status and last output lines reported
(secrets scrubbed), and which rules and severities run it."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lossguard.alerts.delivery import Post
from lossguard.alerts.on_incident import IncidentAction, wanted
from lossguard.errors import ConfigError
from lossguard.model import Cause, Incident, Notice
from lossguard.redact import remember
from lossguard.state import OutboxEntry
from lossguard.watch.settings import load_settings

SPIKE = Incident(
    run="exp", metric="loss", rule="loss-spike", kind="ratio", severity="critical", step=20, peak_step=20, value=9.0,
    baseline=2.0, threshold=4.0, causes=(Cause("bad_batch", 0.6, "one step only", "skip the batch"),),
)
RECORDER = textwrap.dedent("""
    import json, os, sys
    notice = json.load(sys.stdin)
    env = {k: v for k, v in os.environ.items() if k.startswith(("LOSSGUARD_", "CREDENTIALS", "NOTIFY_SOCKET", "KEEP_"))}
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({"env": env, "stdin": notice}) + "\\n")
""")


def _post(notice: Notice, ident: int = 7) -> Post:
    return Post((OutboxEntry(ident, 1, "on_incident", notice, 0, key=f"abc123-{ident}"),))


def _opened(run: str = "exp") -> Notice:
    return Notice("opened", run, replace(SPIKE, run=run), source="/runs/exp/metrics.jsonl")


def test_the_notice_is_in_the_environment_and_on_stdin_with_an_id_stable_across_retries(tmp_path):
    script, out = tmp_path / "record.py", tmp_path / "ran.jsonl"
    script.write_text(RECORDER)
    base = {"PATH": os.environ["PATH"], "KEEP_SLURM": "123", "LOSSGUARD_SLACK_TOKEN": "xoxb-not-for-you", "CREDENTIALS_DIRECTORY": "/run/c",
            "NOTIFY_SOCKET": "/run/systemd/notify"}
    action = IncidentAction([sys.executable, str(script), str(out)], base_env=lambda: base)
    name = "exp $(touch pwned) `id`; rm -rf x"  # (data: no shell reads it)
    assert action.send(_post(_opened(name))).ok
    assert action.send(_post(_opened(name))).ok  # the same entry again (a kill before its record)
    assert action.send(_post(Notice("stalled", "exp", step=41, minutes=30.0), ident=8)).ok
    first, again, stalled = (json.loads(line) for line in out.read_text().splitlines())
    assert first["env"] == {
        "KEEP_SLURM": "123", "LOSSGUARD_EVENT": "opened", "LOSSGUARD_EVENT_ID": "abc123-7", "LOSSGUARD_RUN": name,
        "LOSSGUARD_RULE": "loss-spike", "LOSSGUARD_STEP": "20", "LOSSGUARD_SEVERITY": "critical", "LOSSGUARD_CAUSE": "bad_batch",
        "LOSSGUARD_SOURCE": "/runs/exp/metrics.jsonl",
    }  # (the daemon's own secrets, credentials and notify socket are not passed on)
    assert first["stdin"]["id"] == "abc123-7" and first["stdin"]["event"] == "opened" and first["stdin"]["run"] == name
    assert first["stdin"]["causes"][0]["cause"] == "bad_batch"
    assert again["env"]["LOSSGUARD_EVENT_ID"] == "abc123-7"
    assert stalled["env"]["LOSSGUARD_EVENT"] == "stalled" and stalled["env"]["LOSSGUARD_STEP"] == "41" and stalled["env"]["LOSSGUARD_RULE"] == ""
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.glob("pwned"))


def test_a_shell_runs_only_where_the_command_names_one(tmp_path):
    stop = tmp_path / "STOP"
    action = IncidentAction(["sh", "-c", 'printf "%s" "$LOSSGUARD_RUN" > "$0"', str(stop)])  # the STOP-file recipe
    assert action.send(_post(_opened("exp;$(id)"))).ok
    assert stop.read_text() == "exp;$(id)"


def test_exit_status_and_the_last_lines_are_reported_with_secrets_scrubbed(caplog):
    remember("Sup3rSecretToken")
    noisy = IncidentAction(["sh", "-c", 'for i in 1 2 3 4 5 6 7 8; do echo "line $i"; done; echo "token Sup3rSecretToken" >&2; exit 3'])
    failed = noisy.send(_post(_opened()))
    assert not failed.ok and failed.permanent
    assert "exit status 3" in failed.error and "line 8" in failed.error and "line 1 " not in failed.error + " "
    assert "Sup3rSecretToken" not in failed.error and "token ***" in failed.error
    later = IncidentAction(["sh", "-c", "exit 75"]).send(_post(_opened()))
    assert not later.ok and not later.permanent  # EX_TEMPFAIL: the next round tries again
    with caplog.at_level("INFO", logger="lossguard"):
        assert IncidentAction(["sh", "-c", "echo stopped job 42"]).send(_post(_opened())).ok
    assert "exited 0" in caplog.text and "stopped job 42" in caplog.text
    missing = IncidentAction(["/nonexistent/scancel-wrapper"]).send(_post(_opened()))
    assert not missing.ok and missing.permanent and "cannot start" in missing.error


def test_a_command_past_its_timeout_is_stopped_with_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    action = IncidentAction(["sh", "-c", f'sleep 30 & echo $! > {pids}; wait'], timeout=0.5, grace=0.2)
    start = time.monotonic()
    delivery = action.send(_post(_opened()))
    assert not delivery.ok and delivery.permanent and "ran past its 0.5 s" in delivery.error
    assert time.monotonic() - start < 25  # (not the 30 s of the sleep: it was stopped too)
    child = Path(f"/proc/{int(pids.read_text())}/stat")
    for _ in range(100):  # (gone, or a zombie its new parent has not reaped yet: dead either way)
        try:
            if child.read_text().rpartition(")")[2].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the command's child outlived its timeout")


@pytest.mark.parametrize("notice,rules,severities,runs", [
    pytest.param(_opened(), (), (), True, id="all by default"),
    pytest.param(_opened(), ("loss-spike",), (), True, id="its rule named"),
    pytest.param(_opened(), ("grad-norm-spike",), (), False, id="another rule"),
    pytest.param(_opened(), (), ("warning",), False, id="a severity not named"),
    pytest.param(Notice("stalled", "exp", step=3), ("stalled",), ("critical",), True, id="a stall by its kind, no severity"),
    pytest.param(Notice("stalled", "exp", step=3), ("loss-spike",), (), False, id="a stall not named"),
])
def test_rules_and_severities_choose_the_notices_that_run_it(notice, rules, severities, runs):
    assert wanted(notice, rules=rules, severities=severities) is runs


def test_a_filtered_notice_is_settled_without_running(tmp_path):
    action = IncidentAction(["sh", "-c", f"touch {tmp_path / 'ran'}"], rules=("grad-norm-spike",))
    assert action.send(_post(_opened())).ok and not (tmp_path / "ran").exists()


def test_the_command_is_split_as_words_and_a_missing_program_refused_at_start(monkeypatch):
    monkeypatch.setenv("LOSSGUARD_ON_INCIDENT", "scancel-that-is-not-here --signal=USR1 \"$SLURM_JOB_ID\"")
    with pytest.raises(ConfigError, match="LOSSGUARD_ON_INCIDENT: 'scancel-that-is-not-here': not found in PATH"):
        load_settings()
    monkeypatch.setenv("LOSSGUARD_ON_INCIDENT", "sh -c 'touch \"$0\"' /tmp/STOP")
    monkeypatch.setenv("LOSSGUARD_ON_INCIDENT_SEVERITIES", "critical,warning")
    settings = load_settings()
    assert settings.on_incident == ["sh", "-c", 'touch "$0"', "/tmp/STOP"] and settings.on_incident_severities == ["critical", "warning"]
    monkeypatch.setenv("LOSSGUARD_ON_INCIDENT_SEVERITIES", "urgent")
    with pytest.raises(ConfigError, match="'urgent' is not a severity"):
        load_settings()
