"""The README and docs/ are what a newcomer reads first: their links resolve, the README stays short,
its commands are ones the CLI takes, and its quickstart does what it says (the sample scan's exit
code and output, the local stand-in for Slack), so the documents cannot drift from the program."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lossguard.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but for - and _, spaces as -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _code_blocks(text: str, lang: str = "sh") -> list[str]:
    """The fenced blocks whose info string is `lang` ("" for a bare fence), in order."""
    blocks, current, info = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
            else:
                if info == lang:
                    blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands(text: str) -> list[str]:
    """The lines of the README's shell blocks that run lossguard, comments cut off."""
    out = []
    for block in _code_blocks(text):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if "lossguard " in line and not line.startswith(("pip", "python", "export", "#")):
                out.append(line[line.index("lossguard "):])
    return out


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves_to_a_file_and_heading(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:, javascript: inside an escaping example
            continue
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            broken.append(target)
        elif anchor and (where.suffix != ".md" or anchor not in _anchors(where)):
            broken.append(target)
    assert not broken, f"{doc.name}: {broken}"


def test_the_readme_is_short_and_its_first_screen_shows_install_scan_and_watch():
    lines = README.read_text().splitlines()
    assert len(lines) <= 400, len(lines)
    first = "\n".join(lines[:60])
    for shown in ("pip install", "lossguard scan", "lossguard watch"):
        assert shown in first, shown


def test_every_document_links_from_the_readme():
    linked = set(re.findall(r"\(docs/([\w-]+\.md)", README.read_text()))
    assert linked == {p.name for p in DOCS}


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_the_documents_speak_of_the_project_alone(doc):
    # History belongs to git log: no sittings, helpers or issue numbers. A Slack or HTTP session is
    # the only session a user meets.
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if re.search(r"\bsessions?\b", line, re.I):
            assert re.search(r"slack|http|requests", line, re.I), f"{doc.name}:{n}: {line}"
        assert not re.search(r"\bissue \d+|\bhelper'?s?\b|\breviewers?\b", line, re.I), f"{doc.name}:{n}: {line}"


def test_every_lossguard_command_in_the_readme_is_one_the_cli_takes():
    commands = _commands(README.read_text())
    assert len(commands) >= 6, commands
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:  # argparse's way of refusing
            pytest.fail(f"the README's `{command}` is refused by the CLI (exit {exc.code})")


def test_the_readmes_first_scan_exits_1_and_prints_the_sample_shown():
    text = README.read_text()
    first = _code_blocks(text)[0]
    command = re.search(r"&& (lossguard scan \S+)$", first, re.M).group(1)
    res = subprocess.run([sys.executable, "-m", "lossguard.cli", *shlex.split(command)[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    printed = {line.rstrip() for line in res.stdout.splitlines()}
    sample = _code_blocks(text, lang="")[0]
    for line in sample.splitlines():
        assert line.rstrip() in printed, line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readmes_local_slack_tryout_delivers_the_test_message():
    block = next(b for b in _code_blocks(README.read_text()) if "slack_server.py" in b)
    lines = [line.split(" #")[0].strip() for line in block.splitlines()]
    port = str(_free_port())
    server_line = next(line for line in lines if "slack_server.py" in line).rstrip("&").strip()
    server_args = shlex.split(server_line.replace("8765", port))
    exports = dict(kv.split("=", 1) for line in lines if line.startswith("export ") for kv in shlex.split(line)[1:])
    exports = {k: v.replace("8765", port) for k, v in exports.items()}
    assert {"LOSSGUARD_SLACK_BASE_URL", "LOSSGUARD_SLACK_TOKEN", "LOSSGUARD_SLACK_CHANNEL"} <= set(exports)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSGUARD_") and "proxy" not in k.lower()}
    server = subprocess.Popen([sys.executable, *server_args[1:]], cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert "answering like Slack" in server.stdout.readline()
        command = next(line for line in lines if line.startswith("lossguard "))
        res = subprocess.run([sys.executable, "-m", "lossguard.cli", *shlex.split(command)[1:]], cwd=REPO, capture_output=True, text=True, env={**env, **exports}, timeout=60)
        assert res.returncode == 0, res.stderr
        assert "delivered" in res.stdout
        deadline = time.monotonic() + 10
        got = server.stdout.readline()
        while "chat.postMessage" not in got and time.monotonic() < deadline:
            got = server.stdout.readline()
        assert got.startswith("/api/chat.postMessage: lossguard test message"), got
    finally:
        server.kill()
        server.wait()
