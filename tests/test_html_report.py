"""The HTML report as a person opens it: one self-contained file, rendered by a real headless browser."""

from __future__ import annotations

import os
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
    # Its profile, crash reports and caches in this test's folder, not the user's home (shared by
    # every test beside it, and by the user's own browser).
    home = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env = {**os.environ, **home}
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report.as_uri()],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    # What the browser built from the file: the summary, a plot per panel, and the evidence.
    headline = re.search(r"<h1>(lossguard scan: \d+ finding\(s\) in \d+ of \d+ run\(s\)[^<]*)</h1>", report.read_text()).group(1)
    assert headline in dom.stdout
    assert dom.stdout.count("<svg") >= 18
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,2000", report.as_uri()],
        capture_output=True, timeout=120, check=True, env=env,
    )
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # a rendered page, not a blank one


# --- what a person reading the plots relies on -----------------------------------------------------
def test_ticks_are_round_1_2_5_steps_with_labels_that_differ():
    from lossguard.report.svg import labels, nice_ticks

    assert nice_ticks(0.0, 1200.0, 6) == [0, 200, 400, 600, 800, 1000, 1200]
    assert nice_ticks(1.93, 2.61, 4) == [2.0, 2.2, 2.4, 2.6]
    assert nice_ticks(1.5e-4, 3.05e-4, 4) == [1.5e-4, 2e-4, 2.5e-4, 3e-4]
    for lo, hi in ((1.93, 2.61), (1.5e-4, 3.05e-4), (0.0, 1200.0), (2.001, 2.0013), (1e5, 4.2e5)):
        ticks = nice_ticks(lo, hi, 4)
        steps = {round(b - a, 15) for a, b in zip(ticks, ticks[1:])}
        assert len(steps) == 1 and f"{steps.pop():.0e}"[0] in "125"
        shown = labels(ticks)
        assert len(set(shown)) == len(shown), shown  # no two ticks read the same
    assert labels([1.5e-4, 2e-4, 2.5e-4, 3e-4]) == ["1.5e-4", "2e-4", "2.5e-4", "3e-4"]


def test_a_constant_series_is_a_flat_line_on_an_axis_around_its_value():
    from lossguard.report.svg import panel, y_range

    lo, hi = y_range([3e-4] * 100)
    assert lo < 3e-4 < hi and hi - lo < 1e-3  # not -1..1
    drawn = panel(list(range(100)), [3e-4] * 100, title="lr", x_range=(0, 99))
    assert "3e-4" in re.findall(r'class="ytick"[^>]*>([^<]+)<', drawn)


def test_the_line_breaks_where_logged_steps_have_a_gap():
    from lossguard.report.svg import panel

    steps = [*range(0, 100), *range(500, 600)]
    drawn = panel(steps, [2.0 + (s % 3) * 0.1 for s in steps], title="loss", x_range=(0, 599))
    path = re.search(r'class="line"[^>]* d="([^"]+)"', drawn).group(1)
    assert path.count("M") == 2  # two stretches, nothing drawn across 100..500


def test_a_late_small_spike_is_not_flattened_by_the_warmup():
    from lossguard.report.svg import y_range

    losses = [10.0 - 8.0 * min(1.0, s / 100) for s in range(1000)]  # 10 -> 2 over the warm-up
    losses[800] = 2.2  # 1.1x
    lo, hi = y_range(losses, keep=[2.2])
    assert hi < 3.0 and lo > 1.5  # the spike spans a good part of the panel


def test_the_report_has_axis_titles_a_loss_scale_panel_one_card_per_story_and_no_dangling_links(tmp_path):
    text = _report(tmp_path).read_text()
    assert text.count(">step</text>") >= 18 and '<text class="axis" transform' in text
    overflow = text[text.index(">megatron-fp16-overflow <"):text.index(">megatron-grad-explosion <")]
    assert "loss_scale (log)" in overflow  # the fp16 run's loss scale is drawn
    assert overflow.count('<div class="inc') == 1 and "grad-norm-nonfinite, loss-nonfinite, loss-spike" in overflow
    links = set(re.findall(r'href="#([^"]+)"', text))
    ids = set(re.findall(r' id="([^"]+)"', text))
    assert links and links <= ids
    assert ">nanogpt-clean<" in text and 'href="#nanogpt-clean"' not in text  # no section, no link
    explosion = text[text.index(">megatron-grad-explosion <"):]
    card_plot = explosion.split('<div class="inc')[1].split("</svg>")[0]
    zoom = re.findall(r'class="xtick"[^>]*>(\d+)<', card_plot)
    assert zoom and 600 < int(zoom[0]) < 700 and int(zoom[-1]) < 800  # the card zooms to the incident
