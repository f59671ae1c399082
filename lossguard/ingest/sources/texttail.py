"""The last lines of a run's text logs: what the crash rules and the `stalled` notice read.

Only the tail is read (TAIL_BYTES), whatever the file's size: the error that ended a run is in its
last lines, and a 40 GB console log must cost no more than a small one. Only console-like files
(`.log`, `.out`, `.err`, `.txt`, `.stdout`, `.stderr`) are read: a tracker's files, a CSV or a JSONL
of metrics never hold a traceback.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...escaping import decodable
from ..formats.base import ANSI

TAIL_BYTES = 64 << 10
"""About 400 lines of ordinary output: a traceback with its chained causes and torchrun's table."""
MAX_TAIL_LINES = 2000
"""Lines kept of the tail (a tail of empty lines is still a bounded list)."""
CONSOLE_SUFFIXES = (".log", ".out", ".err", ".txt", ".stdout", ".stderr")
TORCHRUN_RANK = re.compile(r"^attempt_[0-9]+$")
"""torchrun's `--log-dir` layout (torch/distributed/elastic/multiprocessing/api.py):
`<log_dir>/<run_id>/attempt_<N>/<local_rank>/{stdout,stderr}.log`."""
_ANSI = re.compile(ANSI)


def is_console(path: str) -> bool:
    """A file a process's output is written to, which may end in the error that ended it."""
    name = os.path.basename(path).lower()
    return name.endswith(CONSOLE_SUFFIXES) or name == "nohup.out"


def torchrun_rank(path: Path) -> str | None:
    """The local rank a file of torchrun's per-rank layout holds the output of; None for any other."""
    folder = path.parent
    if path.name in ("stdout.log", "stderr.log") and folder.name.isascii() and folder.name.isdigit() and TORCHRUN_RANK.match(folder.parent.name):
        return folder.name
    return None


ERROR_FILE = "error.json"
MAX_ERROR_FILE = 1 << 20
"""An error file holds one traceback: a larger one is no error file of torch's, and is not read."""


def error_time(path: Path) -> float | None:
    """When the worker whose output `path` is (torchrun's per-rank layout) failed, as torch's
    `@record` wrote it in `error.json` beside it (torch/distributed/elastic/multiprocessing/errors/
    error_handler.py: `{"message": {"message": ..., "extraInfo": {"timestamp": "<seconds>"}}}`);
    None for a worker that wrote none (it did not fail, or its script has no `@record`) or a file
    not of that shape."""
    if torchrun_rank(path) is None:
        return None
    try:
        with open(path.with_name(ERROR_FILE), "rb") as f:
            data = json.loads(f.read(MAX_ERROR_FILE + 1)[:MAX_ERROR_FILE])
        stamp = data["message"]["extraInfo"]["timestamp"]
        return float(stamp)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def tail_lines(path: Path, *, final: bool, size: int | None = None) -> tuple[str, ...]:
    """The file's last complete lines (`final`: the last one even without its newline: the file is
    done). The first line of the tail is dropped when the tail starts inside it; a progress bar's
    carriage returns and terminal colours are taken out, so each line reads as its last state.
    OSError is the caller's (the file went away, or cannot be read)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END) if size is None else size
        start = max(0, end - TAIL_BYTES)
        f.seek(start)
        data = f.read(end - start)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    if not final:
        data = data[: data.rfind(b"\n") + 1]
    text = data.decode("utf-8", errors="replace")
    lines = [_ANSI.sub("", line.rstrip("\r").rsplit("\r", 1)[-1]) for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(lines[-MAX_TAIL_LINES:])


@dataclass(frozen=True)
class Tail:
    """The last lines of one log of a run, oldest first."""

    source: str
    lines: tuple[str, ...]
    rank: str | None = None
    """The rank whose output this is (torchrun's `--log-dir` layout names it by folder)."""
    failed_at: float | None = None
    """When the process failed, by the error file torch wrote beside its output (error_time)."""


def latest_attempts(paths: list[str] | tuple[str, ...]) -> list[str]:
    """`paths` less the output of torchrun's earlier attempts of a job (`attempt_0/` once
    `attempt_1/` is there): a restarted job ended, or not, as its latest attempt did."""
    attempt_of = {p: Path(p).parent.parent for p in paths if torchrun_rank(Path(p)) is not None}
    latest: dict[Path, int] = {}
    for attempt in attempt_of.values():
        latest[attempt.parent] = max(latest.get(attempt.parent, 0), _number(attempt))
    return [p for p in paths if p not in attempt_of or _number(attempt_of[p]) == latest[attempt_of[p].parent]]


def _number(attempt: Path) -> int:
    """N of torchrun's `attempt_N` folder."""
    return int(attempt.name.split("_")[1])


STALE = 600.0
"""Seconds a console file's last write may lie behind the newest of its run's files and still be
where the run ended: a run restarted into a new file leaves the old one ending in its old crash."""


def current(paths: list[str] | tuple[str, ...]) -> list[str]:
    """`paths` less the files last written more than STALE seconds before the newest of them (all of
    them where their times cannot be read): what the run wrote last, not what it left behind."""
    written: dict[str, float] = {}
    for path in paths:
        try:
            written[path] = os.stat(path).st_mtime
        except OSError:
            continue
    newest = max(written.values(), default=0.0)
    return [p for p in paths if newest - written.get(p, newest) <= STALE]


def tails_of(paths: list[str] | tuple[str, ...], *, final: bool, live: bool = False) -> list[Tail]:
    """The tails of the console logs among `paths` (a run's files: of a torchrun job, its latest
    attempt's; followed `live`, none its run left behind, `current`: files copied for an audit keep
    no trustworthy times); a file that cannot be read now is left out (its reader says why)."""
    out = []
    for path in current(latest_attempts(paths)) if live else latest_attempts(paths):
        if not is_console(path):
            continue
        try:
            lines = tail_lines(Path(path), final=final)
        except OSError:
            continue
        out.append(Tail(decodable(path), lines, torchrun_rank(Path(path)), error_time(Path(path))))
    return out
