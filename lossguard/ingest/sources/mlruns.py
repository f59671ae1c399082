"""Who an MLflow file store's metric file belongs to: `<store>/<experiment id>/<run id>/metrics/<key>`,
with the names in the store's own files (mlflow/store/tracking/file_store.py):

    <experiment id>/meta.yaml           name: exp one          lifecycle_stage: active
    <experiment id>/<run id>/meta.yaml  run_name: same  start_time: 1796191965947  lifecycle_stage: deleted
    <experiment id>/<run id>/tags/mlflow.runName    the run's name as given, verbatim

The run is `experiment name/run name`. Run names repeat (every `start_run(run_name="same")`), and
two runs are never one: the first of a name in its experiment (by start time, then id) keeps the
bare name, a later one gets its id's first 8 characters (`same (27c254e2)`), so a run started
later never renames one followed already. A run whose meta.yaml says `lifecycle_stage: deleted`
(`mlflow.delete_run`), or whose experiment is deleted or under `.trash`, is not read: MLflow keeps
it for `mlflow gc` only.

The YAML is PyYAML's `safe_dump` of flat dicts (mlflow/utils/yaml_utils.py): the few top-level
scalars needed are read here (plain, single- or double-quoted, folded over lines when long) rather
than with a YAML library lossguard does not otherwise need, in time linear in the file (a quote
left open runs to its end). A meta.yaml over bounds.MAX_SMALL_FILE is not parsed (the run is named
by its id, or by its tag), and a name is cut to bounds.MAX_NAME characters: each said.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache

from .. import bounds

META = "meta.yaml"
RUN_NAME_TAG = os.path.join("tags", "mlflow.runName")
TRASH = ".trash"
DELETED = "deleted"


@dataclass(frozen=True)
class Owner:
    run: str
    """`experiment name/run name` (made distinct among runs of the same name)."""
    deleted: bool
    problem: str | None = None
    """What could not be read of the store's files (the run is then named by its ids)."""


def owner(metric_file: str, metrics_at: int) -> Owner:
    """The run of the metric file whose path's parts have `metrics` at `metrics_at`."""
    parts = metric_file.replace(os.sep, "/").split("/")
    run_dir = "/".join(parts[:metrics_at]) or "/"
    exp_dir = os.path.dirname(run_dir)
    run_id, exp_id = os.path.basename(run_dir), os.path.basename(exp_dir)
    run, run_problems = _run_meta(run_dir)
    exp, exp_problems = _yaml_file(os.path.join(exp_dir, META))
    deleted = DELETED in (run.get("lifecycle_stage"), exp.get("lifecycle_stage")) or TRASH in parts[:metrics_at]
    name = _distinct(exp_dir, run_id, run)
    exp_name, cut = bounds.name(exp.get("name") or exp_id)
    if cut:
        exp_problems.append(bounds.cut_name_said("the experiment's name", len(exp["name"])))
    return Owner(f"{exp_name}/{name}", deleted, "; ".join(run_problems + exp_problems) or None)


def _run_meta(run_dir: str) -> tuple[dict[str, str], list[str]]:
    """The run's meta.yaml scalars, its name from its tag when it has one (cut to bounds.MAX_NAME
    characters, of which no more than 4 bytes each are read), and what was not read or was cut."""
    meta, problems = _yaml_file(os.path.join(run_dir, META))
    try:
        with open(os.path.join(run_dir, RUN_NAME_TAG), "rb") as fh:
            raw = fh.read(4 * bounds.MAX_NAME + 1)
            size = os.fstat(fh.fileno()).st_size
        meta["run_name"] = raw.decode("utf-8", errors="replace")
    except OSError:
        size = 0  # (runs of old MLflow versions have no tag: meta.yaml's run_name)
    whole = meta.get("run_name", "")
    meta["run_name"], cut = bounds.name(whole)
    if cut:
        problems.append(bounds.cut_name_said("the run's name", size or len(whole), unit="bytes" if size else "characters"))
    return meta, problems


def _distinct(exp_dir: str, run_id: str, meta: dict[str, str]) -> str:
    name = meta.get("run_name") or run_id
    mine = (_start(meta), run_id)
    if any(other < mine for other in _started(exp_dir, _mtime(exp_dir)).get(name, ())):
        return f"{name} ({run_id[:8]})"
    return name


def _start(meta: dict[str, str]) -> int:
    try:
        return int(meta.get("start_time", ""))
    except ValueError:
        return 0


def _mtime(folder: str) -> int:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return 0


@lru_cache(maxsize=256)
def _started(exp_dir: str, mtime: int) -> dict[str, tuple[tuple[int, str], ...]]:
    """(start time, id) of the experiment's runs by name, as its folder stood at `mtime` (a new run
    is a new folder in it, which moves the time: the cache is never stale for what matters)."""
    by_name: dict[str, list[tuple[int, str]]] = {}
    try:
        entries = sorted(os.scandir(exp_dir), key=lambda e: e.name)
    except OSError:
        return {}
    for entry in entries:
        if entry.name == TRASH or not os.path.isfile(os.path.join(entry.path, META)):
            continue
        meta = _named_run(entry.path)
        by_name.setdefault(meta.get("run_name") or entry.name, []).append((_start(meta), entry.name))
    return {name: tuple(runs) for name, runs in by_name.items()}


@lru_cache(maxsize=65536)
def _named_run(run_dir: str) -> dict[str, str]:
    """A sibling run's name and start, which MLflow never changes once written (cached for the
    experiments of thousands of runs, each metric file of which asks)."""
    return _run_meta(run_dir)[0]


def _yaml_file(path: str) -> tuple[dict[str, str], list[str]]:
    try:
        return scalars(bounds.read_capped(path, limit=bounds.MAX_SMALL_FILE).decode("utf-8", errors="replace")), []
    except FileNotFoundError:
        return {}, [f"no {os.path.basename(os.path.dirname(path))}/{META}: named by its id"]
    except bounds.TooLarge as exc:
        return {}, [f"{os.path.basename(os.path.dirname(path))}/{META} {exc}: not parsed"]
    except OSError as exc:
        return {}, [f"cannot read {path}: {exc.strerror or exc}; named by its id"]


_KEY = re.compile(r"^([A-Za-z_][\w.]*):(?: (.*))?$")


def scalars(text: str) -> dict[str, str]:
    """The top-level `key: value` scalars of a flat YAML mapping as PyYAML dumps one; other values
    (lists, maps) as their text. Each line is looked at once: whether a quoted scalar has ended is
    told by its last line that is not blank alone (a quote left open runs to the file's end)."""
    out: dict[str, str] = {}
    key: str | None = None
    lines: list[str] = []
    closed = True
    for line in [*text.split("\n"), "end:"]:
        if key is not None and (line.startswith((" ", "\t")) or not closed):
            lines.append(line)
            if not closed and line.strip():
                closed = _closes(line, lines[0][0])
            continue
        if key is not None:
            out[key] = _scalar(lines)
        match = _KEY.match(line)
        key, lines = (match[1], [match[2] or ""]) if match else (None, [])
        first = lines[0] if lines else ""
        closed = not first.startswith(("'", '"')) or (bool(first[1:].strip()) and _closes(first[1:], first[0]))
    return out


def _closes(line: str, quote: str) -> bool:
    """Whether a quoted scalar whose last line that is not blank is `line` (past its opening quote,
    on its first) ends there: at its quote, not doubled (single) or not escaped (double). (A blank
    line inside one is a line break, and a quote or a backslash never runs across a line's end.)"""
    body = line.rstrip()
    if quote == "'":
        return body.endswith("'") and (len(body) - len(body.rstrip("'"))) % 2 == 1
    return body.endswith('"') and (len(body) - 1 - len(body[:-1].rstrip("\\"))) % 2 == 0


def _scalar(lines: list[str]) -> str:
    first, text = lines[0], "\n".join(lines)
    if first.startswith("'"):
        return _fold(text).strip(" \t")[1:-1].replace("''", "'")
    if first.startswith('"'):
        return _unescape(_fold(text, escapes=True).strip(" \t")[1:-1])
    return _fold(text).strip(" \t")


_BREAK = re.compile("(\r\n|[\r\n\x85\u2028\u2029])")


def _fold(text: str, *, escapes: bool = False) -> str:
    """A multi-line scalar as PyYAML's scanner folds it: a line break between two lines is a space,
    or the breaks of the empty lines after it if any (YAML 1.1's line and paragraph separators
    are kept as themselves, its other breaks are newlines); spaces around a break go. In double
    quotes a backslash before the break joins the lines with nothing but those empty lines' breaks.
    (Built as a list of pieces: joined to a string at each line, 80,000 lines took 29 s.)"""
    cut = _BREAK.split(text)
    out, at = [cut[0]], 1
    while at < len(cut):
        first, at = cut[at], at + 1
        breaks: list[str] = []
        while at + 1 < len(cut) and not cut[at].strip(" \t"):
            breaks.append(_kept(cut[at + 1]))
            at += 2
        piece = cut[at].lstrip(" \t") if at < len(cut) else ""
        at += 1
        if escapes and _escaped_break(out):
            _drop_last_char(out)
            out += [*breaks, piece]
            continue
        joint = _kept(first) if _kept(first) != "\n" else ("" if breaks else " ")
        _rstrip(out)
        out += [joint, *breaks, piece]
    return "".join(out)


def _rstrip(pieces: list[str]) -> None:
    """`"".join(pieces).rstrip(" \t")`, on the pieces (a piece emptied goes: each goes once)."""
    while pieces:
        last = pieces[-1].rstrip(" \t")
        if last:
            pieces[-1] = last
            return
        pieces.pop()


def _drop_last_char(pieces: list[str]) -> None:
    while pieces and not pieces[-1]:
        pieces.pop()
    if pieces:
        pieces[-1] = pieces[-1][:-1]


def _kept(brk: str) -> str:
    return brk if brk in "\u2028\u2029" else "\n"


def _escaped_break(pieces: list[str]) -> bool:
    """Whether the joined pieces end in an odd run of backslashes."""
    run = 0
    for piece in reversed(pieces):
        kept = piece.rstrip("\\")
        run += len(piece) - len(kept)
        if kept:
            break
    return run % 2 == 1


_ESCAPES = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", "e": "\x1b",
    " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0", "L": "\u2028", "P": "\u2029",
}
_HEX = {"x": 2, "u": 4, "U": 8}


def _unescape(body: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 == len(body):
            out.append(c)
            i += 1
            continue
        code = body[i + 1]
        if code in _HEX:
            width = _HEX[code]
            try:
                out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
            except ValueError:
                out.append(body[i : i + 2 + width])
            i += 2 + width
            continue
        out.append(_ESCAPES.get(code, "\\" + code))
        i += 2
    return "".join(out)
