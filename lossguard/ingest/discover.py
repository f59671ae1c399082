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

import errno
import os
import re
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path

from .formats.csvlog import TENSORBOARD_EXPORT
from .formats.tb_parts import EVENT_FILE, sub_writer
from .formats.tfevents import first_tags
from .formats.sniff import LAYOUTS, RENAMED, by_name, in_layout, may_name_runs, tracked
from ..errors import UsageError
from ..escaping import decodable
from .problems import Problem
from .sources import sqlite_db
from .sources.ranks import per_rank
from .sources.texttail import torchrun_rank
from ..model import ranked

CANNOT_ENTER, CANNOT_LIST = "cannot enter folder", "cannot list folder"
"""How a walk says it could not see into a folder (the daemon keeps following the files under it)."""
RUN_IS_FOLDER = {"trainer_state.json", "metrics.csv", "trainer_log.jsonl", "log_history.jsonl"}
RUN_LOG_STEMS = {
    "train", "training", "train_log", "training_log", "log", "logs", "stdout", "stderr", "output", "out", "console",
    "nohup", "metrics", "progress", "history", "log_history", "trainer_log", "result",
}
"""Stems (any log suffix, any case) of the names trainers and launchers give the one log of a run
folder: `train.log` (nanoGPT, Megatron launch scripts), `log.txt`, `stdout.log`, `nohup.out`,
`metrics.jsonl`, Ray Tune's `result.json` and `progress.csv` (a trial's, in its folder; not
`results.json`, which evaluation tools write beside a run's log). Such a file's run is its
folder; a free name (`slurm-4242.out`, `eval.log`) is a run of its own, `folder/stem`."""
LOG_SUFFIXES = {".log", ".txt", ".out", ".err", ".jsonl", ".ndjson", ".json", ".csv", ".stdout", ".stderr", *sqlite_db.SUFFIXES}
"""(A database is a candidate by its name; its tables say whether a tracker wrote it: one no
tracker wrote is passed over in silence, reader.unrecognised.)"""
SKIP_DIRS = {".git", "__pycache__", ".hg", ".svn", ".ipynb_checkpoints", "node_modules"}
LINKS_TO_RUNS = {"latest-run"}
"""Links a tracker keeps to its newest run's folder (W&B's `wandb/latest-run`): passed over by a walk
(the run is walked where it is), read where they point when named as a root."""
NOT_LOGS = {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
            "adapter_config.json", "vocab.json", "training_args.json", "requirements.txt", "merges.txt", "hparams.json",
            "all_results.json", "train_results.json", "eval_results.json", "model.safetensors.index.json", "README.txt",
            "params.json"}
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
CSV_MONITOR = re.compile(r"^Train_(?:Samples|Eigenvalues)_.+\.csv$")
"""DeepSpeed's csv_monitor files (deepspeed/monitor/csv_monitor.py: one CSV a metric, the event's
name with `/` as `_`, all in `<output_path>/<job_name>/`): its folder is their run, so the loss
and the learning rate are judged together."""
_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>[1-9]\d{0,2})$")
ABSL = re.compile(r"^(?P<program>[^.]+)\.(?:[^/]+\.log\.INFO\.\d{8}-\d{6}\.\d+|INFO)$")
"""absl's and glog's log files (absl/logging/__init__.py, find_log_dir_and_names):
`<program>.<host>.<user>.log.INFO.<yyyymmdd-hhmmss>.<pid>`, a file a start, and `<program>.INFO`,
a link to the newest. Text logs, every start of a program one run (`<program>`); the INFO log
holds the WARNING and ERROR ones' lines too, and its link is the file it names (not read twice)."""


@dataclass(frozen=True, order=True)
class Found:
    run: str
    path: Path


def live_name(name: str) -> tuple[str, int]:
    """The name of the log a rotated segment was (`train.log.2` -> `train.log`, 2), as logrotate and
    Python's RotatingFileHandler number them; (name, 0) for a file that is not one."""
    match = _ROTATED.match(name)
    if match and os.path.splitext(match["base"])[1].lower() in LOG_SUFFIXES and match["base"] not in NOT_LOGS:
        return match["base"], int(match["n"])
    return name, 0


def segment_order(path: str) -> tuple[str, int]:
    """Sort key that puts a log's rotated segments before it, oldest (highest number) first."""
    folder, name = os.path.split(path)
    base, n = live_name(name)
    return os.path.join(folder, base), -n


def is_candidate(name: str, extra_globs: Sequence[str] = ()) -> bool:
    if by_name(name) is not None:
        return True  # a name a format claims (events.out.tfevents.*), whatever its suffix
    name = live_name(name)[0]
    if name in NOT_LOGS:
        return False
    if any(fnmatch(name, g) for g in extra_globs):
        return True
    return os.path.splitext(name)[1].lower() in LOG_SUFFIXES or ABSL.match(name) is not None


def is_log(path: str, extra_globs: Sequence[str] = ()) -> bool:
    """Whether a walk takes the file at `path` for a log: in a tracker's folder, as its layout says
    (an MLflow metric file `loss`, but no W&B `files/output.log` copy); elsewhere by its name."""
    inside, fmt = in_layout(path)
    if inside:
        return fmt is not None
    name = os.path.basename(path)
    return is_candidate(name, extra_globs) and not (name.endswith(".INFO") and os.path.islink(path) and ABSL.match(name))


def _enters(name: str, path: str) -> bool:
    """Whether a walk goes into the folder `name` at `path`: a tracker's own folder always, no
    folder its layout skips."""
    if name in LAYOUTS:
        return True
    found = tracked(path)
    layout = found[0].layout if found is not None else None
    if layout is not None and layout.keys is not None and layout.keys(found[1][:-1]):  # type: ignore[index]
        return True  # (a folder of a metric's key, whatever its name)
    if name in SKIP_DIRS:
        return False
    return layout is None or name not in layout.skip


def _says_nothing(name: str) -> bool:
    """A name every run's file of its kind has (an event file, `trainer_state.json`): only its
    folder can name the run, even for a file named on the command line."""
    return name.startswith("events.out.tfevents") or name in RUN_IS_FOLDER


def _names_its_run(name: str, folder: str) -> bool:
    """A file named as the log of the run in its folder (an event file, `trainer_state.json`,
    `train.log`, `stdout.txt`, `exp1/exp1.log`): the folder is the run. Any other name is a run of
    its own. The name alone decides, never what else the folder holds: a second log appearing
    beside the first must not rename the first's run (the daemon's incidents, silences and alert
    threads are keyed by it)."""
    if _says_nothing(name) or CSV_MONITOR.match(name):
        return True
    stem, suffix = os.path.splitext(name)
    return suffix.lower() in LOG_SUFFIXES and (stem.lower() in RUN_LOG_STEMS or (stem == folder and stem != ""))


def run_name(path: Path, root: Path) -> str:
    """The run a file belongs to, relative to the root it was found under. An event file that is
    one part of a run (tfevents.sub_writer) is its run's: asked each time, not cached, since Keras'
    `train/` becomes a part when its `validation/` appears beside it."""
    if path.name.startswith(EVENT_FILE) and root != path and tracked(str(path)) is None:
        split = sub_writer(path.parent, tags_of=first_tags, top=root)
        if split is not None:
            return Path(os.path.relpath(split.run_folder, root)).as_posix()
    return _run_name(path, root)


@lru_cache(maxsize=65536)
def _run_name(path: Path, root: Path) -> str:
    held = tracked(str(path))
    if held is not None:
        # The run is the folder the tracker's folder sits in (`exp1/wandb/run-…/run-x.wandb` ->
        # exp1); scanning the tracker's folder itself, or a file in it, names no folder above it.
        # A tracker folder the user named (`Live(dir="exp3")`) is the run's own name.
        at = len(path.parts) - len(held[1]) - 1
        assert held[0].layout is not None
        owner = Path(*path.parts[: at if path.parts[at] == held[0].layout.folder else at + 1])
        rel = os.path.relpath(owner, root if root != path else owner)
        return "." if rel.startswith("..") else Path(rel).as_posix()
    folder = path.parent
    if path.name.lower().endswith(sqlite_db.SUFFIXES):
        # A database names the runs it holds (MLflow's experiment/run, trackio's project/run): the
        # run discovery gives it is only where it is, its folder ("." named itself, or at the root).
        return "." if root == path else Path(os.path.relpath(folder, root)).as_posix()
    if root == path and not _says_nothing(path.name):
        return path.stem  # a file named on the command line (`train.log` -> train)
    if torchrun_rank(path) is not None and root not in (path, folder, folder.parent):
        # torchrun's per-rank output (`<run_id>/attempt_<N>/<rank>/stderr.log`): every restart of
        # one job is that job's run, named by its folder, and each rank a stream of it.
        return ranked(Path(os.path.relpath(folder.parent.parent, root)).as_posix(), torchrun_rank(path))  # type: ignore[arg-type]
    if _names_its_run(path.name, folder.name):
        if folder.name and _CHECKPOINT.match(folder.name):
            folder = folder.parent
        if root == path:
            return folder.name or "."
        rel = os.path.relpath(folder, root)
        return Path(rel).as_posix()
    absl, exported = ABSL.match(path.name), TENSORBOARD_EXPORT.match(path.name)
    if exported and exported["run"] == ".":  # (TensorBoard's name for a logdir that is one run: the folder's)
        return Path(os.path.relpath(folder, root)).as_posix() if root != path else folder.name or "."
    stem = absl["program"] if absl else exported["run"] if exported else path.stem  # (one run's tags, downloaded apart)
    if root == path:
        return stem
    rel = os.path.relpath(folder, root)
    return stem if rel == "." else f"{Path(rel).as_posix()}/{stem}"


def _named_for(root: Path, path: Path) -> str:
    """The name of a run found at the root: the root's; for a tracker's file, the folder holding the
    tracker's folder (or that folder, named by the user), as a walk from above names it, whether
    the root is that folder, the tracker's (`scan exp1/dvclive`) or a file in it."""
    where = os.path.abspath(path)
    held = tracked(where)
    if held is None or held[0].layout is None:
        return Path(os.path.abspath(root)).name or "."
    parts = Path(where).parts[: -len(held[1])]
    owner = parts[:-1] if parts[-1] == held[0].layout.folder else parts
    return owner[-1] if len(owner) > 1 else "."


class Listings:
    """What each folder held at the last walk, for a process that walks the same tree again and
    again (the daemon polling NFS): a folder whose modification time has not moved holds the same
    names, so it is not listed again, and a tree where no folder moved discovers the same files.
    A folder changed within the last RACY seconds is always listed: on filesystems that keep
    coarse times, a file added in the same second as the last listing would not move the time."""

    RACY = 2.0

    def __init__(self) -> None:
        self.folders: dict[str, tuple[tuple[int, int, int], list[tuple[str, str, bool]]]] = {}
        self.found: dict[tuple[str, tuple[str, ...]], tuple[frozenset[str], list[Found]]] = {}
        self.listed = 0
        """Folders listed (not taken from memory) by the last walk."""
        self._visited: set[str] = set()

    def forget_unvisited(self) -> None:
        """After a full walk of every root: folders that are gone leave no listing behind (a daemon
        runs for weeks while runs come and go)."""
        for folder in set(self.folders) - self._visited:
            del self.folders[folder]
        self._visited = set()

    def entries(self, folder: str, st: os.stat_result) -> list[tuple[str, str, bool]] | None:
        self._visited.add(folder)
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns)
        known = self.folders.get(folder)
        if known is not None and known[0] == stamp and time.time_ns() - st.st_mtime_ns > self.RACY * 1e9:
            return known[1]
        return None

    def remember(self, folder: str, st: os.stat_result, entries: list[tuple[str, str, bool]]) -> None:
        self.listed += 1
        self._visited.add(folder)
        self.folders[folder] = ((st.st_dev, st.st_ino, st.st_mtime_ns), entries)


def _list(folder: str, problems: list[Problem]) -> list[tuple[str, str, bool]]:
    """(name, path, is a folder) of the entries that are folders or files, by name. A symlink that
    resolves to itself (`a -> a`, `a -> b -> a`) is a loop the kernel refuses: said, not followed;
    one that points nowhere (a `latest` link to a deleted checkpoint) is not a log: skipped."""
    out = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        try:
            if entry.is_dir(follow_symlinks=True):
                out.append((entry.name, entry.path, True))
            elif entry.is_file(follow_symlinks=True):
                out.append((entry.name, entry.path, False))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                problems.append(Problem(entry.path, "symlink loop (it resolves to itself); not followed"))
    return out


def _walk(root: Path, problems: list[Problem], listings: Listings | None = None) -> Iterable[str]:
    """Paths (strings: a walk the daemon repeats should not build thousands of Path objects) of
    the files under root, folder by folder in name order."""
    seen: set[tuple[int, int]] = set()
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
        except OSError as exc:
            problems.append(Problem(folder, f"{CANNOT_ENTER}: {exc.strerror or exc}"))
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            if os.path.islink(folder):
                problems.append(Problem(folder, "symlink to a folder already walked (loop?); not followed again"))
            continue
        seen.add(key)
        entries = listings.entries(folder, st) if listings is not None else None
        if entries is None:
            try:
                entries = _list(folder, problems)
            except OSError as exc:
                problems.append(Problem(folder, f"{CANNOT_LIST}: {exc.strerror or exc}"))
                continue
            if listings is not None:
                listings.remember(folder, st, entries)
        subdirs = []
        for entry_name, entry_path, is_dir in entries:
            if is_dir:
                if _enters(entry_name, entry_path):
                    subdirs.append(entry_path)
            else:
                yield entry_path
        stack.extend(reversed(subdirs))


def trainer_state_owner(path: Path) -> tuple[Path, float] | None:
    """The HF output folder a `trainer_state.json` belongs to, and how new it is there (a
    checkpoint's number; the one the Trainer writes at the top at the end of training is newest);
    None for any other file."""
    if path.name != "trainer_state.json":
        return None
    match = _CHECKPOINT.match(path.parent.name)
    return (path.parent.parent, float(match.group(1))) if match else (path.parent, float("inf"))


def _newest_trainer_states(files: list[Path]) -> list[Path]:
    """A HF output folder holds trainer_state.json in each checkpoint-N/ (and at the top at the end
    of training); each is a prefix of the next, so the run is read once, from the newest."""
    best: dict[Path, tuple[float, Path]] = {}
    kept: list[Path] = []
    for path in files:
        owned = trainer_state_owner(path)
        if owned is None:
            kept.append(path)
            continue
        owner, rank = owned
        if owner not in best or rank > best[owner][0]:
            best[owner] = (rank, path)
    kept.extend(p for _, p in best.values())
    return sorted(kept)


def discover(root: Path, *, extra_globs: Sequence[str] = (), problems: list[Problem], listings: Listings | None = None) -> list[Found]:
    """Every candidate log file under root (or root itself, if it is a file), with its run name. A
    root that is a link a tracker keeps to a run of its folder (W&B's `wandb/latest-run`, which a
    walk passes over: the run is walked where it is) is that run: named, it is read."""
    if root.name in LINKS_TO_RUNS and root.is_symlink():
        root = Path(os.path.realpath(root))
    if root.is_file():
        return [Found(decodable(run_name(root, root)), root)]
    if listings is None:
        paths = list(_walk(root, problems))
    else:
        listed_before = listings.listed
        paths = list(_walk(root, problems, listings))
        key = (str(root), tuple(extra_globs))
        names = frozenset(paths)
        known = listings.found.get(key)
        if listings.listed == listed_before and not problems and known is not None and known[0] == names:
            return known[1]  # no folder changed: the same files, the same runs
    files = _newest_trainer_states([Path(p) for p in paths if is_log(p, extra_globs)])
    # Rotated segments (train.log.1) belong to their live log's run and are read before it.
    live = {p: p.with_name(live_name(p.name)[0]) for p in files}
    named = [(decodable(run_name(live[p], root)), p) for p in files]  # (a name that is not UTF-8 as \xe9: it is stored and shown)
    ranks = per_rank([(run, os.path.dirname(p)) for run, p in named])  # (files one job wrote per rank: its ranks' streams)
    found = sorted((Found(ranks.get(run, run), p) for run, p in named), key=lambda f: (f.run, segment_order(str(f.path))))
    if listings is not None:
        listings.found[key] = (names, found)
    return found


def _tracked_only_absolute(root: Path) -> bool:
    """Whether a relative root is, or is inside, a tracker's folder of another name, which only
    absolute paths show (Layout.renamed: a DVCLive folder known by the metrics.json beside its
    plots/metrics/): each folder from the root up is asked, by the names in it that such a
    tracker keeps (Layout.own), whatever else it holds and in whatever order it lists them."""
    here = Path(os.path.abspath(root))
    for folder in (here if here.is_dir() else here.parent, *here.parents):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for fmt in RENAMED:
            own = fmt.layout.own  # type: ignore[union-attr]
            for name in names if own is None else filter(own, names):
                path = os.path.join(folder, name)
                if os.path.isfile(path) and tracked(path) is not None:
                    return True
    return False


def root_labels(paths: Sequence[Path]) -> dict[str, str]:
    """The name each root's runs go under when several are scanned, by its absolute path: its
    folder's name, or as many of its last folders as tell it from another root of the same name
    (`a/runs` and `/data/b/runs` hold `a/runs/exp1` and `b/runs/exp1`, two runs, not one merged)."""
    wholes = sorted({os.path.abspath(p) for p in paths})
    parts = {w: Path(w).parts[1:] or (w,) for w in wholes}
    depth = dict.fromkeys(wholes, 1)
    while True:
        named: dict[tuple[str, ...], list[str]] = {}
        for w in wholes:
            named.setdefault(parts[w][-depth[w]:], []).append(w)
        clashing = [w for same in named.values() if len(same) > 1 for w in same if depth[w] < len(parts[w])]
        if not clashing:
            return {w: decodable("/".join(parts[w][-depth[w]:])) for w in wholes}
        for w in clashing:
            depth[w] += 1


def collect(paths: Sequence[Path], *, globs: Sequence[str] = (), listings: Listings | None = None) -> tuple[list[Found], list[Problem]]:
    """The runs under every root (`globs`: names the user's own formats claim)."""
    problems: list[Problem] = []
    found: list[Found] = []
    labels = root_labels(paths)
    for root in paths:
        try:
            mode = os.stat(root).st_mode
        except FileNotFoundError:
            raise UsageError(f"{root}: no such file or folder") from None
        except OSError as exc:
            raise UsageError(f"{root}: cannot read: {exc.strerror or exc}") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            # A FIFO would block the first read forever, /dev/zero never end: the stat says so without
            # opening either.
            raise UsageError(f"{root}: not a regular file or folder")
        if not root.is_absolute() and (any(part in LAYOUTS for part in Path(os.path.abspath(root)).parts) or _tracked_only_absolute(root)):
            # Inside a tracker's folder (`cd exp1/dvclive && lossguard scan .`), or one of another
            # name (`Live(dir="results/exp3")`, then `scan .` in it): a path relative to it holds
            # no part that says so, and its files would be no tracker's.
            root = Path(os.path.abspath(root))
        here = discover(root, extra_globs=globs, problems=problems, listings=listings)
        label = labels[os.path.abspath(root)]
        if len(paths) > 1 and stat.S_ISREG(mode):
            # A file among several roots: its run as named alone, under the folders that tell it
            # from the others' (`a/train.log`, `b/train.log` -> a/train, b/train).
            folders = label.rpartition("/")[0]
            here = [Found(f"{folders}/{f.run}" if folders and f.run != "." else (folders or f.run), f.path) for f in here]
        elif len(paths) > 1:
            # Several roots: "." (or the same relative name) under two of them must not merge.
            here = [Found(label if f.run == "." else f"{label}/{f.run}", f.path) for f in here]
        else:
            # A run folder scanned itself (`scan runs/exp1`, `scan .` inside it) is known by its
            # name, as under its parent, where "." says nothing in a report, a Slack alert or a
            # Prometheus label. Not a run whose rows the files name (W&B's, MLflow's): "." is what
            # goes before those names.
            here = [Found(decodable(_named_for(root, f.path)), f.path) if f.run == "." and not may_name_runs(f.path) else f for f in here]
        found.extend(here)
    if listings is not None:
        listings.forget_unvisited()
    return found, problems
