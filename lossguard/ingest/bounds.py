"""How much of one record, one document or one name a reader takes: a file is data from anywhere,
and a small file can ask for gigabytes (a zip member of spaces, a JSON value nested a million deep,
a run named by 50 MB). What goes over a bound is refused or cut, and said, never held whole.

A line of a text log is bounded where the lines are framed (sources/textfile.MAX_LINE); the bounds
here are for what readers parse whole: JSON documents and records, zip members, YAML files, names.
"""

from __future__ import annotations

import json
from pathlib import Path

from .sources.textfile import MAX_LINE

MAX_RECORD = MAX_LINE
"""One JSON record (a line of a zip member, a database row's JSON): as a text log's line."""
MAX_DOCUMENT = 256 << 20
"""A JSON document read whole (trainer_state.json): parsed, it takes ten times its size in memory."""
MAX_SMALL_FILE = 1 << 20
"""A tracker's own small file (an MLflow meta.yaml, Comet's experiment.json): a few hundred bytes
when its writer made it."""
MAX_NAME = 4096
"""Characters of a run's, an experiment's or a metric's name: enough for any a person gave, and
a name on every row of a table is held once a row in some of them."""
MAX_RUN = 3 * MAX_NAME
"""Characters of a run's name as a reader gives it: made of up to three names (a project's or an
experiment's, the run's, a key), each bounded where it is read."""
ELLIPSIS = "…"


class TooLarge(ValueError):
    """A file or record over its bound: not read."""


class TooDeep(ValueError):
    """JSON nested deeper than Python's parser can follow (about 1,000 levels)."""


def json_value(text: str | bytes) -> object:
    """`json.loads`, with nesting too deep to parse a ValueError like any other JSON it cannot read
    (the parser raises RecursionError there, which a reader's `except ValueError` lets through and
    which would cost the whole file rather than the one record)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("nested too deep") from None


def read_capped(path: Path | str, *, limit: int) -> bytes:
    """A file's bytes, refused (TooLarge, saying its size) when over `limit`: only `limit + 1` are
    ever read, whatever the file claims or grows to."""
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"over {size_text(limit)}")
    return data


def name(text: str, *, limit: int = MAX_NAME) -> tuple[str, bool]:
    """A name bounded to `limit` characters (cut with an ellipsis), and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[: limit - 1] + ELLIPSIS, True


def cut_name_said(what: str, length: int, *, unit: str = "characters", limit: int = MAX_NAME) -> str:
    """The warning for a name cut by `name` (`length`: what it had, in `unit`)."""
    return f"{what} of {length:,} {unit} cut to its first {limit - 1:,} characters and an ellipsis"


def size_text(n: int) -> str:
    """A bound as people read it: 16 MiB, 1 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"
