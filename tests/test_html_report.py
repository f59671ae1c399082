"""The HTML report as a person opens it: one self-contained file, rendered by a real headless browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from lossguard.cli import main

from .conftest import FIXTURES

RUNS = FIXTURES / "runs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _report(tmp_path):
    out = tmp_path / "report.html"
    assert main(["scan", str(RUNS), "--format", "html", "--output", str(out), "--quiet"]) == 1
    return out


def test_html_report_needs_no_network(tmp_path):
    text = _report(tmp_path).read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    assert "<script src" not in text and "<link" not in text
    assert text.count("<svg") >= 3 * 6  # loss (linear and log), lr and grad norm per run with spikes
    assert 'class="mark"' in text  # incidents are marked on the plots
    assert "gradient_explosion" in text and "max_norm=1.0" in text


def test_html_escapes_run_names(tmp_path):
    run = tmp_path / "runs" / "<img src=x onerror=alert(1)>"
    shutil.copytree(RUNS / "lightning-bad-batch", run)
    out = tmp_path / "r.html"
    main(["scan", str(tmp_path / "runs"), "--format", "html", "--output", str(out), "--quiet"])
    text = out.read_text()
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_html_report_renders_in_a_headless_browser(tmp_path):
    report = _report(tmp_path)
    shot = tmp_path / "shot.png"
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    # What the browser built from the file: the summary, a plot per panel, and the evidence.
    headline = re.search(r"<h1>(lossguard scan: \d+ spike\(s\) in \d+ of \d+ run\(s\))</h1>", report.read_text()).group(1)
    assert headline in dom.stdout
    assert dom.stdout.count("<svg") >= 18
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,2000", report.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # a rendered page, not a blank one
