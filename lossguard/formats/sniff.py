"""Which format a file is in: by name where the name is conclusive, else by counting the lines of
its head that each line format would accept. Sniffing looks further than the first screen because
Megatron and friends print pages of arguments and banners before the first iteration line."""

from __future__ import annotations

import re
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

from .composer import DATA as COMPOSER_DATA
from .custom import LineFormatSpec
from .megatron import ITERATION

HEAD = 256 << 10
DEEP = 8 << 20

_MEGATRON = re.compile(ITERATION + r".*\|.*loss", re.IGNORECASE)
_JSON_DICT = re.compile(r"""\{\s*"[^"\n]+"\s*:""")
_PY_DICT = re.compile(r"""\{\s*'[^'\n]+'\s*:""")
_DICT_METRIC = re.compile(r"""["'](?:[^"'\n]*loss[^"'\n]*|learning_rate|lr|grad_norm)["']\s*:\s*[-+\d.'"nNiI]""")
_KV_STEP = re.compile(r"(?i)(?:^|[\s|,;\[(])(?:step|iter|iteration|num_updates|global_step)(?:\s*[:=]\s*|\s+)\d")
_COMPOSER = re.compile(COMPOSER_DATA)
_KV_LOSS = re.compile(r"(?i)(?:^|[\s|,;\[(])[\w./-]*loss[\w./-]*(?:\s*[:=]\s*|\s+)[-+\d.nNiI]")

TEXT_SUFFIXES = {".log", ".txt", ".out", ".err", ".jsonl", ".ndjson", ".json", ".csv", ".stdout", ".stderr"}


def by_name(path: Path) -> str | None:
    name = path.name
    if name.startswith("events.out.tfevents"):
        return "tfevents"
    if name == "trainer_state.json":
        return "hf_trainer_state"
    if path.suffix.lower() == ".csv":
        return "csv"
    return None


def _read_head(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(size)


def by_content(path: Path, custom: Sequence[LineFormatSpec] = ()) -> str | None:
    data = _read_head(path, HEAD)
    if b"\x00" in data[:8192]:
        return None
    if path.suffix.lower() == ".json" and b'"log_history"' in _read_head(path, DEEP):
        return "hf_trainer_state"
    found = _score(data.decode("utf-8", errors="replace"), custom)
    if found is None and len(data) == HEAD:
        found = _score(_read_head(path, DEEP).decode("utf-8", errors="replace"), custom)
    return found


def _score(text: str, custom: Sequence[LineFormatSpec]) -> str | None:
    lines = text.splitlines()
    for spec in custom:
        if spec.files is None:
            pattern = re.compile(spec.pattern)
            if any(pattern.search(line) for line in lines):
                return spec.name
    counts = {"megatron": 0, "jsonl": 0, "hf_console": 0, "kv_lines": 0, "composer": 0}
    for line in lines:
        if _COMPOSER.match(line):
            counts["composer"] += 1
        elif _MEGATRON.search(line):
            counts["megatron"] += 1
        elif _DICT_METRIC.search(line):
            if _JSON_DICT.search(line):
                counts["jsonl"] += 1
            elif _PY_DICT.search(line):
                counts["hf_console"] += 1
        elif _KV_STEP.search(line) and _KV_LOSS.search(line):
            counts["kv_lines"] += 1
    best = max(counts.items(), key=lambda kv: kv[1])
    return best[0] if best[1] else None


def detect(path: Path, custom: Sequence[LineFormatSpec] = ()) -> str | None:
    for spec in custom:
        if spec.files is not None and fnmatch(path.name, spec.files):
            return spec.name
    return by_name(path) or by_content(path, custom)
