"""The daemon walks the same tree every poll interval (NFS): folders that did not change are not
listed again, and the answer stays what a fresh walk would give."""

from __future__ import annotations

import os
import time

import polars as pl

from lossguard.ingest.discover import Listings, discover
from lossguard.ingest.reader import read_paths


def test_repeated_walks_list_again_only_the_folders_that_changed(tmp_path):
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    old = time.time_ns() - 10 * 10**9
    for folder in (tmp_path, tmp_path / "a", tmp_path / "b"):
        os.utime(folder, ns=(old, old))
    listings = Listings()
    first = discover(tmp_path, problems=[], listings=listings)
    assert [f.run for f in first] == ["a", "b"] and listings.listed == 3
    again = discover(tmp_path, problems=[], listings=listings)
    assert again == first and listings.listed == 3  # nothing moved: nothing listed again
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    later = discover(tmp_path, problems=[], listings=listings)
    assert [f.run for f in later] == ["a", "b", "c"] and listings.listed == 5  # the root and c
    # A folder whose time is within the racy window is listed again even if the time did not move.
    (tmp_path / "a" / "train.log").write_text("step 1 | loss 2.0\n")
    now = time.time_ns()
    os.utime(tmp_path / "a", ns=(now, now))
    listings.folders[str(tmp_path / "a")] = ((*listings.folders[str(tmp_path / "a")][0][:2], now), listings.folders[str(tmp_path / "a")][1])
    assert {f.path.name for f in discover(tmp_path, problems=[], listings=listings) if f.path.parent.name == "a"} == {"metrics.jsonl", "train.log"}


def test_listings_of_folders_that_are_gone_are_forgotten(tmp_path):
    import shutil

    from lossguard.ingest.discover import collect

    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    listings = Listings()
    found, _ = collect([tmp_path], listings=listings)
    assert len(found) == 2 and str(tmp_path / "b") in listings.folders
    shutil.rmtree(tmp_path / "b")
    found, _ = collect([tmp_path], listings=listings)
    assert [f.run for f in found] == ["a"] and str(tmp_path / "b") not in listings.folders


def test_rotated_segments_join_their_live_log_oldest_first(tmp_path):
    (tmp_path / "exp").mkdir()
    for name in ("train.log", "train.log.1", "train.log.2", "train.log.2024", "model.pt.1", "train.log.3.gz"):
        (tmp_path / "exp" / name).write_text("step 1 | loss: 2.0\n")
    found = discover(tmp_path, problems=[])
    assert [(f.run, f.path.name) for f in found] == [("exp", "train.log.2"), ("exp", "train.log.1"), ("exp", "train.log")]


def test_a_spike_in_a_rotated_segment_is_found_at_its_step(tmp_path):
    from lossguard.detection.rules import default_rules
    from lossguard.report.audit import scan

    (tmp_path / "exp").mkdir()
    step = 1
    for name in ("train.log.2", "train.log.1", "train.log"):
        lines = []
        for i in range(30):
            loss = 9.0 if (name == "train.log.1" and i == 20) else 2.0 + step % 5 * 0.01
            lines.append(f"step {step} | loss: {loss} | lr 1e-4 | norm: 1.0\n")
            step += 1
        (tmp_path / "exp" / name).write_text("".join(lines))
    (report,) = scan([tmp_path], rules=default_rules()).runs
    assert report.analysis.run == "exp" and [i.step for i in report.analysis.incidents] == [51]


def test_a_name_a_format_claims_is_a_log_whatever_its_suffix(tmp_path, monkeypatch):
    from lossguard.ingest.formats import base, sniff

    (tmp_path / "run").mkdir()
    for name in ("events.out.tfevents.1700000000.host.v2", "weights.toy", "notes.md"):
        (tmp_path / "run" / name).write_bytes(b"x")
    assert [f.path.name for f in discover(tmp_path, problems=[])] == ["events.out.tfevents.1700000000.host.v2"]
    # A new format's declared names are walked too, with no list in discovery to edit.
    toy = base.Format(reader=base.LineFormat("toy", lambda lines, cursor, raw: (lines, cursor)), names=("*.toy",))
    monkeypatch.setattr(sniff, "FORMATS", (*sniff.FORMATS, toy))
    assert [f.path.name for f in discover(tmp_path, problems=[])] == ["events.out.tfevents.1700000000.host.v2", "weights.toy"]
    assert sniff.format_of(tmp_path / "run" / "weights.toy") == "toy"


def test_symlink_loops_are_said_once_each_and_the_runs_beside_them_are_read(tmp_path):
    from lossguard.ingest.discover import collect

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    os.symlink("self", tmp_path / "exp" / "self")  # resolves to itself
    os.symlink("b", tmp_path / "a")  # a -> b -> a
    os.symlink("a", tmp_path / "b")
    os.symlink("..", tmp_path / "exp" / "up")  # back to a folder already walked
    os.symlink("gone", tmp_path / "exp" / "latest")  # dangling: not a log, not a loop
    found, problems = collect([tmp_path], globs=())
    assert [f.path.name for f in found] == ["metrics.jsonl"]
    said = sorted((os.path.relpath(p.source, tmp_path), "loop" in p.message) for p in problems)
    assert said == [("a", True), ("b", True), ("exp/self", True), ("exp/up", True)]


def _runs(root):
    return sorted((f.run, f.path.name) for f in discover(root, problems=[]))


def test_a_lone_free_named_log_and_two_of_them_name_runs_the_same_way(tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "slm_v0.csv").write_text("step,loss\n1,2.0\n")
    assert _runs(tmp_path) == [("csv/slm_v0", "slm_v0.csv")]
    (tmp_path / "csv" / "slm_v1.csv").write_text("step,loss\n1,2.0\n")
    assert _runs(tmp_path) == [("csv/slm_v0", "slm_v0.csv"), ("csv/slm_v1", "slm_v1.csv")]  # the first run kept its name


def test_a_log_named_as_its_folders_one_log_makes_the_folder_the_run(tmp_path):
    for folder, name in [("a", "train.log"), ("b", "stdout.txt"), ("c", "nohup.out"), ("d", "d.log"), ("e", "Training.LOG"), ("f", "log.txt")]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("step 1 | loss: 2.0\n")
    (tmp_path / "a" / "eval.log").write_text("step 1 | loss: 2.0\n")  # a free name beside it is a run of its own
    (tmp_path / "a" / "slurm-4242.out").write_text("step 1 | loss: 2.0\n")
    assert _runs(tmp_path) == [
        ("a", "train.log"), ("a/eval", "eval.log"), ("a/slurm-4242", "slurm-4242.out"), ("b", "stdout.txt"), ("c", "nohup.out"),
        ("d", "d.log"), ("e", "Training.LOG"), ("f", "log.txt"),
    ]


def test_the_daemon_keeps_the_run_name_a_file_was_first_followed_under(tmp_path):
    """The upgrade path for names an older lossguard gave by looking at sibling files (a lone
    `csv/x.csv` was run `csv`): a file already followed keeps its run, so its incidents, silences
    and alert threads stay where they are; only files met for the first time take the new name."""
    from lossguard.watch.followed import Tracker
    from lossguard.state import State

    (tmp_path / "runs" / "csv").mkdir(parents=True)
    (tmp_path / "runs" / "csv" / "x.csv").write_text("step,loss\n1,2.0\n")
    state = State(tmp_path / "state")
    tracker = Tracker([tmp_path / "runs"])
    seen, _ = tracker.walk({}, quiet=True)
    (path, sighting), = seen.items()
    assert sighting.row.run == "csv/x"
    with state.transaction() as tx:
        tx.put_file(sighting.row.__class__(**{**sighting.row.__dict__, "run": "csv"}))  # as the older lossguard named it
    (tmp_path / "runs" / "csv" / "y.csv").write_text("step,loss\n1,2.0\n")
    again, _ = Tracker([tmp_path / "runs"]).walk(state.files(), quiet=False)
    assert sorted((s.row.run, os.path.basename(p)) for p, s in again.items()) == [("csv", "x.csv"), ("csv/y", "y.csv")]
    state.close()


def test_absl_info_logs_are_text_logs_of_their_program_and_the_link_to_the_newest_is_not_read_twice(tmp_path):
    # absl/glog name their logs `<program>.<host>.<user>.log.INFO.<date>-<time>.<pid>`
    # (absl/logging/__init__.py, find_log_dir_and_names) with `<program>.INFO` linking the newest.
    folder = tmp_path / "runs" / "exp"
    folder.mkdir(parents=True)
    lines = "".join(f"I0101 12:00:{s % 60:02d}.000000 4242 train.py:96] step {s} | loss {9.0 if s == 30 else 2.0 + (s % 5) * 0.01}\n" for s in range(1, 40))
    log = folder / "train.box.root.log.INFO.20260101-120000.4242"
    log.write_text(lines)
    (folder / "train.INFO").symlink_to(log.name)
    (folder / "train.box.root.log.WARNING.20260101-120000.4242").write_text("W0101 12:00:00.000000 4242 train.py:9] slow\n")
    (tmp_path / "runs" / "solo.INFO").write_text(lines)  # (not a link: read)
    found = discover(tmp_path / "runs", problems=[])
    assert sorted((f.run, f.path.name) for f in found) == [("exp/train", log.name), ("solo", "solo.INFO")]
    frame, _, problems = read_paths([log])
    assert problems == [] and frame.filter(pl.col("metric") == "loss").get_column("step").to_list() == list(range(1, 40))
