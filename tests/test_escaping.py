"""The escapes every output uses for names from disk: what they neutralise, and what they must leave
alone (ordinary names, accents, CJK, emoji look the same everywhere)."""

from __future__ import annotations

import logging
import sys

import pytest

from lossguard.daemon import SafeFormatter
from lossguard.escaping import printable


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
