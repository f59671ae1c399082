"""User and environment errors are exit 2 with one line naming what is wrong, never exit 3
("internal error"), never a traceback with Python's exit 1 ("spikes found"): an output that cannot
be written, HOME unset with a uid that has no passwd entry, a rules or config file that is no
regular file or far too large, a config file invalid anywhere (refused by every command that reads
it, as `config check` refuses it), and out-of-range arguments. Real processes where the case is
the process's own (its stdout, its uid, a FIFO that would hang it); main() in-process elsewhere."""

from __future__ import annotations

import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from lossguard.cli import main
from lossguard.state import State

from . import samples
from .conftest import assert_one_error_line, run_lossguard, run_lossguard_in_process


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / "exp1" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(samples.JSONL)
    return path


@pytest.fixture(autouse=True)
def _no_lossguard_environment(monkeypatch):
    for name in [k for k in os.environ if k.startswith("LOSSGUARD_")]:
        monkeypatch.delenv(name)


def _main(capsys, *args: str) -> subprocess.CompletedProcess:
    """main(ARGS) in this process, as a finished process (for assert_one_error_line)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def _lossguard(*args: str, **popen) -> subprocess.CompletedProcess:
    """`lossguard ARGS` in a real process with Popen options of its own (stdout, preexec_fn, env)."""
    env = popen.pop("env", {k: v for k, v in os.environ.items() if not k.startswith("LOSSGUARD_")})
    return subprocess.run([sys.executable, "-m", "lossguard.cli", *args], stderr=subprocess.PIPE, text=True, env=env, timeout=60, **popen)


# --- the output: a full device, a closed stdout, a file that refuses writes ------------------------

@pytest.mark.parametrize("command", [
    pytest.param(["scan"], id="scan's report"),
    pytest.param(["read"], id="read's table"),
    pytest.param(["read", "--format", "csv"], id="read's csv, written by polars to the descriptor"),
])
def test_a_stdout_on_a_full_device_is_exit_2_saying_so(log, command):
    with open("/dev/full", "w") as full:
        res = _lossguard(*command, str(log.parent), stdout=full)
    assert assert_one_error_line(res) == "lossguard: error: cannot write the output to stdout: No space left on device"


@pytest.mark.parametrize("command", [
    pytest.param(["scan"], id="scan's report"),
    pytest.param(["read", "--format", "json"], id="read's json lines, written by polars"),
])
def test_a_closed_stdout_is_exit_2_saying_so(log, command):
    res = _lossguard(*command, str(log.parent), stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert assert_one_error_line(res) == "lossguard: error: cannot write the output: stdout is closed"


def test_with_stdout_closed_what_it_would_print_lands_in_no_file_it_opens(tmp_path):
    res = _lossguard("silence", "add", "--run", "exp1", "--for", "1h", "--comment", "ok", "--state-dir", str(tmp_path),
                     stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert_one_error_line(res, "stdout is closed")
    # The silence is in, and the state file whole: descriptor 1 was not handed to it.
    assert sqlite3.connect(tmp_path / "state.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)
    state = State.attach(tmp_path)
    assert [s.run for s in state.silences()] == ["exp1"]
    state.close()


def test_a_report_written_with_o_needs_no_stdout(log, tmp_path):
    res = _lossguard("scan", str(log.parent), "-o", str(tmp_path / "report.txt"), stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert res.returncode == 1, res.stderr  # (the sample's spikes found)
    assert "2 finding(s) in 1 of 1 run(s): 1 NaN, 1 Inf." in (tmp_path / "report.txt").read_text()


@pytest.mark.parametrize("target, why", [
    pytest.param("/dev/full", "No space left on device", id="a full device"),
    pytest.param("/proc/version", "Input/output error", id="a file that refuses writes"),
    pytest.param("no/such/folder/report.txt", "No such file or directory", id="a folder that does not exist"),
])
def test_a_report_file_that_cannot_be_written_is_exit_2_naming_it(log, capsys, target, why):
    res = _main(capsys, "scan", str(log.parent), "-o", target)
    assert assert_one_error_line(res) == f"lossguard: error: cannot write the output to {target}: {why}"


# --- HOME unset and a uid with no passwd entry (env -i, a container's arbitrary uid) ---------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="taking a uid with no passwd entry needs root")
NOBODY_KNOWS = 12345


def _uid_without_passwd_entry() -> None:
    # The real uid is what getpwuid(getuid()) (Path.home(), getpass) asks about; the effective uid
    # stays root so that the interpreter under /root (mode 700 here) can still be run and read.
    os.setresuid(NOBODY_KNOWS, 0, 0)


@pytest.fixture
def stranger_env() -> dict[str, str]:
    import pwd

    with pytest.raises(KeyError):
        pwd.getpwuid(NOBODY_KNOWS)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


@pytest.fixture
def open_dir():
    """A state folder a uid with no passwd entry may write (pytest's own are root's, mode 700)."""
    path = Path(tempfile.mkdtemp(prefix="lossguard-nobody-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def _as_stranger(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return _lossguard(*args, stdout=subprocess.PIPE, env=env, cwd="/", preexec_fn=_uid_without_passwd_entry)


@needs_root
@pytest.mark.parametrize("command", [["status"], ["silence", "list"], ["outbox", "list"], ["config", "check"]], ids=" ".join)
def test_without_home_or_passwd_entry_a_command_needing_the_state_dir_asks_for_it(stranger_env, command):
    res = _as_stranger(*command, env=stranger_env)
    line = assert_one_error_line(res, f"uid {NOBODY_KNOWS} has no passwd entry", "--state-dir")
    assert line.startswith("lossguard: error: no state directory: HOME is not set")


@needs_root
def test_without_home_or_passwd_entry_watch_asks_for_the_state_dir(stranger_env, log):
    res = _as_stranger("watch", str(log.parent), env=stranger_env)
    assert_one_error_line(res, "no state directory", "--state-dir")


@needs_root
def test_without_home_or_passwd_entry_scan_runs_as_anywhere(stranger_env, log):
    res = _as_stranger("scan", str(log.parent), env=stranger_env)
    assert (res.returncode, res.stderr) == (1, "")
    assert "2 finding(s) in 1 of 1 run(s): 1 NaN, 1 Inf." in res.stdout


@needs_root
def test_a_silence_added_by_a_uid_with_no_passwd_entry_names_it_by_number(stranger_env, open_dir):
    res = _as_stranger("silence", "add", "--run", "exp1", "--for", "1h", "--comment", "restarting", "--state-dir", str(open_dir),
                       env={**stranger_env, "HOME": str(open_dir)})
    assert res.returncode == 0, res.stderr
    assert f"by uid {NOBODY_KNOWS}: restarting" in res.stdout


# --- rules and config files: a regular file of sensible size, or refused at once ---------------------

def _no_more_than_3_gb() -> None:
    # (before the fix /dev/zero was read until memory ran out: this makes that a quick MemoryError)
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.parametrize("flag", ["--rules", "--config"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_rules_or_config_file_that_is_no_regular_file_is_refused_without_reading_it(log, tmp_path, flag, kind):
    if kind == "fifo":
        path = tmp_path / "rules.toml"
        os.mkfifo(path)  # opening it for reading would wait for a writer forever: the timeout shows it
    else:
        path = Path(kind)
    res = _lossguard("scan", str(log.parent), flag, str(path), stdout=subprocess.DEVNULL, preexec_fn=_no_more_than_3_gb)
    assert assert_one_error_line(res) == f"lossguard: error: {path}: not a regular file (a FIFO or a device is not read)"


@pytest.mark.parametrize("flag", ["--rules", "--config"])
def test_a_rules_or_config_file_over_a_mib_is_refused_as_the_wrong_file(log, tmp_path, capsys, flag):
    big = tmp_path / "huge.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")  # valid TOML, all comment
    res = _main(capsys, "scan", str(log.parent), flag, str(big))
    assert_one_error_line(res, str(big), "larger than 1 MiB")


def test_a_folder_given_as_config_is_named_as_a_folder(log, tmp_path, capsys):
    res = _main(capsys, "scan", str(log.parent), "--config", str(tmp_path))
    assert assert_one_error_line(res) == f"lossguard: error: {tmp_path}: is a folder, not a TOML file"


# --- a config file is refused by every command that reads it, as `config check` refuses it -----------

BAD_CONFIGS = {
    "paths = 5": "paths = 5\n",
    'poll_interval = "5"': 'poll_interval = "5"\n',
    "[aliases] loss = 5": "[aliases]\nloss = 5\n",
}


def _commands(log: Path, state: Path) -> dict[str, list[str]]:
    return {
        "scan": ["scan", str(log.parent)],
        "read": ["read", str(log.parent)],
        "alert test": ["alert", "test"],
        "status": ["status"],
        "silence list": ["silence", "list"],
        "silence add --rule": ["silence", "add", "--run", "exp1", "--rule", "loss-spike", "--for", "1h", "--comment", "c", "--state-dir", str(state)],
        "outbox list": ["outbox", "list"],
    }


@pytest.mark.parametrize("bad", list(BAD_CONFIGS))
@pytest.mark.parametrize("command", list(_commands(Path("x"), Path("y"))))
def test_an_invalid_config_is_refused_by_every_command_as_config_check_refuses_it(log, tmp_path, capsys, bad, command):
    config = tmp_path / "bad.toml"
    config.write_text(BAD_CONFIGS[bad])
    refused = assert_one_error_line(_main(capsys, "config", "check", "--config", str(config)), str(config))
    res = _main(capsys, *_commands(log, tmp_path / "state")[command], "--config", str(config))
    assert assert_one_error_line(res) == refused


@pytest.mark.parametrize("bad", list(BAD_CONFIGS))
def test_watch_refuses_an_invalid_config_even_where_the_command_line_overrides_the_value(log, tmp_path, bad):
    config = tmp_path / "bad.toml"
    config.write_text(BAD_CONFIGS[bad])
    start = time.monotonic()
    run = run_lossguard if bad == "paths = 5" else run_lossguard_in_process  # (one in a real process: the daemon's exit code)
    res = run("watch", str(log.parent), "--poll-interval", "1", "--state-dir", str(tmp_path / "state"), "--config", str(config))
    assert_one_error_line(res, str(config))
    assert time.monotonic() - start < 30


# --- arguments out of range -----------------------------------------------------------------------

TOO_BIG = str(2**76)


@pytest.mark.parametrize("args, line", [
    pytest.param(["--for", ""], "--for '': not a duration", id="--for ''"),
    pytest.param(["--until", "0001-01-01"], "--until '0001-01-01': that time has passed", id="--until year 1"),
    pytest.param(["--until", "9999-12-31T23:59"], "--until '9999-12-31T23:59': a silence lasts at most a year", id="--until year 9999"),
])
def test_a_silence_time_out_of_range_is_exit_2_saying_what_is_wrong(tmp_path, capsys, args, line):
    res = _main(capsys, "silence", "add", "--run", "exp1", *args, "--comment", "c", "--state-dir", str(tmp_path))
    assert line in assert_one_error_line(res)


@pytest.mark.parametrize("command, line", [
    pytest.param(["silence", "expire", TOO_BIG], f"no silence #{TOO_BIG} (see `lossguard silence list --all`)", id="silence expire"),
    pytest.param(["outbox", "retry", TOO_BIG], f"no outbox entry #{TOO_BIG} (see `lossguard outbox list`)", id="outbox retry"),
    pytest.param(["outbox", "drop", TOO_BIG], f"no outbox entry #{TOO_BIG} (see `lossguard outbox list`)", id="outbox drop"),
])
def test_an_id_past_64_bits_names_no_row_and_says_so(tmp_path, capsys, command, line):
    State(tmp_path).close()
    res = _main(capsys, *command, "--state-dir", str(tmp_path))
    assert assert_one_error_line(res) == f"lossguard: error: {line}"
