"""The escapes every output uses for names from disk: what they neutralise, and what they must leave
alone (ordinary names, accents, CJK, emoji look the same everywhere)."""

from __future__ import annotations

import json
from pathlib import Path
import logging
import sys

import pytest

from lossguard.watch.daemon import SafeFormatter
from lossguard.escaping import html_text, markdown, markdown_code, printable


@pytest.mark.parametrize("name, shown", [
    pytest.param("\x1b[2Jcleared", "\\x1b[2Jcleared", id="ESC (clear screen)"),
    pytest.param("a\x1b]52;c;SGk=\x07b", "a\\x1b]52;c;SGk=\\x07b", id="OSC 52 with BEL"),
    pytest.param("a\nb\rc\td", "a\\nb\\rc\\td", id="newline, carriage return, tab"),
    pytest.param("a\x7fb\x9bc", "a\\x7fb\\x9bc", id="DEL and the one-byte CSI"),
    pytest.param("abc\u202edef\u2066x\u2069", "abc\\u202edef\\u2066x\\u2069", id="bidi override and isolates"),
    pytest.param("a\u2028b", "a\\u2028b", id="line separator"),
])
def test_printable_shows_control_characters_as_visible_escapes(name, shown):
    assert printable(name) == shown


@pytest.mark.parametrize("name", ["llama-7b_lr3e-4/version_0", "café-été", "日本語の実験", "run 🚀 #2", "a\\x1b"])
def test_printable_leaves_ordinary_names_as_they_are(name):
    assert printable(name) == name


def test_log_formatter_keeps_a_name_with_a_newline_on_one_line_and_masks_a_token():
    record = logging.LogRecord("lossguard", logging.WARNING, __file__, 1, "run %s: %s", ("a\nINFO forged\x1b[2J", "Bearer xoxb-1-2-SECRET"), None)
    line = SafeFormatter("%(levelname)s %(message)s").format(record)
    assert line == "WARNING run a\\nINFO forged\\x1b[2J: Bearer ***"


def test_log_formatter_keeps_a_tracebacks_lines_but_escapes_the_rest():
    try:
        raise ValueError("bad run \x1b]52;c;SGk=\x07")
    except ValueError:
        record = logging.LogRecord("lossguard", logging.ERROR, __file__, 1, "pass failed", (), sys.exc_info())
    text = SafeFormatter("%(levelname)s %(message)s").format(record)
    assert text.startswith("ERROR pass failed\nTraceback") and "\x1b" not in text and "\\x1b]52" in text


@pytest.mark.parametrize("name, shown", [
    pytest.param('"><img src=x onerror=alert(2)>', '"&gt;&lt;img src=x onerror=alert(2)&gt;', id="HTML tag"),
    pytest.param("[x](javascript:alert(1))", "\\[x\\](javascript:alert(1))", id="link"),
    pytest.param("![i](http://x/p.png)", "!\\[i\\](http://x/p.png)", id="image"),
    pytest.param("a|b`c`", "a\\|b\\`c\\`", id="cell border and code span"),
    pytest.param("*b* _i_ ~s~", "\\*b\\* \\_i\\_ \\~s\\~", id="emphasis and strikethrough (GFM)"),
    pytest.param("&lt; \\", "&amp;lt; \\\\", id="entity and backslash"),
    pytest.param("a\nb", "a\\\\nb", id="newline: visible, its backslash escaped"),
    pytest.param("bad_batch/version_0", "bad_batch/version_0", id="underscores inside words stay"),
])
def test_markdown_escapes_what_would_render_as_markup(name, shown):
    assert markdown(name) == shown


@pytest.mark.parametrize("text, shown", [
    pytest.param("plain", "`plain`", id="no backtick"),
    pytest.param("a`b", "``a`b``", id="one backtick inside"),
    pytest.param("``x`` `", "``` ``x`` ` ```", id="runs of backticks, one at the edge"),
])
def test_markdown_code_span_cannot_be_ended_by_the_text(text, shown):
    assert markdown_code(text) == shown


def test_html_text_escapes_quotes_for_attributes_and_shows_control_characters():
    assert html_text('a"b\'<c>&\x1b') == "a&quot;b&#x27;&lt;c&gt;&amp;\\x1b"


LOGGING_CHILD = """
import logging
from lossguard.watch.daemon import setup_logging
setup_logging("info")
log = logging.getLogger("lossguard")
log.info("following %s", "runs/")
log.warning("%s: corrupt", "runs/x")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("pass failed")
"""


@pytest.mark.parametrize("journal", ["none", "stderr", "stdout only"])
def test_daemon_log_lines_carry_a_timestamp_or_under_journald_each_line_its_priority(tmp_path, journal):
    # journald stamps each line itself and reads a `<N>` at a line's start as its priority
    # (`journalctl -p warning`), on every line a traceback's included; JOURNAL_STREAM names the
    # stream systemd connected (device:inode): stdout's alone when stderr goes to a file.
    import os
    import re
    import subprocess
    import sys

    err, other = tmp_path / "stderr", tmp_path / "other"
    other.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    with open(err, "w") as fh:
        if journal != "none":
            st = os.fstat(fh.fileno()) if journal == "stderr" else os.stat(other)
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", LOGGING_CHILD], stderr=fh, env=env, check=True, timeout=60)
    lines = err.read_text().splitlines()
    if journal == "stderr":
        assert lines[:2] == ["<6>INFO following runs/", "<4>WARNING runs/x: corrupt"], lines
        assert lines[2] == "<3>ERROR pass failed" and len(lines) > 4 and all(line.startswith("<3>") for line in lines[2:]), lines
        assert lines[-1] == "<3>ZeroDivisionError: division by zero"
    else:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} INFO following runs/$", lines[0]), lines
        assert lines[1].endswith(" WARNING runs/x: corrupt") and not any(line.startswith("<") for line in lines)


def test_the_followers_warnings_about_input_go_to_warn_and_the_rest_to_log(tmp_path, monkeypatch):
    """A corrupt record is said through `warn`, without the "warning: " words scan prints before
    it; a file renamed through `log`, even when its path begins with those words (a relative root
    named "warning: x"): the daemon passes its logger's warning and info (journald's priorities)
    and no longer tells them apart by how a line begins."""
    from lossguard.detection.rules import default_rules
    from lossguard.state import State
    from lossguard.watch.follow import Follower

    monkeypatch.chdir(tmp_path)
    run = Path("warning: x")
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(1, 6)))
    (run / "events.out.tfevents.1.host").write_bytes(b"\xff" * 64)
    said: list[tuple[str, str]] = []
    follower = Follower([run], rules=default_rules(), state=State(tmp_path / "state"),
                        log=lambda text: said.append(("log", text)), warn=lambda text: said.append(("warn", text)))
    follower.run_pass(1.0)
    (run / "metrics.jsonl").rename(run / "metrics.1.jsonl")
    follower.run_pass(2.0)
    warned = [text for how, text in said if how == "warn"]
    assert len(warned) == 1 and "events.out.tfevents.1.host" in warned[0] and not warned[0].startswith("warning: x/metrics"), said
    logged = [text for how, text in said if how == "log"]
    assert any(text.startswith("warning: x/metrics.jsonl: renamed to") for text in logged), said
    assert not any("tfevents" in text for text in logged), said
