"""Finding the log files under a folder and naming their runs the way TensorBoard does: the run is
the folder holding the logs, relative to the scanned root ("." for the root itself).

Files whose name says nothing about the run (events.out.tfevents.*, trainer_state.json, metrics.csv,
trainer_log.jsonl...) belong to their folder's run, and so does a free-named log (`train.log`) that is
the only one in its folder. Where a folder holds several free-named logs (`exp3.out`, `exp4.out`: one
folder collecting the logs of many jobs), each is a run of its own, named folder/stem.

The walk follows symlinks (runs are often linked in from scratch storage) but never enters a folder
twice, so a symlink loop under the root ends the walk instead of hanging it.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path

from ..problems import Problem

RUN_IS_FOLDER = {"trainer_state.json", "metrics.csv", "trainer_log.jsonl", "log_history.jsonl"}
LOG_SUFFIXES = {".log", ".txt", ".out", ".err", ".jsonl", ".ndjson", ".json", ".csv", ".stdout", ".stderr"}
SKIP_DIRS = {".git", "__pycache__", ".hg", ".svn", "wandb", ".ipynb_checkpoints", "node_modules"}
NOT_LOGS = {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
            "adapter_config.json", "vocab.json", "training_args.json", "requirements.txt", "merges.txt", "hparams.json",
            "all_results.json", "train_results.json", "eval_results.json", "model.safetensors.index.json", "README.txt"}
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True, order=True)
class Found:
    run: str
    path: Path


def is_candidate(name: str, extra_globs: Sequence[str] = ()) -> bool:
    if name.startswith("events.out.tfevents"):
        return True
    if name in NOT_LOGS:
        return False
    if any(fnmatch(name, g) for g in extra_globs):
        return True
    return os.path.splitext(name)[1].lower() in LOG_SUFFIXES


def _names_its_run(name: str) -> bool:
    return name.startswith("events.out.tfevents") or name in RUN_IS_FOLDER


@lru_cache(maxsize=65536)
def run_name(path: Path, root: Path, *, alone: bool = False) -> str:
    """The run a file belongs to, relative to the root it was found under. `alone`: the file is the
    only free-named log in its folder."""
    folder = path.parent
    if _names_its_run(path.name) or (alone and root != path):
        if folder.name and _CHECKPOINT.match(folder.name):
            folder = folder.parent
        if root == path:
            return folder.name or "."
        rel = os.path.relpath(folder, root)
        return Path(rel).as_posix()
    if root == path:
        return path.stem
    rel = os.path.relpath(folder, root)
    return path.stem if rel == "." else f"{Path(rel).as_posix()}/{path.stem}"


def _walk(root: Path, problems: list[Problem]) -> Iterable[Path]:
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            st = folder.stat()
        except OSError as exc:
            problems.append(Problem(str(folder), f"cannot enter folder: {exc.strerror or exc}"))
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            if folder.is_symlink():
                problems.append(Problem(str(folder), "symlink to a folder already walked (loop?); not followed again"))
            continue
        seen.add(key)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(Problem(str(folder), f"cannot list folder: {exc.strerror or exc}"))
            continue
        subdirs = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=True):
                    if entry.name not in SKIP_DIRS:
                        subdirs.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=True):
                    yield Path(entry.path)
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def _newest_trainer_states(files: list[Path]) -> list[Path]:
    """A HF output folder holds trainer_state.json in each checkpoint-N/ (and at the top at the end
    of training); each is a prefix of the next, so the run is read once, from the newest."""
    best: dict[Path, tuple[float, Path]] = {}
    kept: list[Path] = []
    for path in files:
        if path.name != "trainer_state.json":
            kept.append(path)
            continue
        match = _CHECKPOINT.match(path.parent.name)
        owner = path.parent.parent if match else path.parent
        rank = float(match.group(1)) if match else float("inf")
        if owner not in best or rank > best[owner][0]:
            best[owner] = (rank, path)
    kept.extend(p for _, p in best.values())
    return sorted(kept)


def discover(root: Path, *, extra_globs: Sequence[str] = (), problems: list[Problem]) -> list[Found]:
    """Every candidate log file under root (or root itself, if it is a file), with its run name."""
    if root.is_file():
        return [Found(run_name(root, root), root)]
    files = _newest_trainer_states([p for p in _walk(root, problems) if is_candidate(p.name, extra_globs)])
    free = Counter(p.parent for p in files if not _names_its_run(p.name))
    return sorted(Found(run_name(p, root, alone=free[p.parent] == 1), p) for p in files)
