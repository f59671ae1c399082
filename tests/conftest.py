from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
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
