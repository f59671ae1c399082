"""Comet's offline experiments (formats/comet_offline.py), as the real comet_ml wrote one (committed:
tests/fixtures/comet): an OfflineExperiment archives its messages at its end as `<key>.zip` in its
offline directory."""

from __future__ import annotations

import json
import math
import shutil
import zipfile
from collections.abc import Iterable
from pathlib import Path

import pytest

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


def _archive(path: Path, *, messages: Iterable[bytes], experiment: bytes | None = None) -> Path:
    """The fixture's archive rewritten with other messages.json bytes, streamed into the member as
    comet_ml's zipfile writes it (deflated): a member of gigabytes costs its compressed size only."""
    with zipfile.ZipFile(FIXTURE) as real, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("experiment.json", real.read("experiment.json") if experiment is None else experiment)
        with archive.open("messages.json", "w", force_zip64=True) as member:
            for piece in messages:
                member.write(piece)
    return path


def _real_messages() -> bytes:
    with zipfile.ZipFile(FIXTURE) as archive:
        return archive.read("messages.json")


def _metric(step: str, value: str = "1.0", name: str = '"x"') -> bytes:
    return ('{"payload":{"local_timestamp":1,"metric":{"metricName":' + name + ',"metricValue":' + value + ',"step":' + step + '}},"type":"metric_msg"}\n').encode()


def test_messages_no_reader_could_take_are_passed_over_each_kind_once_naming_its_line_and_the_rest_is_read(tmp_path):
    """A payload that is no object, numbers past a float's range, a step past 2^63 or of 1e300, a
    text value, a line nested 5,000 deep and one that is no JSON: each costs its message only, live
    (the daemon's read) and in a scan's, and is said once a kind with the first one's line."""
    odd = [
        b'{"payload":"str","type":"log_other"}\n',
        _metric("5", "1" + "0" * 400, '"loss"'),
        b'{"payload":{"local_timestamp":1' + b"0" * 400 + b',"metric":{"metricName":"x","metricValue":1.0,"step":5}},"type":"metric_msg"}\n',
        _metric(str(2**70)),
        _metric("1e300"),
        _metric("6", '"a text"'),
        _metric("7", '"more text"'),
        b'{"type":"metric_msg","payload":' + b'{"a":' * 5000 + b"1" + b"}" * 5001 + b"\n",
        b'{"type":"metric_msg", cut\n',
        _metric("8", "1.0", "17"),
    ]
    path = _archive(tmp_path / FIXTURE.name, messages=[*odd, _real_messages()], experiment=b"[1, 2]")
    for final in (False, True):
        res = read(path, Cursor(), run="r", fmt="comet_offline", final=final, options=ReadOptions())
        assert [p.message for p in res.problems] == [
            f"run comet/run-a@c377ed14: message at messages.json line {line} passed over, {why}"
            for line, why in [
                (1, "no payload object"), (2, "a value that is no number (and 2 more like it)"),
                (4, "a step that is no whole number from 0 to 2^63 (and 1 more like it)"), (8, "JSON nested too deep"), (9, "not JSON"), (10, "no metric name"),
            ]
        ]
        assert res.frame.filter(pl.col("tag") == "train/loss").height == 41 and not res.dead
        assert set(res.frame.get_column("run").to_list()) == {"r/comet/run-a@c377ed14"}  # (no project: experiment.json is no object)


def test_a_line_of_spaces_past_the_line_bound_is_passed_over_without_being_held_and_the_rest_is_read(tmp_path):
    """64 MiB of spaces in one line of messages.json (a 70 KB archive): the reader never holds more
    than the line bound and a chunk of it (measured by tracemalloc, which counts every bytes object),
    says the line once and reads the messages after it."""
    import tracemalloc

    from lossguard.ingest import bounds

    real = _real_messages()
    spaces = b" " * (1 << 20)
    path = _archive(tmp_path / FIXTURE.name, messages=[b'{"type":"metric_msg"', *[spaces] * 64, b"\n", real])
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        res = read(path, Cursor(), run="r", fmt="comet_offline", final=False, options=ReadOptions())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < bounds.MAX_RECORD + (8 << 20)
    assert [p.message for p in res.problems] == ["run proj/run-a@c377ed14: message at messages.json line 1 passed over, longer than 16 MiB"]
    assert res.frame.filter(pl.col("tag") == "train/loss").height == 41


def test_a_member_saying_it_holds_more_than_the_bound_is_refused_before_a_byte_is_inflated(tmp_path, monkeypatch):
    """The bound is 2 GiB; set lower here, so that a member over it is cheap to write: refused by the
    size its header gives, with one line, once (the archive is no longer read), live and in a scan."""
    from lossguard.ingest.formats import comet_offline

    monkeypatch.setattr(comet_offline, "MAX_MEMBER", 1 << 20)
    path = _archive(tmp_path / FIXTURE.name, messages=[_real_messages(), b" " * (2 << 20)])
    for final in (False, True):
        res = read(path, Cursor(), run="r", fmt="comet_offline", final=final, options=ReadOptions())
        assert [p.message for p in res.problems] == [
            f"messages.json would be {21167 + (2 << 20):,} bytes decompressed, over the 1 MiB a Comet archive's member may hold: not read"
        ]
        assert res.dead and res.frame.height == 0


def test_a_member_inflating_past_the_bound_stops_being_read_there(monkeypatch):
    """Whatever the member's header said (Python's zipfile stops at it; another inflater may not)."""
    import io

    from lossguard.ingest import bounds
    from lossguard.ingest.formats import comet_offline

    monkeypatch.setattr(comet_offline, "MAX_MEMBER", 3 << 20)
    monkeypatch.setattr(comet_offline, "CHUNK", 1 << 20)
    lines = comet_offline.member_lines(io.BytesIO((b"x" * 1023 + b"\n") * 4096), lambda number: None)
    with pytest.raises(bounds.TooLarge):
        for _ in lines:
            pass


def test_a_long_experiment_name_is_cut_and_said_once(tmp_path):
    name = "n" * 100_000
    named = b'{"payload":{"key":"Name","value":"' + name.encode() + b'"},"type":"log_other"}\n'
    path = _archive(tmp_path / FIXTURE.name, messages=[named, _real_messages().replace(b'"Name"', b'"Other"')])
    res = read(path, Cursor(), run="r", fmt="comet_offline", final=True, options=ReadOptions())
    (run,) = set(res.frame.get_column("run").to_list())
    assert run == f"r/proj/{'n' * 4095}…@c377ed14"
    assert [p.message for p in res.problems] == ["the experiment's name of 100,000 characters cut to its first 4,095 characters and an ellipsis"]
