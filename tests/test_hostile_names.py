"""Names from disk are data. A run folder or file named with an escape sequence (clear screen, OSC 52
writes the clipboard), a newline (forges a line), a bidi override or Markdown/HTML syntax reaches
every output only escaped: the terminal report, warnings, `read`, `status`, the daemon's log, Slack
text, Markdown and HTML. JSON keeps it exact (its escaping already covers control characters).
The commands run as real processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from lossguard.alerts.message import build, digest, for_notice, summary
from lossguard.alerts.slack import SlackBot
from lossguard.detection.engine import analyse_run
from lossguard.model import Notice
from lossguard.detection.rules import default_rules

from . import synth
from .conftest import FIXTURES, run_lossguard
from .test_watch import Watch, _calm, _line

HOSTILE = "ev\x1b[2J\x1b[Hil\x1b]52;c;SGVsbG8=\x07\nINFO forged line\u202eeno"
"""Clears the screen, writes the clipboard (OSC 52), starts a line of its own, reverses the rest."""
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""What must never reach a person's output: every control character but the newline between lines."""


def _lossguard(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lossguard.cli", *map(str, args)], capture_output=True, text=True, timeout=120)


def _assert_safe(text: str) -> None:
    assert not RAW.search(text), RAW.search(text)
    assert not any(line.startswith("INFO forged") for line in text.splitlines())


@pytest.fixture
def hostile_runs(tmp_path) -> Path:
    """A run with a spike under the hostile name, and next to it a file of that name that cannot be read."""
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES / "runs" / "lightning-bad-batch", runs / HOSTILE)
    (runs / "other").mkdir()
    (runs / "other" / f"{HOSTILE}.jsonl").write_text("not a log\n")
    return runs


def test_scan_table_and_its_warnings_show_control_characters_escaped(hostile_runs):
    done = _lossguard("scan", hostile_runs)
    assert done.returncode == 1, done.stderr
    _assert_safe(done.stdout)
    assert "ev\\x1b[2J\\x1b[Hil\\x1b]52;c;SGVsbG8=\\x07\\nINFO forged line\\u202eeno/version_0" in done.stdout
    assert "1 warning(s):" in done.stdout and ".jsonl: no training metrics" in done.stdout


def test_scan_warnings_on_stderr_are_escaped_and_json_keeps_the_name_exact(hostile_runs):
    done = _lossguard("scan", hostile_runs, "--format", "json")
    assert done.returncode == 1, done.stderr
    _assert_safe(done.stderr)
    assert "warning: " in done.stderr and "\\x1b]52" in done.stderr
    _assert_safe(done.stdout)  # json.dumps escapes them: \u001b
    assert json.loads(done.stdout)["runs"][0]["run"] == f"{HOSTILE}/version_0"


def test_read_table_and_its_warnings_are_escaped(hostile_runs):
    done = _lossguard("read", hostile_runs, "--metric", "loss")
    assert done.returncode == 0, done.stderr
    _assert_safe(done.stdout)
    _assert_safe(done.stderr)
    assert "\\x1b[2J" in done.stdout and "\\x1b]52" in done.stderr


def test_read_csv_shows_control_characters_in_names_as_the_table_does_and_json_keeps_them_exact(hostile_runs):
    # Acceptance run 3, finding 7: CSV has no escapes of its own, and `read --format csv | head`
    # on a terminal ran the name's escape sequences.
    tagged = hostile_runs / "tagged"
    tagged.mkdir()
    (tagged / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0, "lo\x1b[2Jss": 1.0}) + "\n" for s in range(1, 4)))
    done = _lossguard("read", hostile_runs, "--format", "csv")
    assert done.returncode == 0, done.stderr
    _assert_safe(done.stdout)
    _assert_safe(done.stderr)
    assert "ev\\x1b[2J\\x1b[Hil" in done.stdout and "lo\\x1b[2Jss" in done.stdout
    assert done.stdout.splitlines()[0] == "run,source,step,metric,tag,value,wall_time"
    exact = _lossguard("read", hostile_runs, "--format", "json")
    rows = [json.loads(line) for line in exact.stdout.splitlines()]
    assert {r["run"] for r in rows} >= {f"{HOSTILE}/version_0", "tagged"} and "lo\x1b[2Jss" in {r["tag"] for r in rows}


def test_compare_rules_table_is_escaped(hostile_runs):
    rules = Path(__file__).parent.parent / "lossguard" / "data" / "default.toml"
    done = _lossguard("scan", hostile_runs, "--compare-rules", rules, rules)
    _assert_safe(done.stdout)
    assert "\\x1b[2J" in done.stdout


def test_daemon_log_and_status_keep_a_hostile_run_on_one_escaped_line(tmp_path):
    run = tmp_path / "runs" / HOSTILE
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(_calm(range(1, 20)))
    (run / "events.out.tfevents.1.gpu-3").write_bytes(b"not an event record " * 10)
    w = Watch(tmp_path).start()
    try:
        w.wait_ready()
        with open(run / "metrics.jsonl", "a") as fh:
            fh.write(_line(20, 9.0))
        w.wait_for(lambda ev: any(e["event"] == "opened" for e in ev))
        status = _lossguard("status", "--state-dir", tmp_path / "state")
    finally:
        log = w.stop_and_read()
    _assert_safe(log)
    assert re.search(r"(?m)^(\S+ )?WARNING OPENED .*run ev\\x1b\[2J.*\\nINFO forged line\\u202eeno: loss spike at step 20", log), log
    assert re.search(r"(?m)^(\S+ )?WARNING .*/ev\\x1b\[2J.*\\u202eeno/events.out.tfevents.1.gpu-3 @ byte 0: corrupt", log), log
    assert status.returncode == 0, status.stderr
    _assert_safe(status.stdout)
    assert "\\x1b]52" in status.stdout


def _incident(run: str):
    return analyse_run(synth.long_frame("gradient_explosion"), default_rules(), run=run).incidents[0]


def _texts(message) -> list[str]:
    out = [message.text]
    for block in message.blocks:
        if "text" in block:
            out.append(block["text"]["text"])
        out += [e["text"] for e in block.get("elements", ())]
    return out


def test_slack_messages_hold_no_raw_control_character_and_no_forged_line():
    inc, plain = _incident(HOSTILE), _incident("exp")
    messages = [
        build(inc, host="gpu-3", source=f"/runs/{HOSTILE}/train.log", spark=(1.0, 5.0)),
        for_notice(Notice(kind="stalled", run=HOSTILE, step=7, minutes=30), host="gpu-3"),
        summary(tuple(Notice(kind="opened", run=HOSTILE, incident=inc) for _ in range(3))),
        digest(host="gpu-3", totals={"spikes": 1, "findings": 1, "runs_with_spikes": 1, "runs": 1, "warnings": 0}, runs=[(HOSTILE, (inc,))]),
    ]
    for message in messages:
        for text in _texts(message):
            _assert_safe(text)
    same = build(plain, host="gpu-3", source="/runs/exp/train.log", spark=(1.0, 5.0))
    assert messages[0].text.count("\n") == same.text.count("\n")


MRKDWN = "*URGENT* _prod_ ~x~ https://evil.example/login"
"""A run name (an MLflow experiment and run) that Slack's mrkdwn would show bold, italic, struck
through and as a link, outside a code span."""


def test_slack_summary_digest_and_stall_show_a_runs_mrkdwn_as_code_not_as_formatting():
    # The alert's facts showed the run as code; the burst summary, the nightly digest, the stall
    # notice and every alert's plain-text fallback showed it as mrkdwn.
    inc = _incident(MRKDWN)
    messages = [
        build(inc, host="gpu-3", source=f"/runs/{MRKDWN}/train.log"),
        for_notice(Notice(kind="stalled", run=MRKDWN, step=7, minutes=30), host="gpu-3"),
        summary(tuple(Notice(kind="opened", run=MRKDWN, incident=inc) for _ in range(3))),
        digest(host="gpu-3", totals={"spikes": 1, "findings": 1, "runs_with_spikes": 1, "runs": 1, "warnings": 0}, runs=[(MRKDWN, (inc,))]),
    ]
    for message in messages:
        # The message's text (its notification's fallback) and its mrkdwn blocks; a header is plain_text.
        shown = [message.text] + [b["text"]["text"] for b in message.blocks if b.get("text", {}).get("type") == "mrkdwn"]
        shown += [e["text"] for b in message.blocks for e in b.get("elements", ()) if e.get("type") == "mrkdwn"]
        for text in shown:
            outside = re.sub(r"`[^`]*`", "", text)
            assert "*URGENT*" not in outside and "https://evil" not in outside, text
        assert f"`{MRKDWN}`" in message.text and any(f"`{MRKDWN}`" in t for t in shown[1:]), shown


def test_read_csv_writes_a_name_a_spreadsheet_takes_for_a_formula_as_text(tmp_path):
    # A run (a W&B project, an MLflow run name, a folder) or a metric named `=HYPERLINK(...)` was a
    # live formula in the CSV a person opens in a spreadsheet.
    formula = '=HYPERLINK("evil.example","click")'  # (a folder's name: no slash)
    run = tmp_path / "runs" / formula
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0, "@SUM(A1)": 1.0, "-2+3": 0.5}) + "\n" for s in range(3)))
    done = _lossguard("read", tmp_path / "runs", "--format", "csv")
    assert done.returncode == 0, done.stderr
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert {r["run"] for r in rows} == {"'" + formula} and {r["tag"] for r in rows} == {"loss", "'@SUM(A1)", "'-2+3"}
    assert not [v for r in rows for v in r.values() if v[:1] in ("=", "+", "@") or (v[:1] == "-" and not v[1:2].isdigit())]
    assert {float(r["value"]) for r in rows} == {2.0, 1.0, 0.5}


def test_slack_receives_the_hostile_name_escaped_through_the_real_client(slack):
    bot = SlackBot("xoxb-0000-TEST", "#training", base_url=slack.base_url, backoff=0.01)
    assert bot.post(build(_incident(HOSTILE), host="gpu-3", source="/runs/x/train.log")).ok
    assert bot.post(build(_incident("exp"), host="gpu-3", source="/runs/x/train.log")).ok
    hostile, plain = slack.requests
    for text in [hostile.body["text"], *(json.dumps(b, ensure_ascii=False) for b in hostile.body["blocks"])]:
        _assert_safe(text)
    assert "] `ev\\x1b[2J\\x1b[Hil" in hostile.body["text"].splitlines()[0]  # (the run as code)
    assert hostile.body["text"].count("\n") == plain.body["text"].count("\n")



MARKUP = ['"><img src=x onerror=alert(2)>', "[x](javascript:alert(1))", "a`b|c", "*em* _x_ & &amp;"]
"""Run names that are HTML, a link, a code span with a cell border, emphasis and entities."""


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells, split where GitHub splits them: at every `|` not escaped."""
    return re.split(r"(?<!\\)\|", row.strip())[1:-1]


def test_markdown_report_shows_markup_in_run_names_as_text(tmp_path):
    runs = tmp_path / "runs"
    for name in MARKUP:
        shutil.copytree(FIXTURES / "runs" / "lightning-bad-batch", runs / name)
    (runs / "other").mkdir()
    (runs / "other" / "b`ad ``x``.jsonl").write_text("not a log\n")
    done = _lossguard("scan", runs, "--format", "markdown")
    assert done.returncode == 1, done.stderr
    text = done.stdout
    assert "<img" not in text and not re.search(r"(?<!\\)\]\(javascript:", text)  # no tag, no link
    rows = [line for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")]
    assert len(rows) == 2 + 2 * len(MARKUP)  # two headers, a summary row and a spike row per run
    assert all(len(_cells(row)) in (7, 10) for row in rows), rows
    assert "- ```" in text  # the warning's code span is fenced longer than the backticks in the file name
    # As a Markdown renderer builds it (Python-Markdown, with tables): the names come back as text.
    import markdown as markdown_lib

    html = markdown_lib.markdown(text, extensions=["tables"])
    assert "<img" not in html and "<a " not in html and "<em>" not in html
    shown = {unescape(cell) for cell in re.findall(r"<td>(.*?)</td>", html)}
    assert {f"{name}/version_0" for name in MARKUP} <= shown
    assert re.search(r"<code>.*b`ad ``x``\.jsonl: no training metrics", unescape(html))


def test_html_report_shows_control_characters_escaped(tmp_path):
    shutil.copytree(FIXTURES / "runs" / "lightning-bad-batch", tmp_path / "runs" / HOSTILE)
    out = tmp_path / "report.html"
    _lossguard("scan", tmp_path / "runs", "--format", "html", "--output", out)
    text = out.read_text(encoding="utf-8")
    _assert_safe(text)
    # Shown escaped; the section's anchor is its place, not the name (which may hold anything).
    assert '<h2 id="run-0">ev\\x1b[2J\\x1b[Hil\\x1b]52;c;SGVsbG8=\\x07\\nINFO forged line\\u202eeno/version_0 ' in text
    assert 'href="#run-0"' in text


def test_a_file_name_that_is_not_utf8_is_followed_and_alerted_escaped_and_blinds_no_other_run(tmp_path):
    import os
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from .am_server import free_port

    root = os.fsencode(tmp_path / "runs")
    for folder, name in ((b"a", b"metrics.jsonl"), (b"b", b"old\xe9.log"), (b"c\xff", b"metrics.jsonl")):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        with open(os.path.join(root, folder, name), "w") as fh:
            fh.write(_calm(range(1, 30)))
    port = free_port()
    w = Watch(tmp_path, "--metrics-listen", str(port)).start()
    try:
        w.wait_settled()  # before: every pass failed storing the file row (UnicodeEncodeError), none committed
        for folder, name in ((b"a", b"metrics.jsonl"), (b"b", b"old\xe9.log"), (b"c\xff", b"metrics.jsonl")):
            with open(os.path.join(root, folder, name), "a") as fh:
                fh.write(_line(30, 9.0))
        ev = w.wait_for(lambda ev: len({e["run"] for e in ev if e["event"] == "opened"}) == 3)
        opened = {e["run"]: e["source"] for e in ev if e["event"] == "opened"}
        assert opened == {"a": str(tmp_path / "runs/a/metrics.jsonl"), "b/old\\xe9": str(tmp_path / "runs/b/old\\xe9.log"),
                          "c\\xff": str(tmp_path / "runs/c\\xff/metrics.jsonl")}
        assert "\\ud" not in w.out.read_bytes().decode("utf-8")  # valid UTF-8 JSON, no lone surrogate escapes
        deadline = time.monotonic() + 10
        while True:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310 - localhost
            runs = {s.labels["run"] for f in text_string_to_metric_families(body) for s in f.samples if f.name == "lossguard_run_last_step"}
            if len(runs) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert runs == {"a", "b/old\\xe9", "c\\xff"}
        status = run_lossguard("status", "--state-dir", str(tmp_path / "state"))
        assert status.returncode == 0 and "runs/b/old\\xe9.log" in status.stdout and "c\\xff" in status.stdout
        with open(os.path.join(root, b"b", b"old\xe9.log"), "a") as fh:
            fh.write(_calm(range(31, 40)))
        w.settle()
    finally:
        err = w.stop_and_read()
    assert "Traceback" not in err and "\\udc" not in err, err[-3000:]
    said = [line for line in err.splitlines() if "not valid UTF-8" in line]
    assert [line.split("WARNING ")[1].split(":")[0] for line in said] == sorted(
        [str(tmp_path / "runs/b/old\\xe9.log"), str(tmp_path / "runs/c\\xff/metrics.jsonl")]), said


def test_scan_and_read_name_a_file_that_is_not_utf8_escaped(tmp_path):
    import os

    folder = os.fsencode(tmp_path / "runs" / "b")
    os.makedirs(folder)
    with open(os.path.join(folder, b"old\xe9.log"), "w") as fh:
        fh.write(_calm(range(1, 30)) + _line(30, 9.0) + _calm(range(31, 40)))
    scan = run_lossguard("scan", str(tmp_path / "runs"), "--format", "json")
    assert scan.returncode == 1, scan.stderr
    [run] = json.loads(scan.stdout)["runs"]
    assert (run["run"], run["source"]) == ("b/old\\xe9", str(tmp_path / "runs/b/old\\xe9.log"))
    assert "\\ud" not in scan.stdout
    read = run_lossguard("read", os.fsdecode(os.path.join(folder, b"old\xe9.log")))  # before: exit 3, UnicodeEncodeError
    assert read.returncode == 0 and "old\\xe9" in read.stdout and "\\udc" not in read.stdout, read.stderr
