"""Real torchrun output (tests/fixtures/torchrun/, made by torch 2.13's own torchrun with
`--log-dir --redirects 3 --tee 3`, the launcher's output beside it; see make_torchrun_runs.py):
one job's ranks are one run, a NaN, a spike or a crash on one rank is the run's finding naming
that rank, the crash is the first failure's with the host torchrun's table gives, and the
launcher's own output is no run of its own (nor, in the daemon, an alert of its own)."""

from __future__ import annotations

import shutil
from pathlib import Path

from lossguard.alerts.message import describe
from lossguard.detection.rules import default_rules
from lossguard.report.audit import scan

from .test_watch_crash import follower

FIXTURES = Path(__file__).parent / "fixtures" / "torchrun"


def run_folders(fixture: Path) -> list[str]:
    """The runs torch made under the fixture's `--log-dir` (`<run_id>_<random>`, mkdtemp's)."""
    return sorted(f"logs/{p.name}" for p in (fixture / "logs").iterdir())


def findings(run) -> list[tuple[str, int, tuple[str, ...]]]:
    return [(i.rule, i.step, i.rank_list) for i in run.incidents]


def copied(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def test_a_clean_two_rank_run_is_one_run_with_no_finding_and_no_warning_of_its_ranks_stderr():
    result = scan([FIXTURES / "clean"], rules=default_rules())
    (run,) = result.runs
    assert (run.run, run.analysis.first_step, run.analysis.last_step) == (run_folders(FIXTURES / "clean")[0], 1, 300)
    assert (run.incidents, run.problems) == ((), ())
    # The launcher's output (its ranks' lines behind `[default0]:`) is no run: only said unread.
    assert [(Path(p.source).name, p.message) for p in result.problems] == [("launcher.log", "no training metrics recognised in this file")]


def test_a_spike_and_a_nan_on_rank_1_are_the_runs_findings_naming_rank_1_once_each():
    (run,) = scan([FIXTURES / "nan_rank1"], rules=default_rules()).runs
    loss = [f for f in findings(run) if f[0].startswith("loss")]
    assert loss == [("loss-spike", 120, ("1",)), ("loss-nonfinite", 200, ("1",))]
    # (the all-reduced gradient norm is every replica's: one finding naming both)
    assert [f for f in findings(run) if f[0].startswith("grad")] == [("grad-norm-spike", 120, ("0", "1")), ("grad-norm-nonfinite", 200, ("0", "1"))]


def test_a_rank_that_crashes_is_one_crash_of_the_run_naming_the_first_failed_rank_its_host_and_error():
    # Rank 0 dies of gloo's "Connection closed by peer" after rank 1's shape error: torch's error
    # files say which came first, as its table's Root Cause does.
    fixture = FIXTURES / "crash_rank1"
    (run,) = scan([fixture], rules=default_rules()).runs
    (crash,) = run.incidents
    assert (run.run, crash.rule, crash.step, crash.rank_list, crash.host) == (run_folders(fixture)[0], "crash-exception", 149, ("1",), "localhost")
    assert crash.error == "uncaught RuntimeError on rank 1 (localhost)"
    assert any("mat1 and mat2 shapes cannot be multiplied" in line for line in crash.lines)
    assert str(fixture / "launcher.log") in run.paths and run.problems == ()


def test_the_launchers_table_names_the_crash_where_the_ranks_wrote_no_traceback(tmp_path):
    fixture = copied(tmp_path, "crash_rank1")
    for stderr in fixture.glob("logs/*/attempt_0/*/stderr.log"):
        stderr.write_text("")
    (run,) = scan([fixture], rules=default_rules()).runs
    (crash,) = run.incidents
    assert (run.run, crash.rule, crash.step, crash.rank_list, crash.host) == (run_folders(fixture)[0], "crash-worker-failed", 149, ("1",), "localhost")


def test_without_readable_error_files_a_crash_is_still_one_finding_of_the_run(tmp_path):
    fixture = copied(tmp_path, "crash_rank1")
    for error_file in fixture.glob("logs/*/attempt_0/*/error.json"):
        error_file.write_text('{"message": "cut sh')
    (run,) = scan([fixture], rules=default_rules()).runs
    assert [(i.rule, i.step) for i in run.incidents] == [("crash-exception", 149)]


def test_two_agents_sharing_a_log_dir_keep_each_nodes_local_rank_0_apart():
    # Each agent (node) makes its own `<run_id>_<random>` folder, its ranks named by LOCAL rank;
    # no file torch writes says a node's rank, so each agent's folder is a run of its own. Global
    # rank 2 (node 1's local rank 0) spiked: only one run says so.
    fixture = FIXTURES / "two_nodes"
    runs = scan([fixture], rules=default_rules()).runs
    assert [r.run for r in runs] == run_folders(fixture) and len(runs) == 2
    spikes = {r.run: [f for f in findings(r) if f[0] == "loss-spike"] for r in runs}
    assert sorted(spikes.values()) == [[], [("loss-spike", 150, ("0",))]]
    assert all(r.analysis.last_step == 300 for r in runs)


def test_the_daemon_says_a_real_torchrun_crash_once_as_the_failed_ranks_error_naming_the_ranks_and_not_the_launchers(tmp_path):
    # Followed live (the files appear after the daemon's first start), judged once quiet, then restarted.
    (tmp_path / "runs").mkdir()
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    f.run_pass(900.0)
    shutil.copytree(FIXTURES / "crash_rank1", tmp_path / "runs" / "job")
    said = [describe(n) for t in (1000.0, 1100.0, 1200.0) for n in f.run_pass(t).notices]
    folder = run_folders(FIXTURES / "crash_rank1")[0]
    assert said == [f"OPENED [critical] run job/{folder} [ranks 0, 1]: crashed (uncaught RuntimeError on rank 1) at step 149 "
                    "(rule crash-exception); likely the training script raised an exception"]
    state.close()
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    assert [n for t in (2000.0, 2100.0, 9000.0) for n in f.run_pass(t).notices] == []
    state.close()
