from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import settings

# A property test pins what a function returns, never how fast: hypothesis' 200 ms deadline per example
# fails a loaded 2-core box (two workers, daemons beside them) for nothing.
settings.register_profile("lossguard", deadline=None)
settings.load_profile("lossguard")



def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: half as many workers again as there are cores. A fifth of the suite's time is
    tests waiting on a daemon, a server or a writer they started (a process test's CPU is mostly
    the other process's), and a third worker runs tests in those waits: on 2 cores the suite took
    266 s with three workers, 317-325 s with two (same box, same tests). The environment's
    PYTEST_XDIST_AUTO_NUM_WORKERS still says how many, as pytest-xdist has it."""
    told = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if told.isdigit():
        return int(told)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + cores // 2


FIXTURES = Path(__file__).parent / "fixtures"

WAIT_FOR_EVERY_READ = 3600.0
"""A Follower's pass_budget for in-process tests that pin what one pass raises: the pass waits for
every read, so a loaded machine (a file's first read on a thread outlasting the 0.25 s budget) cannot
move a notice to a later pass. The budget itself is tested with budgets of its own."""
CORPUS = FIXTURES / "corpus"


@pytest.fixture
def corpus() -> Path:
    return CORPUS


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture
def slack(monkeypatch):
    """A local server that answers like Slack, with proxies cleared (the real slack-sdk honours them)."""
    from .slack_server import SlackServer

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with SlackServer() as server:
        yield server


@pytest.fixture
def socket(slack):
    """Socket Mode's side (tests.socket_server), whose URL the Slack-like server hands out from
    apps.connections.open."""
    from .socket_server import SocketServer

    with SocketServer() as server:
        slack.socket_url = server.url
        yield server


def _command_environment(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """The environment a command is run with: this one without its LOSSGUARD_* settings (the
    developer's own must not leak into a test), then `env` added (None: removed)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOSSGUARD_")}
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return full


def run_lossguard(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`lossguard ARGS` in a real process, as a user runs it; `env` adds to (or, with None values,
    removes from) the environment."""
    return subprocess.run([sys.executable, "-m", "lossguard.cli", *args], capture_output=True, text=True,
                          env=_command_environment(env), timeout=timeout)


class DaemonWouldStart(BaseException):
    """`watch` got past its checks in run_lossguard_in_process: a daemon must run as a process of
    its own (run_lossguard), never inside a test worker. A BaseException, so the command's own
    error boundary (which turns any Exception into exit 3) cannot swallow it."""


def run_lossguard_in_process(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """`lossguard ARGS` as run_lossguard gives it (exit code, stdout, stderr), run by
    `lossguard.cli.main` in this process with the same environment: for the many user errors whose
    one line is the point, where an interpreter start and its imports (0.5-1 s each) are most of
    the test's time. The exit code contract in a real process stays pinned by run_lossguard's cases.

    The environment, the `lossguard` logger and the secrets remembered for scrubbing are restored
    afterwards, so nothing of one case leaks into the next; the working folder is left as it is (as
    run_lossguard leaves it). `watch` runs only up to its checks: a case that would start the
    daemon fails with DaemonWouldStart."""
    from lossguard import redact
    from lossguard.cli import main

    if args[:1] == ("watch",):
        # polars sizes its pool once, from the environment it is first imported in: by this
        # process's, not by the POLARS_MAX_THREADS (1) that `watch` sets for its daemon.
        import polars  # noqa: F401

    out, err = io.StringIO(), io.StringIO()
    with _isolated(_command_environment(env)), mock.patch("lossguard.cli.watch._sinks", side_effect=_refuse_daemon), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        known = set(redact._known)
        try:
            code = main(list(args))
        except SystemExit as exc:  # (argparse's own usage errors, --help, --version)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            redact._known.clear()
            redact._known.update(known)
    return subprocess.CompletedProcess(["lossguard", *args], code, out.getvalue(), err.getvalue())


def _refuse_daemon(*_: object, **__: object) -> None:
    raise DaemonWouldStart("watch passed its checks and would start the daemon: run this case with run_lossguard")


@contextlib.contextmanager
def _isolated(environment: dict[str, str]) -> Iterator[None]:
    """os.environ set to `environment`, and what a command may change for the process (the
    environment, the `lossguard` logger `watch` sets up) put back as it was."""
    saved_env = dict(os.environ)
    loggers = [logging.getLogger(name) for name in ("lossguard", "apscheduler")]
    saved_loggers = [(logger, list(logger.handlers), logger.level) for logger in loggers]
    os.environ.clear()
    os.environ.update(environment)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        for logger, handlers, level in saved_loggers:
            logger.handlers[:] = handlers
            logger.setLevel(level)


def assert_one_error_line(res: subprocess.CompletedProcess, *names: str) -> str:
    """The exit code contract for a user error: exit 2 and exactly one line on stderr, naming each of
    `names` (the file, the setting, the rule), never a traceback. Returns that line."""
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]
