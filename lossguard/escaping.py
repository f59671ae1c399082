"""Names from disk (runs, tags, files) are data: this module makes them safe for each output they
reach. A run folder may be named `$'\\e[2J'` (clears the terminal), carry an OSC 52 sequence (writes
the reader's clipboard), a newline (forges a line in a log), a bidi override (shows text reversed),
`<img onerror=...>` or `[x](javascript:...)` (runs in a rendered report). Linux allows all of them.

Each output has one function here, and every renderer calls it for every name it inserts:
`printable` for terminals and log lines (and before the others, so no output carries a raw control
character), `markdown` and `markdown_code` for Markdown, `html_text` for HTML. Machine formats
(JSON, CSV) keep names exact: their own quoting is the escaping there.

A name that is not valid UTF-8 (`$'old\\xe9.log'`) reaches Python as a lone surrogate per stray
byte (os.fsdecode's surrogateescape: `\\udce9`), which no UTF-8 output can hold: SQLite, JSON
read by anything but Python, Slack, Prometheus all refuse or mangle it. `decodable` shows each such
byte as `\\xe9` where a run or file is named (its bytes are kept only where the file is opened).
"""

from __future__ import annotations

import html
import re


def _visible(code: int) -> str:
    return {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


_UNSAFE = [
    *range(0x00, 0x20),  # C0 controls: ESC starts every terminal sequence; CR, LF break lines
    0x7F,  # DEL
    *range(0x80, 0xA0),  # C1 controls: 0x9b is a one-byte CSI, 0x9d a one-byte OSC on some terminals
    0x061C, 0x200E, 0x200F,  # bidi marks
    *range(0x202A, 0x202F),  # bidi embeddings and overrides (LRE..RLO)
    *range(0x2066, 0x206A),  # bidi isolates (LRI..PDI)
    0x2028, 0x2029,  # line and paragraph separators: a new line to many log viewers and editors
]
_SURROGATES = {code: f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}" for code in range(0xD800, 0xE000)}
"""A stray byte as os.fsdecode gives it (U+DC80-U+DCFF) as that byte (`\\xe9`), any other lone
surrogate (from a JSON escape) as itself (`\\ud800`)."""
_PRINTABLE = {**{code: _visible(code) for code in _UNSAFE}, **_SURROGATES}
_PRINTABLE_LINES = {code: v for code, v in _PRINTABLE.items() if code != 0x0A}


def printable(text: str) -> str:
    """Control characters (C0, DEL, C1), bidi controls and line separators as visible escapes
    (`\\x1b`, `\\n`, `\\u202e`), so a name stays on its line and cannot drive the terminal; bytes
    that were not UTF-8 as `decodable` shows them (a log line must encode). A
    backslash is left as it is: names with one are rare, and doubling it would change them all."""
    return text.translate(_PRINTABLE)


def decodable(text: str) -> str:
    """`text` with the bytes that were not UTF-8 on disk shown as `\\xe9` (see the module's doc):
    valid Unicode, and the same every time for the same name."""
    return text if text.isascii() else text.translate(_SURROGATES)


def printable_lines(text: str) -> str:
    """`printable` for text made of lines on purpose (a traceback): only the newline stays raw."""
    return text.translate(_PRINTABLE_LINES)


_MD_PUNCT = re.compile(r"[\\`*\[\]|~]|(?<![^\W_])_|_(?![^\W_])")
"""Backslash, code, emphasis, link, table and strikethrough punctuation. Escaping `[` and `]` is
enough to stop a link or an image (`(`, `)` and `!` are harmless without them), and an underscore
between two letters or digits cannot start or end emphasis, so `bad_batch` stays as it is."""


def markdown(text: str) -> str:
    """Text that Markdown (GitHub's included) shows as written, also inside a table cell: `<`, `>`
    and `&` as entities, so no HTML tag or entity is formed; the punctuation of emphasis, code,
    links and table cells backslash-escaped, so `[x](javascript:...)` is no link and `|` no cell
    border. Control characters are made visible first (`printable`)."""
    text = printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_PUNCT.sub(lambda m: "\\" + m.group(), text)


def markdown_code(text: str) -> str:
    """An inline code span that no backtick in the text can end early: its fence is one backtick
    longer than the longest run inside (entities and backslashes are literal in a code span, so
    only control characters need escaping)."""
    text = printable(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html_text(text: str) -> str:
    """For HTML text and attribute values alike: control characters visible, then `&`, `<`, `>`
    and both quotes as entities."""
    return html.escape(printable(text), quote=True)
