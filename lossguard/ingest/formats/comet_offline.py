"""Comet's offline experiments: `comet_ml.OfflineExperiment` (or `comet_ml.start(online=False)`)
keeps a run's messages while it runs and archives them at its end as `<experiment key>.zip` in its
offline directory (`.cometml-runs/` by default, COMET_OFFLINE_DIRECTORY), for `comet upload` later:

    experiment.json   {"project_name": ..., "workspace": ..., "offline_id": <key>, ...}
    messages.json     a JSON line a message; `metric_msg` ones hold payload.metric {metricName,
                      metricValue, step, epoch} and payload.local_timestamp (ms); NaN and the
                      infinities as the strings "NaN", "Infinity", "-Infinity"

The run is named `project/name@key` (the experiment's name, its `log_other` message `Name`, and
the first 8 digits of its key: a script run again under one name is two runs, as W&B's `@id`
keeps them), or `project/key` for an experiment given no name. A value logged with no step goes at the step of the one before it. The archive is written whole at the run's end: a daemon reads it then, once; one being
written is "not yet".
"""

from __future__ import annotations

import json
import os
import zipfile
from fnmatch import fnmatchcase
from pathlib import Path

import polars as pl

from ..cursor import Cursor
from ..problems import Problem
from .base import NAMED_RAW, Format, Layout, Parsed, no_rows

KEY_NAME = "[0-9a-f]" * 32 + ".zip"
"""An offline archive's name: the experiment's key (32 hex digits)."""
MESSAGES, EXPERIMENT = "messages.json", "experiment.json"
NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class CometOfflineFormat:
    name = "comet_offline"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        source = str(path)
        size = os.stat(path).st_size
        if cursor.offset == size and cursor.name is not None:
            return Parsed(pl.DataFrame(schema=NAMED_RAW), cursor)  # (read whole already: archived once)
        try:
            with zipfile.ZipFile(path) as archive:
                experiment = json.loads(archive.read(EXPERIMENT))
                messages = archive.read(MESSAGES).decode("utf-8", errors="replace").splitlines()
        except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
            if not final:
                return Parsed(pl.DataFrame(schema=NAMED_RAW), cursor)  # (being archived: not yet)
            return no_rows(source, cursor, f"not a readable Comet offline experiment ({type(exc).__name__}: {exc})", dead=True)
        experiment = experiment if isinstance(experiment, dict) else {}
        rows, name, problems = _metrics(messages, source)
        key = experiment.get("offline_id") if isinstance(experiment.get("offline_id"), str) else path.stem
        project = experiment.get("project_name") if isinstance(experiment.get("project_name"), str) and experiment.get("project_name") else "comet"
        run = f"{project}/{name}@{key[:8]}" if name else f"{project}/{key}"
        frame = pl.DataFrame(rows, schema={"step": pl.Int64(), "tag": pl.String(), "value": pl.Float64(), "wall_time": pl.Float64()}, orient="row")
        frame = frame.with_columns(pl.lit(run).alias("run"))
        last = int(frame.get_column("step").max()) if frame.height else cursor.last_step
        return Parsed(frame, cursor.advance(offset=size, name=run, last_step=last), tuple(problems))


def _metrics(messages: list[str], source: str) -> tuple[list[tuple[int, str, float, float | None]], str | None, list[Problem]]:
    """The metric messages as (step, tag, value, wall time) in the order logged, the experiment's
    name, and what could not be read (a line that is no JSON; a metric logged before any step)."""
    rows: list[tuple[int, str, float, float | None]] = []
    name, bad, stepless, step = None, 0, 0, None
    for line in messages:
        if '"metric_msg"' not in line and '"log_other"' not in line:
            continue
        try:
            message = json.loads(line)
            payload = message["payload"]
            if not isinstance(payload, dict):
                raise TypeError("payload")
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if message.get("type") == "log_other":
            if payload.get("key") == "Name" and isinstance(payload.get("value"), str):
                name = payload["value"]
            continue
        metric = payload.get("metric")
        if message.get("type") != "metric_msg" or not isinstance(metric, dict):
            continue
        value = _number(metric.get("metricValue"))
        if value is None or not isinstance(metric.get("metricName"), str):
            continue
        if isinstance(metric.get("step"), int) and not isinstance(metric["step"], bool) and 0 <= metric["step"] < 2**63:
            step = metric["step"]
        if step is None:
            stepless += 1
            continue
        stamp = _number(payload.get("local_timestamp"))
        rows.append((step, metric["metricName"], value, stamp / 1000 if stamp is not None else None))
    problems = []
    if bad:
        problems.append(Problem(source, f"{bad} message line(s) of {MESSAGES} that are not JSON skipped"))
    if stepless:
        problems.append(Problem(source, f"{stepless} metric value(s) logged before any step skipped"))
    return rows, name, problems


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
