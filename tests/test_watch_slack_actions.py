"""The daemon as a process taking clicks from Slack: the real slack-sdk Socket Mode client
in `lossguard watch` connects to a local WebSocket server (tests.socket_server) whose URL the
Slack-like HTTP server hands out from apps.connections.open; the test sends envelopes as Slack does
and reads the acks, the calls the daemon made, the state and `lossguard silence list`."""

from __future__ import annotations

import json
import sqlite3
import time

from .conftest import run_lossguard
from .test_actions import ANA, envelope
from .test_slack_link import APP_TOKEN
from .test_watch import Watch, _line
from .test_watch_slack import TOKEN, _calm_run, _posts, _wait


def _daemon(tmp, slack, env: dict | None = None) -> Watch:
    config = tmp / "lossguard.toml"
    config.write_text(f'[slack]\nchannel = "#training"\nbase_url = "{slack.base_url}"\nactors = ["{ANA}"]\n')
    return Watch(tmp, "--config", str(config), env={"LOSSGUARD_SLACK_TOKEN": TOKEN, "LOSSGUARD_SLACK_APP_TOKEN": APP_TOKEN, **(env or {})})


def _spike(log, step: int) -> None:
    with open(log, "a") as fh:
        fh.write(_line(step, 9.0))


def _key(slack) -> str:
    """The incident key the last alert's buttons carry."""
    return _posts(slack)[-1].body["blocks"][-1]["block_id"].removeprefix("lossguard|")


def _silences(tmp) -> list[dict]:
    done = run_lossguard("silence", "list", "--format", "json", "--state-dir", str(tmp / "state"))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _held(tmp) -> int:
    with sqlite3.connect(f"file:{tmp / 'state' / 'state.db'}?mode=ro", uri=True) as db:
        return db.execute("SELECT count(*) FROM outbox WHERE silenced IS NOT NULL AND sink='slack'").fetchone()[0]


def test_a_click_on_silence_4h_updates_the_alert_holds_the_next_spike_and_a_retry_adds_nothing(tmp_path, slack, socket):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack).start()
    try:
        w.wait_ready()
        socket.wait_connected()
        _spike(log, 20)
        _wait(lambda: len(_posts(slack)) >= 1)
        key = _key(slack)
        click = envelope("lossguard.silence_run", key=key, choice="4h", clicked=time.time(), envelope_id="e-proc-4h")
        socket.send(click)
        socket.wait_ack("e-proc-4h")
        _wait(lambda: _posts(slack, "/api/chat.update"))
        assert "silenced 4 h by @ana" in json.dumps(_posts(slack, "/api/chat.update")[0].body["blocks"])
        (silence,) = _silences(tmp_path)
        assert silence["run"] == "exp" and silence["author"] == "@ana" and ANA in silence["comment"]
        socket.send(click)  # Slack's retry of the same envelope
        socket.wait_ack("e-proc-4h", count=2)
        assert len(_silences(tmp_path)) == 1
        posted = len(_posts(slack))
        with open(log, "a") as fh:  # recovers, then spikes again: a new incident of the silenced run
            fh.write("".join(_line(s, 2.0) for s in range(21, 60)))
        _spike(log, 60)
        _wait(lambda: _held(tmp_path) >= 1)
        assert len(_posts(slack)) <= posted + 1 and not any("step 60" in p.body["text"] for p in _posts(slack))
    finally:
        err = w.stop_and_read()
    assert APP_TOKEN not in err and TOKEN not in err and "Traceback" not in err and "ERROR" not in err


def test_a_kill_between_the_click_and_its_ack_applies_the_retried_envelope_once(tmp_path, slack, socket):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack, env={"LOSSGUARD_TEST_KILL_AT": "before-ack"}).start()
    w.wait_ready()
    socket.wait_connected()
    _spike(log, 20)
    _wait(lambda: len(_posts(slack)) >= 1)
    click = envelope("lossguard.silence_run", key=_key(slack), choice="1h", clicked=time.time(), envelope_id="e-kill")
    socket.send(click)
    w.proc.wait(timeout=30)  # it killed itself once the silence was committed, before the ack
    assert w.proc.returncode == -9 and socket.acks_of("e-kill") == []
    w = _daemon(tmp_path, slack).start()
    try:
        socket.wait_connected(count=2)
        socket.send(click)  # Slack sends an envelope not acked again once the app reconnects
        socket.wait_ack("e-kill")
        assert len(_silences(tmp_path)) == 1
        _wait(lambda: _posts(slack, "/api/chat.update"))  # the update the kill prevented, given now
        refused = envelope("lossguard.acknowledge", key=click["payload"]["actions"][0]["block_id"].removeprefix("lossguard|"),
                           user="U0EVE00001", clicked=time.time(), envelope_id="e-eve")
        socket.send(refused)
        socket.wait_ack("e-eve")
        _wait(lambda: any(p.body.get("user") == "U0EVE00001" for p in _posts(slack, "/api/chat.postEphemeral")))
        assert "may not silence" in next(p.body["text"] for p in _posts(slack, "/api/chat.postEphemeral") if p.body["user"] == "U0EVE00001")
        with sqlite3.connect(f"file:{tmp_path / 'state' / 'state.db'}?mode=ro", uri=True) as db:
            assert db.execute("SELECT count(*) FROM incidents WHERE acked_by IS NOT NULL").fetchone()[0] == 0
    finally:
        w.stop_and_read()


def test_with_the_link_down_an_alert_goes_out_on_time_and_the_link_comes_back(tmp_path, slack, socket):
    log = _calm_run(tmp_path, 20)
    w = _daemon(tmp_path, slack).start()
    try:
        w.wait_ready()
        socket.wait_connected()
        socket.refuse = True
        socket.drop()
        written = time.monotonic()
        _spike(log, 20)
        _wait(lambda: len(_posts(slack)) >= 1)
        assert _posts(slack)[0].at - written < 5.0  # as fast as with the link up: its own thread
        _wait(lambda: "link cannot connect" in w.output())
        socket.refuse = False
        socket.wait_connected(count=2, timeout=30)
        _wait(lambda: w.output().count("Slack Socket Mode link open") == 2, timeout=30)
        assert w.output().count("Slack Socket Mode link dropped") == 1
    finally:
        err = w.stop_and_read()
    assert "Traceback" not in err and err.count("WARNING Slack Socket Mode link cannot connect") <= 1, err


def test_at_debug_level_the_daemon_logs_no_capability_of_an_envelope_and_says_an_unreadable_one_in_a_line(tmp_path, slack, socket):
    from .test_slack_link import CAPABILITIES, _command, _with_capabilities

    log = _calm_run(tmp_path, 20)
    config = tmp_path / "lossguard.toml"
    config.write_text(f'[slack]\nchannel = "#training"\nbase_url = "{slack.base_url}"\nactors = ["{ANA}"]\n')
    w = Watch(tmp_path, "--config", str(config), "--log-level", "debug",
              env={"LOSSGUARD_SLACK_TOKEN": TOKEN, "LOSSGUARD_SLACK_APP_TOKEN": APP_TOKEN}).start()
    try:
        w.wait_ready()
        socket.wait_connected()
        _spike(log, 20)
        _wait(lambda: len(_posts(slack)) >= 1)
        bad = _with_capabilities(envelope("lossguard.silence_run", key=_key(slack), choice="4h", clicked=time.time(), envelope_id="e-bad"))
        bad["payload"]["user"] = ANA  # (a string: never acked, nothing said)
        for sent in (bad, _with_capabilities(envelope("lossguard.acknowledge", key=_key(slack), clicked=time.time(), envelope_id="e-ack")),
                     _command("e-cmd")):
            socket.send(sent)
            socket.wait_ack(sent["envelope_id"])
        _wait(lambda: _posts(slack, "/api/chat.update"))
    finally:
        err = w.stop_and_read()
    assert "DEBUG" in err and "WARNING an envelope from Slack (interactive, envelope e-bad) is refused: payload.user is a string" in err
    assert not any(c in err for c in CAPABILITIES), [line for line in err.splitlines() if any(c in line for c in CAPABILITIES)]
    assert APP_TOKEN not in err and TOKEN not in err and "Traceback" not in err
