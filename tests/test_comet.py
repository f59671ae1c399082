"""Comet's offline experiments (formats/comet_offline.py), as the real comet_ml wrote one (committed:
tests/fixtures/comet): an OfflineExperiment archives its messages at its end as `<key>.zip` in its
offline directory."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import polars as pl

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths

from .conftest import FIXTURES, run_lossguard

FIXTURE = FIXTURES / "comet" / "c377ed14a8294afe8d8b51fbd1a80f33.zip"
"""Written by comet_ml 3.58.8 itself (tests/fixtures/comet/SOURCES.md, write_offline.py)."""


def _write(folder: Path) -> Path:
    """The archive where comet_ml puts it: `<offline directory>/<key>.zip`."""
    folder.mkdir(parents=True)
    return Path(shutil.copy(FIXTURE, folder))


def test_an_offline_experiment_comet_wrote_reads_back_every_step_and_nan_under_its_project_and_name(tmp_path):
    archive = _write(tmp_path / "runs" / "exp1" / ".cometml-runs")
    frame, results, problems = read_paths([tmp_path / "runs"], ReadOptions())
    assert problems == [] and [r.format for r in results] == ["comet_offline"]
    assert set(frame.get_column("run").to_list()) == {"exp1/proj/run-a@c377ed14"}
    loss = frame.filter(pl.col("metric") == "loss").sort("step")
    assert loss.get_column("step").to_list() == list(range(41))
    assert loss.get_column("value")[30] == 9.0 and math.isnan(loss.get_column("value")[40])
    assert frame.filter(pl.col("metric") == "eval_loss").select("step", "value").rows() == [(39, 1.5)]
    assert frame.filter(pl.col("metric") == "lr").height == 40
    again = read(archive, read(archive, Cursor(), run="r", fmt="comet_offline", final=False, options=ReadOptions()).cursor, run="r", fmt="comet_offline", final=False, options=ReadOptions())
    assert again.frame.height == 0  # (archived once, whole: read once)


def test_scan_finds_the_spike_an_offline_experiment_logged(tmp_path):
    _write(tmp_path / "runs" / "exp1" / ".cometml-runs")
    res = run_lossguard("scan", str(tmp_path / "runs"), "--format", "json")
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert report["run"] == "exp1/proj/run-a@c377ed14"
    assert ("loss", 30) in [(s["metric"], s["step"]) for s in report["spikes"]]


def test_an_archive_cut_short_is_not_yet_for_the_daemon_and_one_warning_for_a_scan(tmp_path):
    archive = _write(tmp_path / "off")
    cut = tmp_path / "cut" / archive.name
    cut.parent.mkdir()
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    growing = read(cut, Cursor(), run="r", fmt="comet_offline", final=False, options=ReadOptions())
    assert (growing.frame.height, growing.problems, growing.cursor) == (0, (), Cursor())
    final = read(cut, Cursor(), run="r", fmt="comet_offline", final=True, options=ReadOptions())
    assert len(final.problems) == 1 and "not a readable Comet offline experiment" in final.problems[0].message


def test_messages_no_reader_could_take_are_passed_over_and_the_rest_is_read(tmp_path):
    """From the review: a message whose payload is no object, numbers past a float's range, a step
    past 2^63 and an experiment.json that is no object each made the whole archive unreadable."""
    import zipfile

    with zipfile.ZipFile(FIXTURE) as archive:
        messages = archive.read("messages.json").decode()
    odd = [
        '{"payload":"str","type":"log_other"}',
        '{"payload":{"local_timestamp":1,"metric":{"metricName":"loss","metricValue":1' + "0" * 400 + ',"step":5}},"type":"metric_msg"}',
        '{"payload":{"local_timestamp":1' + "0" * 400 + ',"metric":{"metricName":"x","metricValue":1.0,"step":5}},"type":"metric_msg"}',
        '{"payload":{"local_timestamp":1,"metric":{"metricName":"x","metricValue":1.0,"step":' + str(2**70) + '}},"type":"metric_msg"}',
    ]
    path = tmp_path / FIXTURE.name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("experiment.json", "[1, 2]")
        archive.writestr("messages.json", "\n".join(odd) + "\n" + messages)
    res = read(path, Cursor(), run="r", fmt="comet_offline", final=True, options=ReadOptions())
    assert [p.message for p in res.problems] == ["1 message line(s) of messages.json that are not JSON skipped"]
    assert res.frame.filter(pl.col("tag") == "train/loss").height == 41
    assert set(res.frame.get_column("run").to_list()) == {"r/comet/run-a@c377ed14"}  # (no project: experiment.json is no object)
