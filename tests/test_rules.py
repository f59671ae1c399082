"""Rules files: the packaged defaults and presets load; a bad file is refused with the file, the
rule's name and the field, in words a user understands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lossguard.errors import ConfigError
from lossguard.detection.rules import load_rules, preset_names

from .conftest import assert_one_error_line, run_lossguard, run_lossguard_in_process

REPO = Path(__file__).parent.parent


def test_repo_default_rules_are_the_packaged_ones():
    assert (REPO / "rules/default.toml").read_text() == (REPO / "lossguard/data/default.toml").read_text()
    for preset in (REPO / "rules/presets").glob("*.toml"):
        assert preset.read_text() == (REPO / "lossguard/data/presets" / preset.name).read_text()


def test_default_rules_are_the_seed_rule_plus_nonfinite_guards():
    rules = {r.name: r for r in load_rules(None).rules}
    spike = rules["loss-spike"]
    assert (spike.kind, spike.factor, spike.window, spike.history, spike.baseline) == ("ratio", 2.0, 9, 10, "mean")
    assert rules["loss-nonfinite"].metric == "loss" and rules["grad-norm-nonfinite"].metric == "grad_norm"


def test_a_slope_rule_needs_only_a_name_and_a_metric(tmp_path):
    path = tmp_path / "creep.toml"
    path.write_text('[[rule]]\nname = "creep"\nmetric = "loss"\nkind = "slope"\n')
    (creep,) = load_rules([path]).rules
    assert (creep.window, creep.rate, creep.history, creep.lookback) == (50, 0.01, 50, 49)


@pytest.mark.parametrize("name", ["llm-foundry", "olmo-core", "lightning", "metaseq", "megatron"])
def test_every_preset_loads_by_path_and_by_name(name):
    by_path = load_rules([REPO / "rules/presets" / f"{name}.toml"])
    by_name = load_rules([Path(name)])
    assert [r.name for r in by_path.rules] == [r.name for r in by_name.rules]
    assert name in preset_names()


def test_a_folder_of_rules_files_is_all_of_them(tmp_path):
    (tmp_path / "a.toml").write_text('[[rule]]\nname = "a"\nmetric = "loss"\nkind = "nonfinite"\n')
    (tmp_path / "b.toml").write_text('[[rule]]\nname = "b"\nmetric = "lr"\nkind = "threshold"\nabove = 1.0\n')
    assert [r.name for r in load_rules([tmp_path]).rules] == ["a", "b"]


@pytest.mark.parametrize(
    "body,expected",
    [
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratoi"\n', "rule 'x': unknown kind 'ratoi'; one of: ratio, zscore", id="unknown kind"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratio"\nwindow = -3\n', "rule 'x': window: Input should be greater than or equal to 1 (got -3)", id="negative window"),
        pytest.param('name = "x"\nmetric = "los"\nkind = "ratio"\n', "rule 'x': metric: unknown metric 'los'; one of: loss, eval_loss", id="unknown metric"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratio"\nfactr = 2\n', "rule 'x': unknown field `factr`", id="typo in a field"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "threshold"\n', "rule 'x': set exactly one of `above` or `below`", id="threshold without bound"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratio"\nseverity = "loud"\n', "rule 'x': severity: Input should be 'info', 'warning' or 'critical'", id="bad severity"),
        pytest.param('metric = "loss"\nkind = "ratio"\n', "rule '#1': name: Field required", id="no name"),
        pytest.param('name = "x"\nmetric = "loss"\n', "rule 'x': missing `kind`", id="no kind"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratio"\nwindow = 2.5\n', "rule 'x': window: Input should be a valid integer (got 2.5)", id="fractional window"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ewm"\nalpha = 0\nfactor = true\n', "rule 'x': factor: Input should be a valid number (got True); alpha: Input should be greater than or equal to 1e-06 (got 0)", id="every problem at once"),
        pytest.param('name = ""\nmetric = "loss"\nkind = "nonfinite"\n', "name: String should have at least 1 character", id="empty name"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nwindow = 2\n', "rule 'x': window: Input should be greater than or equal to 3 (got 2)", id="slope over two points"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nrate = 0\n', "rule 'x': rate: Input should be greater than 0 (got 0)", id="slope rate zero"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nrate = "fast"\n', "rule 'x': rate: Input should be a valid number (got 'fast')", id="slope rate not a number"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ewm"\nalpha = 1e-300\n', "rule 'x': alpha: Input should be greater than or equal to 1e-06 (got 1e-300)", id="ewm alpha that underflows"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratio"\nfactor = inf\n', "rule 'x': factor: Input should be a finite number (got inf)", id="infinite factor"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "threshold"\nabove = nan\n', "rule 'x': above: Input should be a finite number (got nan)", id="nan bound"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "threshold"\nbelow = -inf\n', "rule 'x': below: Input should be a finite number (got -inf)", id="bound at -inf"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "zscore"\nk = 1' + "0" * 400 + "\n", "rule 'x': k: Input should be a finite number (got 1000000000000000000000000000000000000...)", id="integer too large for a float"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "sustained"\npatience = 10000000000000000000000\n', "rule 'x': patience: Input should be less than or equal to 1000000000", id="patience beyond any run"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ratio"\ncooldown = 100000000000000000000\n', "rule 'x': cooldown: Input should be less than or equal to 9223372036854775807", id="cooldown beyond Int64 steps"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nrate = nan\n', "rule 'x': rate: Input should be a finite number (got nan)", id="slope rate nan"),
    ],
)
def test_bad_rule_is_refused_with_file_rule_and_field(tmp_path, body, expected):
    path = tmp_path / "mine.toml"
    path.write_text("[[rule]]\n" + body)
    with pytest.raises(ConfigError) as info:
        load_rules([path])
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_duplicate_rule_names_are_refused(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[[rule]]\nname = "a"\nmetric = "loss"\nkind = "nonfinite"\n' * 2)
    with pytest.raises(ConfigError, match="rule 'a': a rule of that name is already defined"):
        load_rules([path])


def test_rules_file_with_expressions_is_data_not_code(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[[rule]]\nname = "a"\nmetric = "loss"\nkind = "ratio"\nfactor = "__import__(\'os\').system(\'false\')"\n')
    with pytest.raises(ConfigError, match="factor: Input should be a valid number"):
        load_rules([path])


def test_missing_rules_file_and_empty_folder(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_rules([tmp_path / "nope.toml"])
    with pytest.raises(ConfigError, match="no \\*.toml rules files"):
        load_rules([tmp_path])


@pytest.mark.parametrize("text", ["", "# rules to come\n\n# none yet\n"], ids=["empty", "comments only"])
def test_a_rules_file_without_rules_is_refused(tmp_path, text):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: no rules in this file"):
        load_rules([path])


def test_the_smallest_ewm_alpha_gives_a_finite_lookback(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[[rule]]\nname = "slow"\nmetric = "loss"\nkind = "ewm"\nalpha = 1e-6\n')
    (rule,) = load_rules([path]).rules
    assert rule.lookback == 9_210_336 and rule.history == 2_000_000


@pytest.mark.parametrize(
    "command",
    [["scan", "{runs}", "--rules", "{rules}"], ["watch", "{runs}", "--rules", "{rules}", "--state-dir", "{state}"]],
    ids=["scan", "watch"],
)
@pytest.mark.parametrize(
    "body,field",
    [
        pytest.param('kind = "ewm"\nalpha = 1e-300\n', "alpha", id="ewm alpha 1e-300"),
        pytest.param('kind = "ratio"\nfactor = inf\n', "factor", id="factor inf"),
        pytest.param('kind = "threshold"\nabove = nan\n', "above", id="above nan"),
        pytest.param(None, "no rules in this file", id="comments only"),
    ],
)
def test_rules_that_would_break_detection_stop_the_command_with_one_line(tmp_path, command, body, field):
    rules = tmp_path / "mine.toml"
    rules.write_text("# nothing yet\n" if body is None else '[[rule]]\nname = "bad"\nmetric = "loss"\n' + body)
    args = [a.format(runs=REPO / "tests/fixtures/runs/tb-clean", rules=rules, state=tmp_path / "state") for a in command]
    run = run_lossguard if body is None else run_lossguard_in_process  # (one case of each command in a real process)
    res = run(*args)
    assert_one_error_line(res, str(rules), field, *(["rule 'bad'"] if body else []))
