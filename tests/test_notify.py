"""Notification URLs through apprise itself, against real local servers: an SMTP server (aiosmtpd)
for mailto://, stdlib HTTP servers for json:// and the services whose URL names a host (ntfy://,
gotify://, mmost://, rocket://). An opening and the resolution that names it, names from disk
escaped for each service's markup, the plot attached where the service takes attachments, failures
classified and retried with backoff, URLs checked at start and their secrets never shown."""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest

from lossguard.alerts.delivery import Post
from lossguard.alerts.pipeline import Dispatcher
from lossguard.alerts.notify import NotifySink, sink_names
from lossguard.alerts.plots import Plot
from lossguard.alerts.picture import Picture
from lossguard.errors import ConfigError
from lossguard.model import Cause, Incident, Notice
from lossguard.state import OutboxEntry, State
from lossguard.watch.settings import load_settings

from .conftest import assert_one_error_line, run_lossguard
from .images import png_size
from .notify_servers import HookServer, MailServer, refused_port

SPIKE = Incident(
    run="exp", metric="loss", rule="loss-spike", kind="ratio", severity="critical", step=20, peak_step=20, value=9.0,
    baseline=2.0, threshold=4.0, causes=(Cause("bad_batch", 0.6, "one step only", "skip the batch"),),
)
OPENED_AT = 1_800_000_000.0
HOSTILE = "evil\n[x](javascript:alert(1)) <img src=x onerror=alert(1)> **b**"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def hooks():
    with HookServer() as server:
        yield server


def _post(kind: str, incident: Incident = SPIKE, ident: int = 1) -> Post:
    notice = Notice(kind, incident.run, incident if kind != "resolved" else replace(incident, end_step=25), source="/runs/exp/metrics.jsonl")
    return Post((OutboxEntry(ident, 1, "notify-json", notice, 0, key=f"s-{ident}", opened_at=OPENED_AT),))


def _sink(url: str, **options) -> NotifySink:  # noqa: ANN003
    return NotifySink(url, name=sink_names([url])[0], host="gpu-box", **options)


TEXT_OF = {
    "json": lambda r: r.json()["title"] + "\n" + r.json()["message"],
    "ntfy": lambda r: r.json()["title"] + "\n" + r.json()["message"],
    "gotify": lambda r: r.json()["title"] + "\n" + r.json()["message"],
    "mmost": lambda r: r.json()["text"],
    "rocket": lambda r: r.json()["text"],
}


@pytest.mark.parametrize("scheme,form,path", [
    pytest.param("json", "json://localhost:{port}/hook", "/hook", id="json webhook"),
    pytest.param("ntfy", "ntfy://localhost:{port}/training", "/", id="ntfy"),
    pytest.param("gotify", "gotify://localhost:{port}/AppTokenAbc123", "/message", id="gotify"),
    pytest.param("mmost", "mmost://localhost:{port}/hooktoken123456", "/hooks/hooktoken123456", id="mattermost"),
    pytest.param("rocket", "rocket://tokena/tokenb@localhost:{port}/#training", "/hooks/tokena/tokenb", id="rocket.chat"),
])
def test_each_service_gets_the_opening_then_a_resolution_naming_it(hooks, scheme, form, path):
    url = form.format(port=hooks.port)
    assert _sink(url).send(_post("opened")).ok
    # (a sink of its own, as after a restart: apprise paces one URL's messages 5.5 s apart for the
    # services that name no pace of their own, ntfy's and Rocket.Chat's)
    assert _sink(url).send(_post("resolved", ident=2)).ok
    sent = hooks.to(path)
    assert len(sent) == 2, sent
    opened, resolved = (TEXT_OF[scheme](r) for r in sent)
    assert "CRITICAL: loss spike in run exp" in opened and "step 20" in opened and "Bad batch" in opened
    assert "Resolved: loss spike in run exp" in resolved and "recovered at step 25" in resolved
    # (no thread to reply in: the resolution names the alert it follows)
    assert "opened at step 20, raised 2027-01-15 08:00:00 UTC" in resolved


def test_mailto_reaches_a_real_smtp_server_as_html_with_names_escaped():
    with MailServer() as mail:
        sink = _sink(mail.url())
        assert sink.format == "html" and sink.takes_plots
        assert sink.send(_post("opened", replace(SPIKE, run=HOSTILE))).ok
    [message] = mail.messages
    assert message["To"] == "ops@example.com"
    assert message["Subject"].startswith("lossguard CRITICAL: loss spike in run evil\\n[x]")  # a subject is plain text
    html = message.get_body(("html",)).get_content()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html
    assert "evil\\n" in html  # (the newline of the name made visible, not a line of its own)


@pytest.mark.parametrize("form,shown,absent", [
    pytest.param("json://localhost:{port}/hook", r"evil\n[x](javascript:alert(1)) <img src=x onerror=alert(1)> **b**", [], id="text: as written"),
    pytest.param("rocket://tokena/tokenb@localhost:{port}/#training", r"evil\\n\[x\](javascript:alert(1)) &lt;img src=x onerror=alert(1)&gt; \*\*b\*\*",
                 ["[x](", "<img"], id="markdown: no link, no tag, no emphasis"),
    pytest.param("json://localhost:{port}/hook?format=html", r"evil\n[x](javascript:alert(1)) &lt;img src=x onerror=alert(1)&gt; **b**",
                 ["<img"], id="html chosen in the URL: no tag"),
])
def test_names_from_disk_are_escaped_for_the_markup_each_service_reads(hooks, form, shown, absent):
    sink = _sink(form.format(port=hooks.port))
    assert sink.send(_post("opened", replace(SPIKE, run=HOSTILE))).ok
    [req] = hooks.requests
    body = req.json().get("message") or req.json()["text"]
    assert shown in body
    for raw in absent:
        assert raw not in body
    assert "evil\n" not in body  # the name's newline forges no line


def test_a_crash_is_told_by_its_error_and_its_log_lines_escaped_and_a_divergence_by_its_minimum(hooks):
    crash = replace(SPIKE, run=HOSTILE, rule="crash-cuda-oom", kind="crash", error="CUDA out of memory",
                    lines=("torch.OutOfMemoryError: CUDA out of memory. <img src=x onerror=alert(1)>",))
    sink = _sink(f"rocket://tokena/tokenb@localhost:{hooks.port}/#training")
    assert sink.send(_post("opened", crash)).ok
    body = hooks.requests[-1].json()["text"]
    assert "run crashed: CUDA out of memory" in body and "last step" in body
    assert "torch.OutOfMemoryError" in body and "<img" not in body
    diverged = replace(SPIKE, kind="divergence")
    # (A URL of its own: apprise spaces two messages to one Rocket.Chat URL 5.5 s apart.)
    sink = _sink(f"rocket://tokenc/tokend@localhost:{hooks.port}/#training")
    assert sink.send(_post("opened", diverged)).ok
    body = hooks.requests[-1].json()["text"]
    assert "loss divergence" in body and "vs its recent minimum" in body


def test_500s_and_a_refused_connection_are_retried_with_backoff_then_left_to_the_next_round(hooks):
    hooks.status["/hook"] = 500
    waits: list[float] = []
    delivery = _sink(f"json://lg:S3cretPass@localhost:{hooks.port}/hook", sleep=waits.append).send(_post("opened"))
    assert not delivery.ok and not delivery.permanent
    assert len(hooks.to("/hook")) == 3 and waits == [0.5, 1.0]
    assert "500" in delivery.error and "S3cretPass" not in delivery.describe()
    refused = _sink(f"json://localhost:{refused_port()}/hook", sleep=waits.append).send(_post("opened"))
    assert not refused.ok and not refused.permanent and refused.error.startswith("json://localhost:")


def test_a_refusal_of_the_url_itself_is_permanent_and_not_retried(hooks):
    hooks.status["/hook"] = 401
    delivery = _sink(f"json://localhost:{hooks.port}/hook", sleep=lambda s: None).send(_post("opened"))
    assert not delivery.ok and delivery.permanent and "fix the URL" in delivery.fix
    assert len(hooks.to("/hook")) == 1


def test_the_plot_is_attached_where_the_service_takes_attachments(hooks, tmp_path):
    from PIL import Image

    png = tmp_path / "plot.png"
    Image.new("RGB", (40, 20), "white").save(png)
    plot = Plot(png, Picture(SPIKE, ()), None, "s-1-plot", "s-1")
    sink = _sink(f"json://localhost:{hooks.port}/hook")
    assert sink.takes_plots and sink.send_plot(plot).ok
    [attached] = hooks.to("/hook")[0].json()["attachments"]
    assert png_size(base64.b64decode(attached["base64"])) == png_size(png.read_bytes())
    gotify = _sink(f"gotify://localhost:{hooks.port}/AppTokenAbc123")
    assert not gotify.takes_plots  # (the daemon queues no picture for it)


@pytest.mark.parametrize("url,says", [
    pytest.param("bogus://host/Zz9SecretZz9", "unknown scheme 'bogus'", id="unknown scheme"),
    pytest.param("discord://123456789012", "Discord Webhook Token", id="discord without its token"),
    pytest.param("gotify://gotify.example.org", "Gotify Token", id="gotify without its token"),
    pytest.param("json://localhost/x,  tgram://", "tgram://***", id="one bad among several"),
])
def test_a_url_that_cannot_work_is_refused_at_start_in_one_line_masked(monkeypatch, url, says):
    monkeypatch.setenv("LOSSGUARD_NOTIFY_URLS", url)
    with pytest.raises(ConfigError) as err:
        load_settings()
    line = str(err.value)
    assert "\n" not in line and line.startswith("invalid settings: LOSSGUARD_NOTIFY_URLS:") and says in line
    assert "Zz9SecretZz9" not in line and "123456789012" not in line


def test_urls_come_comma_separated_from_a_file_and_from_systemd_credentials(monkeypatch, tmp_path):
    monkeypatch.setenv("LOSSGUARD_NOTIFY_URLS", "json://localhost:1/a, mailto://localhost:2?to=a@x.org,b@x.org&from=l@x.org")
    urls = [u.get_secret_value() for u in load_settings().notify_urls]
    assert urls == ["json://localhost:1/a", "mailto://localhost:2?to=a@x.org,b@x.org&from=l@x.org"]  # (a comma inside a URL stays)
    monkeypatch.delenv("LOSSGUARD_NOTIFY_URLS")
    (tmp_path / "notify_urls").write_text("ntfy://localhost:3/topic\ngotify://localhost:4/AppTokenAbc123\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert sink_names([u.get_secret_value() for u in load_settings().notify_urls]) == ["notify-ntfy", "notify-gotify"]
    monkeypatch.setenv("LOSSGUARD_NOTIFY_URLS_FILE", str(tmp_path / "notify_urls"))
    assert len(load_settings().notify_urls) == 2
    monkeypatch.delenv("LOSSGUARD_NOTIFY_URLS_FILE")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    config = tmp_path / "lossguard.toml"
    config.write_text('[notify]\nurls = ["json://localhost:1/a", "tgram://"]\n')
    with pytest.raises(ConfigError, match=r"lossguard.toml:2: notify.urls: tgram://\*\*\* is missing"):
        load_settings(config)


def test_without_apprise_the_error_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "apprise", None)  # (an import of it fails, as when it is not installed)
    monkeypatch.setenv("LOSSGUARD_NOTIFY_URLS", "json://localhost/x")
    with pytest.raises(ConfigError, match=r"pip install 'lossguard\[notify\]'"):
        load_settings()


def test_sink_names_are_stable_per_scheme_and_hold_no_secret():
    urls = ["json://u:pw@localhost/a", "tgram://123:SeCrEt/1", "json://localhost/b"]
    assert sink_names(urls) == ["notify-json", "notify-tgram", "notify-json-2"]


def test_alert_test_posts_to_each_url_and_config_check_masks_them(hooks, monkeypatch):
    secret_url = f"json://lg:Pa55word-xyz@localhost:{hooks.port}/hook/Tok3nSecret"
    dead = f"gotify://localhost:{refused_port()}/AppTok3nSecret"
    env = {"LOSSGUARD_NOTIFY_URLS": f"{secret_url},{dead}", "NO_PROXY": "*"}
    res = run_lossguard("alert", "test", env=env)
    assert res.returncode == 2, res.stderr
    assert f"test message to notify-json (json://localhost:{hooks.port}/***): delivered" in res.stdout
    assert "test message to notify-gotify (gotify://localhost:" in res.stderr and "failed" in res.stderr
    assert len(hooks.to("/hook")) == 1 and "lossguard test message" in hooks.to("/hook")[0].json()["message"]
    monkeypatch.setenv("LOSSGUARD_NOTIFY_URLS", env["LOSSGUARD_NOTIFY_URLS"])
    shown = str(load_settings().masked())  # (what `config check` prints)
    assert f"json://localhost:{hooks.port}/***" in shown and "gotify://localhost:" in shown
    for secret in ("Pa55word-xyz", "Tok3nSecret", "AppTok3nSecret"):
        assert secret not in res.stdout + res.stderr + shown
    bad = run_lossguard("config", "check", env={"LOSSGUARD_NOTIFY_URLS": "discord://98765432100/"})
    assert "98765432100" not in assert_one_error_line(bad, "LOSSGUARD_NOTIFY_URLS", "discord://***")


def test_a_burst_of_new_incidents_is_one_message_listing_them(hooks, tmp_path):
    state = State(tmp_path / "state")
    sink = _sink(f"json://localhost:{hooks.port}/hook")
    runs = [f"exp{k}" for k in range(4)]
    with state.transaction() as tx:  # (four runs spiking at once, then one more later: as the daemon records them)
        for run in runs:
            inc = replace(SPIKE, run=run)
            tx.enqueue(Notice("opened", run, inc, source="x"), incident_id=tx.add_incident(inc, source="x", quiet=False, now=1.0),
                       sinks=[sink.name], now=1.0)
    Dispatcher(state, {sink.name: sink}).round()
    (burst,) = hooks.to("/hook")
    text = TEXT_OF["json"](burst)
    assert "4 new incidents: 4 spikes" in text and all(f"run {run}: loss spike at step 20" in text for run in runs)
    assert burst.json()["type"] == "failure"  # (the worst of them: critical)
    assert state.pending(sink=sink.name) == []
    state.close()
