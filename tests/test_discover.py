"""The daemon walks the same tree every poll interval (NFS): folders that did not change are not
listed again, and the answer stays what a fresh walk would give."""

from __future__ import annotations

import os
import time

from lossguard.sources.discover import Listings, discover


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

    from lossguard.reader import ReadOptions, collect

    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    listings = Listings()
    found, _ = collect([tmp_path], ReadOptions(), listings=listings)
    assert len(found) == 2 and str(tmp_path / "b") in listings.folders
    shutil.rmtree(tmp_path / "b")
    found, _ = collect([tmp_path], ReadOptions(), listings=listings)
    assert [f.run for f in found] == ["a"] and str(tmp_path / "b") not in listings.folders
