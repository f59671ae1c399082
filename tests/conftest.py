from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def run_lossguard(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`lossguard ARGS` in a real process, as a user runs it; `env` adds to (or, with None values,
    removes from) the environment."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOSSGUARD_")}
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([sys.executable, "-m", "lossguard.cli", *args], capture_output=True, text=True, env=full, timeout=timeout)


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
