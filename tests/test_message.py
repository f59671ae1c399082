"""Block building, purely: content, escaping of everything that came from a log or a path, limits."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lossguard.alerts.message import MAX_SECTION, MAX_TEXT, build, cut_lines, escape
from lossguard.detection.engine import analyse_run
from lossguard.model import Cause
from lossguard.detection.rules import default_rules

from . import synth


def _incident(run="exp/7b"):
    return next(i for i in analyse_run(synth.long_frame("gradient_explosion"), default_rules(), run=run).incidents if i.metric == "loss")


def _mrkdwn_texts(message):
    out = [message.text]
    for block in message.blocks:
        if block["type"] == "section":
            out.append(block["text"]["text"])
        if block["type"] == "context":
            out += [e["text"] for e in block["elements"] if e["type"] == "mrkdwn"]
    return out


def test_message_has_the_facts_the_on_call_engineer_needs():
    inc = _incident()
    msg = build(inc, host="gpu-3", source="/runs/exp/7b/train.log", spark=(1.0, 1.1, 5.0, 1.2), version="0.1.0")
    assert "exp/7b" in msg.text and "step 701" in msg.text
    assert "gradient explosion" in msg.text and "max_norm=1.0" in msg.text
    body = json.dumps(msg.blocks, ensure_ascii=False)
    assert "*step 701*" in body and f"{inc.ratio:.1f}×" in body and "Gradient explosion" in body and "▁" in body
    assert "gpu-3" in body and "/runs/exp/7b/train.log" in body
    assert msg.blocks[0]["type"] == "header" and msg.blocks[0]["text"]["type"] == "plain_text"


@pytest.mark.parametrize("run", ["<!channel>", "<http://evil.example|click me>", "a & b <@U123>"])
def test_user_strings_cannot_ping_or_forge_links(run):
    inc = replace(_incident(run=run), causes=(Cause("bad_batch", 0.5, f"odd tag <!here> in {run}", "look at <#C123>"),))
    msg = build(inc, host="<!everyone>", source=f"/runs/{run}/x.log")
    for text in _mrkdwn_texts(msg):
        assert "<!" not in text and "<http" not in text and "<@" not in text and "<#" not in text
        assert "&lt;" in text or run not in text
    assert escape(run) in msg.text
    # plain_text shows the run literally (Slack does not parse it there).
    assert run in msg.blocks[0]["text"]["text"]


def test_backtick_in_a_path_cannot_end_the_code_span_early():
    msg = build(_incident(run="a`b"), host="h", source="/x/`rm -rf`/log")
    context = msg.blocks[-1]["elements"][0]["text"]
    assert context.count("`") % 2 == 0 and "rm -rf" in context


def test_limits_are_respected_by_cutting_at_whole_lines():
    long_causes = tuple(Cause("unknown", 0.1, "evidence line " * 40, "try " * 30) for _ in range(60))
    msg = build(replace(_incident(), causes=long_causes), host="h", source="s")
    assert len(msg.blocks) <= 50
    sections = [b["text"]["text"] for b in msg.blocks if b["type"] == "section"]
    assert all(len(t) <= MAX_SECTION for t in sections)
    (causes,) = [t for t in sections if "Unknown" in t]
    assert causes.endswith("\n…") and causes.count("\n") > 10
    assert len(msg.text) <= MAX_TEXT


def test_cut_lines_keeps_whole_lines_and_closes_code_spans():
    text = "\n".join(f"line {i} `code {i}`" for i in range(1000))
    cut = cut_lines(text, 200)
    assert len(cut) <= 200 and cut.endswith("\n…")
    assert all(line.count("`") % 2 == 0 for line in cut.splitlines())
    one = "x" * 50 + "`" + "y" * 500
    cut = cut_lines(one, 100)
    assert len(cut) <= 100 and cut.count("`") % 2 == 0


def test_resolved_message_says_so():
    inc = _incident()
    msg = build(inc, event="resolved", host="h", source="s")
    assert msg.text.splitlines()[0].endswith("- resolved") and "Resolved" in msg.blocks[0]["text"]["text"]


@pytest.mark.parametrize("event", ["opened", "resolved"])
def test_a_divergence_alert_says_divergence_against_the_loss_minimum_and_a_grad_norm_escalation_keeps_its_title(event):
    inc = replace(_incident(), rule="loss-divergence", kind="divergence")
    msg = build(inc, event=event, host="h", source="s")
    header = msg.blocks[0]["text"]["text"]
    assert "loss divergence" in header and "spike" not in header
    assert "loss divergence at step 701" in msg.text and "vs its recent minimum" in msg.text
    assert "vs its recent minimum" in json.dumps(msg.blocks, ensure_ascii=False)
    escalated = build(inc, event="escalated", host="h", source="s")
    assert "the loss followed the grad-norm spike" in escalated.blocks[0]["text"]["text"]


def test_a_burst_summary_says_what_each_member_is():
    from lossguard.alerts.message import summary
    from lossguard.model import Notice

    spike = _incident("a")
    diverged = replace(_incident("b"), kind="divergence")
    crashed = replace(_incident("c"), kind="crash", rule="crash-cuda-oom", error="CUDA out of memory")
    text = summary(tuple(Notice("opened", i.run, incident=i) for i in (spike, diverged, crashed))).text
    assert "`a`: loss spike at step" in text and "`b`: loss divergence at step" in text and "`c`: crashed (CUDA out of memory) at step" in text
