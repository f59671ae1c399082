"""The daemon with notification URLs and an on_incident command, as a real process: a spike opened
and resolved, a kill -9 right after the opening's deliveries, each service gets each notice once and
the command's event ids say what ran; a service answering 500s slowly and one refusing connections
delay nothing else; no secret of a URL reaches the log."""

from __future__ import annotations

import json
import shlex
import sys
import time

from .notify_servers import HookServer, MailServer, refused_port
from .test_watch import NO_PLOTS, PATIENCE, Watch, _calm, _line

RECORDER = "import json, os, sys\nopen(sys.argv[1], 'a').write(json.dumps({k: os.environ[k] for k in ('LOSSGUARD_EVENT', 'LOSSGUARD_EVENT_ID', 'LOSSGUARD_RUN')}) + '\\n')\n"
SECRET = "Pa55-Zq8wXy"
TOKEN = "GotifyAppTok3n"


def _wait(what: str, predicate, timeout: float = PATIENCE):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_service_and_the_action_get_each_notice_once_through_a_kill_and_failing_services_delay_none(tmp_path, monkeypatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, 20)))
    recorder, ran = tmp_path / "record.py", tmp_path / "ran.jsonl"
    recorder.write_text(RECORDER)
    with HookServer() as hooks, MailServer() as mail:
        hooks.status["/fail"], hooks.delay["/fail"] = 500, 0.3  # (a round: three slow tries, 2.4 s at least)
        urls = [f"json://lg:{SECRET}@localhost:{hooks.port}/ok", f"gotify://localhost:{hooks.port}/{TOKEN}", mail.url(),
                f"json://lg:{SECRET}@localhost:{hooks.port}/fail", f"json://localhost:{refused_port()}/{SECRET}"]
        env = {**NO_PLOTS, "LOSSGUARD_NOTIFY_URLS": ",".join(urls), "NO_PROXY": "*",
               "LOSSGUARD_ON_INCIDENT": shlex.join([sys.executable, str(recorder), str(ran)])}
        w = Watch(tmp_path, env=env).start()
        try:
            w.wait_ready()
            with open(log, "a") as fh:
                fh.write(_line(20, 9.0))
            for sink in ("notify-json:", "notify-gotify:", "notify-mailto:", "on_incident:", "jsonl:"):
                w.wait_logged(f"sent to {sink} OPENED")
            w.kill9()  # right after the opening's deliveries were recorded
            # (the failing service was still in its first round: its third try comes 2.1 s after its first)
            assert len(hooks.to("/fail")) <= 2
            w = Watch(tmp_path, env=env).start()
            w.wait_ready()
            with open(log, "a") as fh:
                fh.write(_calm(range(21, 30)))
            _wait("the resolution everywhere", lambda: len(hooks.to("/ok")) >= 2 and len(hooks.to("/message")) >= 2 and len(mail.messages) >= 2
                  and len(ran.read_text().splitlines()) >= 2)
            w.wait_logged("delivery to notify-json-2 failed, will retry")
        finally:
            w.kill9()  # (a stop would wait out the failing services' round of tries: not what is tested here)
        log_text = (tmp_path / "daemon.log").read_text()
    titles = [r.json()["title"] for r in hooks.to("/ok")]
    assert len(titles) == 2 and titles[0].endswith(": loss spike in run exp") and titles[1] == "lossguard Resolved: loss spike in run exp"
    assert [r.json()["title"] for r in hooks.to("/message")] == titles
    assert [m["Subject"] for m in mail.messages] == titles
    actions = [json.loads(line) for line in ran.read_text().splitlines() if json.loads(line)["LOSSGUARD_RUN"] == "exp"]
    assert [a["LOSSGUARD_EVENT"] for a in actions] == ["opened", "resolved"]
    assert len({a["LOSSGUARD_EVENT_ID"] for a in actions}) == 2
    assert len(hooks.to("/fail")) >= 3 and "delivery to notify-json-3 failed, will retry" in log_text
    assert SECRET not in log_text and TOKEN not in log_text
