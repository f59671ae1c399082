"""The one-shot audit: find runs under the given paths, read each run's files, analyse the run, and
keep what the reports need (never the whole table: memory stays bounded by the largest run).

Runs are independent, so with jobs > 1 they are read and analysed in worker processes; results come
back sorted by run name, so the output does not depend on which worker finished first.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np
import polars as pl

from ..ingest import readmany, table
from ..ingest.cursor import Cursor
from ..detection.crash import find_crash
from ..detection.engine import SCAN_NEEDS, RunAnalysis, analyse_runs
from ..escaping import decodable
from ..model import Incident, split_rank
from .ranks import combined
from .runs import Curve, RunReport
from ..ingest.problems import Problem, summarised
from ..ingest.sources import object_store, sqlite_db
from ..ingest.sources.texttail import tails_of
from ..ingest.readmany import Job
from ..ingest.reader import FileResult, ReadOptions, read_found, UNRECOGNISED, said_if_nothing, unrecognised
from ..detection.rules import RuleSet
from ..ingest.discover import Found, collect
from ..ingest.formats.sniff import may_name_runs
from ..ingest.formats.base import LATER_WRITE_WINS
from ..detection.streams import Points, context, context_points

CURVE_POINTS = 1500
PARALLEL_BYTES = 64 << 20
SPARK_BEFORE, SPARK_AFTER = 24, 12


@dataclass(frozen=True)
class ScanResult:
    rules: RuleSet
    runs: tuple[RunReport, ...]
    problems: tuple[Problem, ...]
    """Problems of files that belong to no run report (discovery, unrecognised files)."""
    files: int
    bytes: int
    names: tuple[str, ...] = ()
    """With a run filter, every run name a user could give it: discovery's names for logs of one run,
    and the names files that hold many runs give theirs (`exp1/pretrain/r1`), read to filter them."""

    @property
    def incidents(self) -> list[Incident]:
        return [i for r in self.runs for i in r.incidents]

    @property
    def all_problems(self) -> list[Problem]:
        return [*self.problems, *(p for r in self.runs for p in r.problems)]


def _decimate(steps: np.ndarray, values: np.ndarray, limit: int = CURVE_POINTS) -> Curve:
    """At most `limit` points, keeping each bucket's min and max so spikes stay visible."""
    if steps.size <= limit:
        return Curve(tuple(steps.tolist()), tuple(values.tolist()))
    buckets = np.array_split(np.arange(steps.size), limit // 2)
    keep: list[int] = []
    for b in buckets:
        vals = values[b]
        finite = np.isfinite(vals)
        if not finite.all():
            keep.append(int(b[np.argmax(~finite)]))
        if finite.any():
            idx = b[finite]
            keep.extend({int(idx[np.argmin(vals[finite])]), int(idx[np.argmax(vals[finite])])})
    keep = sorted(set(keep))
    return Curve(tuple(int(steps[i]) for i in keep), tuple(float(values[i]) for i in keep))


def _spark(loss: tuple[np.ndarray, np.ndarray], inc: Incident) -> tuple[float, ...]:
    steps, values = loss
    i = int(np.searchsorted(steps, inc.step))
    j = int(np.searchsorted(steps, inc.end_step if inc.end_step is not None else inc.peak_step, side="right"))
    return tuple(values[max(0, i - SPARK_BEFORE) : min(values.size, max(j, i + 1) + SPARK_AFTER)].tolist())


@dataclass(frozen=True)
class _Read:
    """A run's files, read: what its analysis and report are made from."""

    run: str
    paths: Sequence[str]
    frame: pl.DataFrame
    formats: tuple[str, ...]
    problems: tuple[Problem, ...]
    span: table.Span | None
    ignored: int = 0
    """RunReport.ignored."""


TOGETHER_BYTES = 2 << 20
"""Files below this size are read together with the batch's other small files of their format
(lossguard.ingest.readmany): a read's fixed cost, a few dozen polars queries, is most of a small file's."""


def _read_together(batch: Sequence[tuple[str, Sequence[str]]], options: ReadOptions) -> dict[str, FileResult | str | None]:
    """The batch's small files that can be read together, read (path -> result); any other file's
    format as sniffed here (path -> name, or None: no format claims it), so it is not sniffed twice."""
    out: dict[str, FileResult | str | None] = {}
    jobs: list[Job] = []
    for run, paths in batch:
        for path in paths:
            try:
                size = os.stat(path).st_size
            except OSError:
                continue  # read_found says what went wrong
            if not 0 < size < TOGETHER_BYTES:
                continue
            fmt = out[path] = options.format_of(Path(path))
            if readmany.batched(fmt, options):
                jobs.append(Job(Path(path), Cursor(), run, fmt, final=True))
    for job, res in zip(jobs, readmany.read_many(jobs, options=options, needs=SCAN_NEEDS, lean=True, largest=TOGETHER_BYTES)):
        if res is not None:
            out[str(job.path)] = said_if_nothing(FileResult(Found(job.run, job.path), job.fmt, res))
    return out


def _read_run(run: str, paths: Sequence[str], options: ReadOptions, explicit: frozenset[str], ready: dict[str, FileResult | str | None]) -> list[_Read | RunReport]:
    """The run's files read (`ready`: those read together already, or sniffed); a report already
    when none of them could be. A file that names its rows' runs (a tracker's database) gives runs
    of its own besides."""
    frames, formats, problems, spans = [], [], [], []
    own: list[_Read] = []
    ignored = 0
    for path in paths:
        got = ready.get(path, "")  # "": neither read nor sniffed yet
        if isinstance(got, FileResult):
            res = got
        elif got is None:
            res = FileResult(Found(run, Path(path)), None, None)  # sniffed: no format claims it
        else:
            # Only what judging reads (SCAN_NEEDS): the other metrics' rows are never built.
            res = read_found(Found(run, Path(path)), options, lean=True, explicit=path in explicit, needs=SCAN_NEEDS, fmt=got or None)
        database = path.lower().endswith(sqlite_db.SUFFIXES)
        if res.result is None:
            problem = unrecognised(Path(path), explicit=path in explicit)
            if problem:
                problems.append(problem)
            else:
                ignored += database  # (another application's database: not a file the scan read)
            continue
        if res.format is None and not res.result.problems:
            ignored += database  # (an empty file of a database's name: nobody's database yet)
        if res.result.named:
            mine = _own_runs(path, res)
            if len(mine) == 1:  # (the file of one run, a W&B log: its problems are that run's)
                mine[0] = replace(mine[0], problems=res.result.problems)
            else:
                problems.extend(res.result.problems)
            own += mine
            continue
        problems.extend(res.result.problems)
        # A file counts as read if it gave rows (kept or not), or gave no complaint (a run that just started).
        if res.format and (res.result.span is not None or not res.result.problems):
            formats.append(res.format)
        spans.append(res.result.span)
        if res.result.frame.height:
            frames.append(res.result.frame)
    if not formats:
        # No file of the run was read: the scan keeps only its problems (thousands of empty files, each
        # a run of its own, once cost an analysis of nothing each).
        return [RunReport(RunAnalysis(run, {}, 0, None, None, ()), paths[0], (), len(paths), tuple(problems), ignored=ignored, paths=tuple(paths)), *_gathered(own)]
    frame = pl.concat(frames, rechunk=False) if frames else table.empty(lean=True)
    return [_Read(run, paths, frame, tuple(dict.fromkeys(formats)), tuple(problems), table.joined(spans), ignored), *_gathered(own)]


def _own_runs(path: str, res: FileResult) -> list[_Read]:
    """The runs a file names (FileResult.named), each read as a run of its own. Their spans are
    their rows' (the read's covers them all)."""
    assert res.result is not None and res.format is not None
    frame = res.result.frame
    if not frame.height:
        return []
    parts = frame.partition_by("run", as_dict=True, maintain_order=True, include_key=False)
    return [_Read(str(key[0]), (path,), rows, (res.format,), (), table.span_of(rows)) for key, rows in parts.items()]


def _gathered(reads: list[_Read]) -> list[_Read]:
    """The runs files name, each once: a tracker that keeps a file a metric (MLflow's file store)
    names a run in each of its files, and the run is all of them."""
    by_run: dict[str, list[_Read]] = {}
    for read in reads:
        by_run.setdefault(read.run, []).append(read)
    return [
        group[0] if len(group) == 1 else _Read(
            run, tuple(p for r in group for p in r.paths), pl.concat([r.frame for r in group], how="vertical_relaxed", rechunk=False),
            tuple(dict.fromkeys(f for r in group for f in r.formats)), tuple(p for r in group for p in r.problems), table.joined([r.span for r in group]),
        )
        for run, group in by_run.items()
    ]


def _report(read: _Read, analysis: RunAnalysis, streams: dict[str, Points]) -> RunReport:
    contexts = {m: context_points(p) for m, p in streams.items()}
    for metric in {inc.metric for inc in analysis.incidents} - set(contexts):
        c = context(read.frame, metric)
        contexts[metric] = (c.get_column("step").to_numpy(), c.get_column("value").to_numpy())
    curves = {}
    for metric in ("loss", "lr", "grad_norm", "loss_scale", "eval_loss", "step_time"):
        steps, values = contexts[metric]
        if steps.size:
            curves[metric] = _decimate(steps, values)
    sparks = {(inc.rule, inc.step): _spark(contexts[inc.metric], inc) for inc in analysis.incidents}
    paths = read.paths
    parents = {str(Path(p).parent) for p in paths}
    # A run's files named both ways (`scan runs /abs/runs`, one folder twice) share a folder only
    # once resolved: commonpath refuses a mix of absolute and relative paths.
    common = os.path.commonpath(paths if len({os.path.isabs(p) for p in paths}) == 1 else [os.path.abspath(p) for p in paths])
    source = paths[0] if len(paths) == 1 else (parents.pop() if len(parents) == 1 else common)
    return RunReport(analysis, decodable(source), read.formats, len(paths), read.problems, curves, sparks, read.ignored, tuple(paths))


def scan_runs(batch: Sequence[tuple[str, Sequence[str]]], rules: RuleSet, options: ReadOptions, explicit: frozenset[str] = frozenset()) -> list[RunReport]:
    """Read and analyse runs, each file on its own and all the runs' analysis at once (a worker takes
    many small runs at a time); a module-level function so worker processes can run it."""
    ready = _read_together(batch, options)
    read = [r for run, paths in batch for r in _read_run(run, paths, options, explicit, ready)]
    todo = [r for r in read if isinstance(r, _Read)]
    wins = [bool(LATER_WRITE_WINS.intersection(r.formats)) for r in todo]
    analysed = iter(analyse_runs([r.frame for r in todo], rules, runs=[r.run for r in todo], spans=[r.span for r in todo], later_write_wins=wins) if todo else ())
    return [_with_crash(r if isinstance(r, RunReport) else _report(r, *next(analysed)), rules) for r in read]


def _with_crash(rep: RunReport, rules: RuleSet) -> RunReport:
    """The run's report with the error that ended it among its findings, if its console logs end in
    one (a run whose files hold no metrics, a stderr.log of a traceback, is reported for it)."""
    mine = rules.crashes_for(rep.run)
    if not mine or not rep.paths:
        return rep
    found = find_crash(tails_of(rep.paths, final=True), mine, run=rep.run, last_step=rep.analysis.last_step)
    if found is None:
        return rep
    # The log whose ending names the crash was read for it: no unrecognised file, whatever metrics it lacks.
    problems = tuple(p for p in rep.problems if not (p.message == UNRECOGNISED and decodable(p.source) == found.source))
    return replace(rep, analysis=replace(rep.analysis, incidents=(*rep.analysis.incidents, found.incident)), problems=problems, failed_at=found.failed_at)


BATCH_RUNS, BATCH_BYTES = 64, 16 << 20
"""A worker's batch: at most this many runs and bytes of logs (their tables are held until the batch's
analysis), and at least four batches per worker when there are enough runs, so that the last slow
batch does not leave a core idle."""


def batches(runs: Sequence[str], sizes: dict[str, int], *, workers: int) -> list[list[str]]:
    """The runs, in order, cut into batches (BATCH_RUNS, BATCH_BYTES)."""
    per = max(1, min(BATCH_RUNS, -(-len(runs) // (4 * workers))))
    out: list[list[str]] = []
    held = 0
    for run in runs:
        size = sizes.get(run, 0)
        if not out or len(out[-1]) >= per or (held + size > BATCH_BYTES and out[-1]):
            out.append([])
            held = 0
        out[-1].append(run)
        held += size
    return out


def _leave_sigint() -> None:
    """In a worker: Ctrl-C is the parent's to handle. A terminal sends SIGINT to the whole process
    group, and each worker would print its own traceback and finish its run before exiting."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the pool starts its workers: an ignored signal stays ignored across
    spawn's exec, and Python then never turns it into KeyboardInterrupt, even while a worker is
    still importing (where _leave_sigint has not run yet, and a loaded machine makes that long)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _fine_grained(sizes: dict[str, int], jobs: int) -> bool:
    """Whether a scan's work is spread over runs small enough to keep every worker busy to the end
    (the largest run at most an eighth of each worker's share): then each worker is best held to its
    share of the cores. A scan of a few large runs instead ends with one worker parsing the last
    of them, which then wants every core."""
    total = sum(sizes.values())
    return bool(sizes) and max(sizes.values()) * 8 * jobs <= total


@contextmanager
def _threads_each(jobs: int) -> Iterator[None]:
    """Each worker's polars pool sized to its share of the cores (of `jobs` workers), for the workers
    the pool starts meanwhile (spawn's children take the environment as it is; polars reads it on
    import). Each worker's polars would otherwise start a thread per core: on 2 cores, 2 workers of
    2 threads cost ~10-25% more CPU a small run (8.2-8.4 against 9.0-10.5 ms), threads waking each
    other for frames of a few thousand rows. A user's own setting stands."""
    if "POLARS_MAX_THREADS" in os.environ:
        yield
        return
    os.environ["POLARS_MAX_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // jobs))
    try:
        yield
    finally:
        del os.environ["POLARS_MAX_THREADS"]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Interrupted: the workers are stopped now rather than left to finish the runs they hold
    (which kept Ctrl-C waiting up to 20 s)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(timeout=1.0)


FETCHES_PER_JOB = 4
"""Requests in flight per worker when a scan copies runs from an object store: small objects cost
their latency, not their bytes, so a few at a time each keep a worker's share of the link busy."""


def scan(
    paths: Sequence[Path | str],
    *,
    rules: RuleSet,
    options: ReadOptions = ReadOptions(),
    run_glob: str | None = None,
    jobs: int | None = 1,
    progress: Callable[[int, int, int], None] | None = None,
) -> ScanResult:
    """The audit of every run under `paths`: folders, files, or object store URLs (`s3://bucket/prefix`),
    which are copied into a temporary folder first and named by their URL in the result."""
    if not any(object_store.is_url(p) for p in paths):
        return _scan_local([Path(p) for p in paths], rules=rules, options=options, run_glob=run_glob, jobs=jobs, progress=progress)
    import tempfile

    fetches = FETCHES_PER_JOB * (jobs or len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="lossguard-mirror-") as tmp:
        mirrors = {str(p): object_store.Mirror(str(p), cache=Path(tmp, str(i)), jobs=fetches) for i, p in enumerate(paths) if object_store.is_url(p)}
        said: list[Problem] = []
        for mirror in mirrors.values():
            synced = mirror.sync()
            said += [Problem(key, "skipped: a key that names no file a folder can hold") for key in synced.skipped]
            said += [Problem(mirror.url, str(err)) for err in synced.failed]
        local = [mirrors[str(p)].local() if str(p) in mirrors else Path(p) for p in paths]
        result = _scan_local(local, rules=rules, options=options, run_glob=run_glob, jobs=jobs, progress=progress)
        return _shown(result, list(mirrors.values()), said)


def _shown(result: ScanResult, mirrors: Sequence[object_store.Mirror], said: Sequence[Problem]) -> ScanResult:
    """A scan of mirrors as the URLs': every path in it (sources, problems) the object's URL."""

    def show(text: str) -> str:
        for mirror in mirrors:
            text = mirror.shown(text)
        return text

    def problem(p: Problem) -> Problem:
        return replace(p, source=show(p.source), message=show(p.message))

    runs = tuple(replace(r, source=show(r.source), paths=tuple(map(show, r.paths)), problems=tuple(map(problem, r.problems))) for r in result.runs)
    return replace(result, runs=runs, problems=(*said, *map(problem, result.problems)))


def _scan_local(
    paths: Sequence[Path],
    *,
    rules: RuleSet,
    options: ReadOptions,
    run_glob: str | None,
    jobs: int | None,
    progress: Callable[[int, int, int], None] | None,
) -> ScanResult:
    found, problems = collect(paths, globs=options.globs)
    names: set[str] = set()
    naming: set[str] = set()
    if run_glob:
        # A file naming its own runs is read for the filter below: its runs are known once read.
        named = [may_name_runs(f.path) for f in found]
        names = {split_rank(f.run)[0] for f, n in zip(found, named) if not n}
        naming = {str(f.path) for f, n in zip(found, named) if n}
        found = [f for f, n in zip(found, named) if n or fnmatchcase(split_rank(f.run)[0], run_glob)]
    by_run: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    file_sizes: dict[str, int] = {}
    for f in found:
        by_run.setdefault(f.run, []).append(str(f.path))
        try:
            file_sizes[str(f.path)] = f.path.stat().st_size
        except OSError:
            continue
        sizes[f.run] = sizes.get(f.run, 0) + file_sizes[str(f.path)]
    total = sum(sizes.values())
    explicit = frozenset(str(p) for p in paths if p.is_file())
    reports: list[RunReport] = []
    done_bytes = 0
    runs = sorted(by_run)
    if jobs is None:
        # Worker processes cost ~0.3 s each to start (polars import): worth it for large scans only.
        jobs = len(os.sched_getaffinity(0)) if total >= PARALLEL_BYTES else 1
    if jobs > 1 and len(runs) > 1:
        import multiprocessing
        from concurrent.futures import as_completed

        # "spawn": forking a process that already runs polars' thread pool can deadlock.
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(runs)), mp_context=multiprocessing.get_context("spawn"), initializer=_leave_sigint)
        try:
            # The workers start with SIGINT ignored (inherited, before any import) and their share of the cores.
            with _sigint_ignored(), _threads_each(jobs if _fine_grained(sizes, jobs) else 1):
                futures = {
                    pool.submit(scan_runs, [(run, by_run[run]) for run in batch], rules, options, explicit): batch
                    for batch in batches(runs, sizes, workers=jobs)
                }
            for fut in as_completed(futures):
                reports.extend(fut.result())
                done_bytes += sum(sizes.get(run, 0) for run in futures[fut])
                if progress:
                    progress(len(reports), len(runs), done_bytes)
        except BaseException:
            _stop(pool)
            raise
        pool.shutdown()
    else:
        for batch in batches(runs, sizes, workers=1):
            reports.extend(scan_runs([(run, by_run[run]) for run in batch], rules, options, explicit))
            done_bytes += sum(sizes.get(run, 0) for run in batch)
            if progress:
                progress(len(reports), len(runs), done_bytes)
    reports = combined(reports, judged=lambda rep: _with_crash(rep, rules))  # (a run's ranks were read and judged each on its own)
    # A "run" in which no file was recognised is no run: only its warnings are kept.
    ordered = sorted((r for r in reports if not run_glob or fnmatchcase(r.run, run_glob)), key=lambda r: r.run)
    kept = tuple(r for r in ordered if r.formats or r.incidents)
    orphans = [p for r in ordered if not r.formats and not r.incidents for p in r.problems]
    names |= {r.run for r in reports if r.formats or r.incidents}
    files = len(found) - sum(r.ignored for r in reports)
    if run_glob:
        # A file naming its own runs was read to filter them: it counts where a run kept is its.
        kept_paths = {p for r in kept for p in r.paths}
        counted = [str(f.path) for f in found if str(f.path) not in naming or str(f.path) in kept_paths]
        files, total = len(counted), sum(file_sizes.get(p, 0) for p in counted)
    return ScanResult(rules, kept, tuple(summarised([*problems, *orphans])), files=files, bytes=total, names=tuple(sorted(names)))
