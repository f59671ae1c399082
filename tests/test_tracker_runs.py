"""Trackers' files: a folder of the tracker's own (`wandb/`, `mlruns/`, `dvclive/`) laid out its
own way (formats.base.Layout), and files that name the runs of their rows (a database holding many
runs). Pinned here with a small tracker format of the test's own, so that what discovery, scan and
the daemon do with such files is tested apart from any one tracker's reader."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from lossguard.detection.rules import default_rules
from lossguard.ingest import reader as reader_module
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.discover import collect, discover
from lossguard.ingest.formats import sniff
from lossguard.ingest.formats.base import Format, Layout, Parsed
from lossguard.ingest.reader import ReadOptions, read_paths
from lossguard.report.audit import scan
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ


class _Ledger:
    """Lines `run step loss`; the file names each row's run, as a tracker's database does."""

    name = "ledger"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        data = path.read_bytes()[cursor.offset :]
        whole = data[: data.rfind(b"\n") + 1]
        rows = [line.split() for line in whole.decode().splitlines()]
        frame = pl.DataFrame(
            {"step": [int(r[1]) for r in rows], "tag": ["loss"] * len(rows), "value": [float(r[2]) for r in rows],
             "wall_time": [None] * len(rows), "run": [r[0] for r in rows]},
            schema={"step": pl.Int64, "tag": pl.String, "value": pl.Float64, "wall_time": pl.Float64, "run": pl.String},
        )
        return Parsed(frame, cursor.advance(offset=cursor.offset + len(whole)))


LEDGER = Format(
    reader=_Ledger(), names_runs=True,
    layout=Layout(folder="ledgers", logs=lambda below: len(below) == 2 and below[1].endswith(".rec"), skip=frozenset({"files", "latest"})),
)


@pytest.fixture
def ledger(monkeypatch):
    monkeypatch.setitem(sniff.LAYOUTS, "ledgers", LEDGER)
    monkeypatch.setitem(reader_module.BUILTIN, "ledger", LEDGER.reader)
    return LEDGER


def _calm(run: str, steps) -> str:
    return "".join(f"{run} {s} {2.0 + (s % 5) * 0.01}\n" for s in steps)


def _tree(root: Path) -> Path:
    """runs/exp1/ledgers/r1/a.rec (two runs in it), with copies, a link and other files beside it,
    and runs/exp1/train.log, the trainer's own console log."""
    r1 = root / "exp1" / "ledgers" / "r1"
    (r1 / "files").mkdir(parents=True)
    rec = r1 / "a.rec"
    rec.write_text(_calm("proj/alpha", range(1, 30)) + _calm("proj/beta", range(1, 30)))
    (r1 / "files" / "output.log").write_text("step 1 loss 2.0\n")
    (r1 / "debug.log").write_text("step 1 loss 2.0\n")
    os.symlink(r1, root / "exp1" / "ledgers" / "latest")
    (root / "exp1" / "train.log").write_text("".join(f"step {s} loss {2.0 + (s % 3) * 0.01}\n" for s in range(1, 30)))
    return rec


def test_a_tracker_folder_gives_only_its_logs_under_their_own_names_and_names_no_run_of_its_own(tmp_path, ledger):
    root = tmp_path / "runs"
    rec = _tree(root)
    found = discover(root, problems=[])
    # The copies under files/, the debug log and the `latest` link are not walked as logs; the
    # tracker's file is found under its own folder's name (the walk meets `latest` first).
    assert [(f.run, f.path) for f in found] == [("exp1", rec), ("exp1", root / "exp1" / "train.log")]
    assert sniff.format_of(rec) == "ledger"
    # Scanned from the tracker's folder itself, or named on the command line: no folder above names it.
    assert [f.run for f in discover(root / "exp1" / "ledgers", problems=[])] == ["."]
    assert [f.run for f in discover(rec, problems=[])] == ["."]


def test_a_file_naming_its_rows_runs_gives_runs_of_their_own_beside_its_folders_run(tmp_path, ledger):
    root = tmp_path / "runs"
    rec = _tree(root)
    with open(rec, "a") as fh:
        fh.write(_calm("proj/beta", range(30, 40)) + "proj/beta 40 9.0\n" + _calm("proj/beta", range(41, 50)))
    result = scan([root], rules=default_rules())
    assert [r.run for r in result.runs] == ["exp1", "exp1/proj/alpha", "exp1/proj/beta"]
    assert [(i.run, i.step) for i in result.incidents] == [("exp1/proj/beta", 40)]
    # A run filter judges the runs the file names, once it is read.
    assert [r.run for r in scan([root], rules=default_rules(), run_glob="*/beta").runs] == ["exp1/proj/beta"]
    frame, _, _ = read_paths([root / "exp1" / "ledgers"], ReadOptions())
    assert frame.get_column("run").unique().sort().to_list() == ["proj/alpha", "proj/beta"]


def test_the_daemon_judges_each_run_a_file_names_and_moves_each_on(tmp_path, ledger):
    root = tmp_path / "runs"
    rec = _tree(root)
    state = State(tmp_path / "state")
    follower = Follower([root], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)
    with open(rec, "a") as fh:
        fh.write(_calm("proj/alpha", range(30, 35)) + "proj/beta 30 9.0\n")
    report = follower.run_pass(2.0)
    assert report.rows == 6
    opened = state.open_incidents_of(["exp1", "exp1/proj/alpha", "exp1/proj/beta"])
    assert {run: [i.incident.step for i in rows] for run, rows in opened.items()} == {"exp1/proj/beta": [30]}
    runs = {r.run: r.last_step for r in state.runs()}
    assert (runs["exp1/proj/alpha"], runs["exp1/proj/beta"]) == (34, 30)
    state.close()


@pytest.mark.parametrize("folder", ["wandb", "mlruns", "dvclive"])
def test_a_folder_merely_named_like_a_trackers_hides_none_of_the_logs_under_it(tmp_path, folder):
    # A checkout or a project folder of that name (`~/src/wandb/`, `/scratch/dvclive/exp1/`) holds
    # ordinary runs: only what the tracker itself keeps there makes the folder its.
    log = tmp_path / folder / "exp1" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"step {s} loss {2.0 + (s % 3) * 0.01}\n" for s in range(1, 30)) + "step 30 loss 9.0\n")
    assert [(f.run, f.path) for f in discover(tmp_path, problems=[])] == [(f"{folder}/exp1", log)]
    assert [(i.run, i.step) for i in scan([tmp_path], rules=default_rules()).incidents] == [(f"{folder}/exp1", 30)]


def test_a_run_folder_scanned_itself_is_named_for_its_folder_not_dot(tmp_path, monkeypatch):
    # Acceptance run 3: `scan dvclive/exp1`, or `scan .` inside the run, named the run ".": a name that
    # says nothing in a report, a Slack alert or a Prometheus label. A walk from above names it exp1.
    exp = tmp_path / "runs" / "exp1"
    (exp / "dvclive" / "plots" / "metrics").mkdir(parents=True)
    (exp / "dvclive" / "plots" / "metrics" / "loss.tsv").write_text("step\tloss\n" + "".join(f"{s}\t2.0\n" for s in range(12)))
    (exp / "dvclive" / "metrics.json").write_text('{"step": 11}')
    (tmp_path / "runs" / "exp2").mkdir()
    (tmp_path / "runs" / "exp2" / "train.log").write_text("".join(f"step {s} loss 2.0\n" for s in range(12)))
    monkeypatch.chdir(exp / "dvclive")
    for root in (exp, exp / "dvclive", Path("."), Path("plots/metrics/loss.tsv")):
        found, _ = collect([root])
        assert {f.run for f in found} == {"exp1"}, root
    monkeypatch.chdir(tmp_path / "runs" / "exp2")
    assert {f.run for f in collect([Path(".")])[0]} == {"exp2"}
    assert {f.run for f in collect([tmp_path / "runs"])[0]} == {"exp1", "exp2"}


def test_a_run_folder_scanned_itself_whose_name_is_not_utf8_is_named_as_every_discovered_name_is(tmp_path):
    exp = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    exp.mkdir()
    (exp / "train.log").write_text("".join(f"step {s} loss 2.0\n" for s in range(12)))
    found, _ = collect([exp])
    assert {f.run for f in found} == {"caf\\xe9"}
