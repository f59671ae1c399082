"""Comet's offline experiments: `comet_ml.OfflineExperiment` (or `comet_ml.start(online=False)`)
keeps a run's messages while it runs and archives them at its end as `<experiment key>.zip` in its
offline directory (`.cometml-runs/` by default, COMET_OFFLINE_DIRECTORY), for `comet upload` later:

    experiment.json   {"project_name": ..., "workspace": ..., "offline_id": <key>, ...}
    messages.json     a JSON line a message; `metric_msg` ones hold payload.metric {metricName,
                      metricValue, step, epoch} and payload.local_timestamp (ms); NaN and the
                      infinities as the strings "NaN", "Infinity", "-Infinity"

The run is named `project/name@key` (the experiment's name, its `log_other` message `Name`, and
the first 8 digits of its key: a script run again under one name is two runs, as W&B's `@id`
keeps them), or `project/key` for an experiment given no name. A value logged with no step goes
at the step of the one before it. The archive is written whole at the run's end: a daemon reads it
then, once; one being written is "not yet".

messages.json is inflated a chunk at a time and read a line at a time, each bounded (MAX_MEMBER,
bounds.MAX_RECORD): a small archive can hold gigabytes. A message no reader can take (no JSON,
nested too deep, a text value, a step of 1e300) is passed over with one warning a kind, naming the
run and its line; the others are read.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO

import polars as pl

from .. import bounds
from ..cursor import Cursor
from ..problems import Problem
from .base import NAMED_RAW, Format, Layout, Parsed, no_rows

KEY_NAME = "[0-9a-f]" * 32 + ".zip"
"""An offline archive's name: the experiment's key (32 hex digits)."""
MESSAGES, EXPERIMENT = "messages.json", "experiment.json"
NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


MAX_MEMBER = 2 << 30
"""Bytes of messages.json, decompressed: a run of some ten million logged values. A member that
says it holds more is refused before a byte of it is inflated (a small archive can hold gigabytes
of one repeated byte), and reading stops at it whatever the member said."""
CHUNK = 1 << 20
"""What is inflated at a time: lines are taken from it, so memory holds a chunk and one line."""


class CometOfflineFormat:
    name = "comet_offline"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        source = str(path)
        size = os.stat(path).st_size
        if cursor.offset == size and cursor.name is not None:
            return Parsed(pl.DataFrame(schema=NAMED_RAW), cursor)  # (read whole already: archived once)
        try:
            with zipfile.ZipFile(path) as archive:
                declared = archive.getinfo(MESSAGES).file_size
                if declared > MAX_MEMBER:
                    said = f"{MESSAGES} would be {declared:,} bytes decompressed, over the {bounds.size_text(MAX_MEMBER)} a Comet archive's member may hold: not read"
                    return no_rows(source, cursor.advance(offset=size, name=path.stem), said, dead=True)
                experiment, experiment_problem = _experiment(archive, source)
                messages = Messages(source)
                with archive.open(MESSAGES) as member:
                    for number, line in member_lines(member, messages.too_long):
                        messages.take(number, line)
        except bounds.TooLarge as exc:  # (the archive is whole: it will not shrink)
            return no_rows(source, cursor.advance(offset=size, name=path.stem), f"{exc}: not read", dead=True)
        except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError, zlib.error) as exc:
            if not final:
                return Parsed(pl.DataFrame(schema=NAMED_RAW), cursor)  # (being archived: not yet)
            return no_rows(source, cursor, f"not a readable Comet offline experiment ({type(exc).__name__}: {exc})", dead=True)
        run, cut = _run(experiment, path, name=messages.name)
        problems = [p for p in (experiment_problem,) if p] + messages.problems(run)
        if cut:
            problems.append(Problem(source, bounds.cut_name_said("the experiment's name", cut)))
        frame = pl.DataFrame(messages.rows, schema={"step": pl.Int64(), "tag": pl.String(), "value": pl.Float64(), "wall_time": pl.Float64()}, orient="row")
        frame = frame.with_columns(pl.lit(run).alias("run"))
        last = int(frame.get_column("step").max()) if frame.height else cursor.last_step
        return Parsed(frame, cursor.advance(offset=size, name=run, last_step=last), tuple(problems))


def _experiment(archive: zipfile.ZipFile, source: str) -> tuple[dict, Problem | None]:
    """experiment.json's object, or nothing and why (the messages are read all the same: it only
    names the project and the key, which the archive's name gives too)."""
    if archive.getinfo(EXPERIMENT).file_size > bounds.MAX_SMALL_FILE:
        return {}, Problem(source, f"{EXPERIMENT} is over {bounds.size_text(bounds.MAX_SMALL_FILE)}: not read; the run is named by the archive")
    with archive.open(EXPERIMENT) as member:
        raw = member.read(bounds.MAX_SMALL_FILE + 1)
    try:
        experiment = bounds.json_value(raw)
    except ValueError as exc:
        return {}, Problem(source, f"{EXPERIMENT} is no JSON ({exc}): the run is named by the archive")
    return (experiment, None) if isinstance(experiment, dict) else ({}, None)


def _run(experiment: dict, path: Path, *, name: str | None = None) -> tuple[str, int]:
    """`project/name@key8` (or `project/key`), and the length of a name or project cut to
    bounds.MAX_NAME (0: none was)."""
    key = experiment.get("offline_id") if isinstance(experiment.get("offline_id"), str) else path.stem
    project = experiment.get("project_name") if isinstance(experiment.get("project_name"), str) and experiment.get("project_name") else "comet"
    longest = max(len(project), len(name or ""))
    project, cut_project = bounds.name(project)
    name, cut_name = bounds.name(name) if name else (None, False)
    run = f"{project}/{name}@{key[:8]}" if name else f"{project}/{key[:32]}"
    return run, longest if cut_project or cut_name else 0


def member_lines(member: IO[bytes], too_long: Callable[[int], None]) -> Iterator[tuple[int, bytes]]:
    """A zip member's lines (numbered from 1), inflated a CHUNK at a time: a line over
    bounds.MAX_RECORD is passed over (`too_long(its number)`) without being held, and reading
    stops with TooLarge past MAX_MEMBER bytes."""
    held: list[bytes] = []
    held_bytes, number, skipping, total = 0, 0, False, 0
    for chunk in iter(lambda: member.read(CHUNK), b""):
        total += len(chunk)
        if total > MAX_MEMBER:
            raise bounds.TooLarge(f"{MESSAGES} holds more than {bounds.size_text(MAX_MEMBER)} decompressed")
        pieces = chunk.split(b"\n")
        for i, piece in enumerate(pieces):
            if not skipping and piece:
                held.append(piece)
                held_bytes += len(piece)
                if held_bytes > bounds.MAX_RECORD:
                    too_long(number + 1)
                    held, held_bytes, skipping = [], 0, True
            if i < len(pieces) - 1:  # (a newline ends the line)
                number += 1
                if not skipping:
                    yield number, b"".join(held)
                held, held_bytes, skipping = [], 0, False
    if held:
        yield number + 1, b"".join(held)


class Messages:
    """The metric messages taken so far as (step, tag, value, wall time) in the order logged, the
    experiment's name, and what was passed over: a message no reader can take costs itself only."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.rows: list[tuple[int, str, float, float | None]] = []
        self.name: str | None = None
        self.step: int | None = None
        self.passed: dict[str, list[int]] = {}
        """why -> [how many, the first one's line]"""
        self.cut_names = 0

    def too_long(self, number: int) -> None:
        self._pass(f"longer than {bounds.size_text(bounds.MAX_RECORD)}", number)

    def _pass(self, why: str, number: int) -> None:
        seen = self.passed.setdefault(why, [0, number])
        seen[0] += 1

    def take(self, number: int, line: bytes) -> None:
        if b'"metric_msg"' not in line and b'"log_other"' not in line:
            return
        try:
            message = bounds.json_value(line)
        except bounds.TooDeep:
            return self._pass("JSON nested too deep", number)
        except ValueError:
            return self._pass("not JSON", number)
        payload = message.get("payload") if isinstance(message, dict) else None
        if not isinstance(payload, dict):
            return self._pass("no payload object", number)
        if message.get("type") == "log_other":
            if payload.get("key") == "Name" and isinstance(payload.get("value"), str):
                self.name = payload["value"]
            return None
        metric = payload.get("metric")
        if message.get("type") != "metric_msg" or not isinstance(metric, dict):
            return None
        value, tag, step = _number(metric.get("metricValue")), metric.get("metricName"), metric.get("step")
        if not isinstance(tag, str):
            return self._pass("no metric name", number)
        if value is None:
            return self._pass("a value that is no number", number)
        if step is not None:
            step = _step(step)
            if step is None:
                return self._pass("a step that is no whole number from 0 to 2^63", number)
            self.step = step
        if self.step is None:
            return self._pass("a value logged before any step", number)
        tag, cut = bounds.name(tag)
        self.cut_names = max(self.cut_names, len(metric["metricName"]) if cut else 0)
        stamp = _number(payload.get("local_timestamp"))
        self.rows.append((self.step, tag, value, stamp / 1000 if stamp is not None else None))
        return None

    def problems(self, run: str) -> list[Problem]:
        """One warning a kind of message passed over, naming the run and the first one's line."""
        out = []
        for why, (count, first) in self.passed.items():
            more = f" (and {count - 1:,} more like it)" if count > 1 else ""
            out.append(Problem(self.source, f"run {run}: message at {MESSAGES} line {first:,} passed over, {why}{more}"))
        if self.cut_names:
            out.append(Problem(self.source, bounds.cut_name_said("a metric name", self.cut_names)))
        return out


def _step(step: object) -> int | None:
    """A message's step: a whole number from 0 to 2^63 (a float that is one too, as JSON may spell it)."""
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 <= step < 2**63:
        return None
    return int(step) if float(step).is_integer() else None


def _number(value: object) -> float | None:
    """A JSON number as a float (one past float's range is no number), or Comet's NaN and infinities."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return None
    return NON_FINITE.get(value) if isinstance(value, str) else None


COMET_OFFLINE = CometOfflineFormat()
FORMAT = Format(
    reader=COMET_OFFLINE, names=(KEY_NAME,), names_runs=True,
    # (Its default folder: the run is the folder it sits in, as W&B's `wandb/` is.)
    layout=Layout(folder=".cometml-runs", logs=lambda below: len(below) == 1 and fnmatchcase(below[0], KEY_NAME)),
)
