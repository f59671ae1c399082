"""The notebook API (`lossguard.read`, `lossguard.scan`, `lossguard.detect`): the names are the public
API, and each gives what the CLI gives for the same runs."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import polars as pl
import pytest

import lossguard

from .conftest import FIXTURES

RUNS = FIXTURES / "runs"


def test_the_public_names_are_exported_and_import_lossguard_stays_light():
    assert set(lossguard.__all__) == {"LossguardError", "LossguardWarning", "Report", "__version__", "detect", "read", "scan"}
    for name in lossguard.__all__:
        assert getattr(lossguard, name) is not None
    # The CLI imports the package first: polars must not come with it.
    probe = subprocess.run([sys.executable, "-c", "import sys, lossguard; print('polars' in sys.modules)"], capture_output=True, text=True)
    assert probe.stdout.strip() == "False"
    import importlib

    importlib.import_module("lossguard.report.audit")  # loaded as a submodule, it must not shadow the function
    assert callable(lossguard.scan) and callable(lossguard.detect)


def test_read_takes_a_string_a_path_or_several_and_gives_the_canonical_table():
    one = lossguard.read(str(RUNS / "nanogpt-clean"))
    assert one.columns == ["run", "source", "step", "metric", "tag", "value", "wall_time"]
    assert one.filter(pl.col("metric") == "loss").height == 1200
    both = lossguard.read([RUNS / "nanogpt-clean", str(RUNS / "tb-clean")])
    assert both.height == one.height + lossguard.read(RUNS / "tb-clean").height


def test_read_warns_about_a_bad_file_and_raises_on_a_missing_path(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (tmp_path / "exp" / "events.out.tfevents.1.host").write_bytes(b"\x00" * 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = lossguard.read(tmp_path)
    assert frame.filter(pl.col("metric") == "loss").height == 1
    assert [w.category for w in caught] == [lossguard.LossguardWarning] and "events.out.tfevents" in str(caught[0].message)
    with pytest.raises(lossguard.LossguardError, match="no such file or folder"):
        lossguard.read(tmp_path / "nope")


def test_scan_report_has_the_json_reports_fields_and_values():
    report = lossguard.scan(str(RUNS), rules="olmo-core")
    cli = subprocess.run([sys.executable, "-m", "lossguard", "scan", str(RUNS), "--rules", "olmo-core", "--format", "json"], capture_output=True, text=True)
    doc = json.loads(cli.stdout)
    assert {k: getattr(report, k) for k in doc} == json.loads(json.dumps({k: getattr(report, k) for k in doc}))  # plain JSON data
    assert json.loads(report.to_json()) == doc
    assert report.summary == doc["summary"] and report.runs == doc["runs"] and report.rules == doc["rules"]
    spikes = report.spikes()
    assert spikes.height == doc["summary"]["spikes"] and set(spikes.get_column("rule")) == {"olmo-core-zscore"}


def test_detect_finds_what_scan_finds_on_reads_table():
    spikes = lossguard.detect(lossguard.read(RUNS))
    report = lossguard.scan(RUNS)
    key = ["run", "rule", "step"]
    assert spikes.select(key).sort(key).rows() == report.spikes().select(key).sort(key).rows()


def test_detect_takes_a_bare_frame_of_steps_metrics_and_values():
    losses = [2.0] * 9 + [5.0] + [2.0] * 5
    frame = pl.DataFrame({"step": range(1, 16), "metric": ["loss"] * 15, "value": losses})
    spikes = lossguard.detect(frame)
    assert spikes.select("run", "rule", "step", "value").rows() == [(".", "loss-spike", 10, 5.0)]
    with pytest.raises(lossguard.LossguardError, match="detect needs the columns"):
        lossguard.detect(pl.DataFrame({"x": [1]}))
