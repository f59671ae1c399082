"""Rules files: the packaged defaults and presets load; a bad file is refused with the file, the
rule's name and the field, in words a user understands."""

from __future__ import annotations

from pathlib import Path

import pytest

from lossguard.errors import ConfigError
from lossguard.rules import load_rules, preset_names

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
        pytest.param('name = "x"\nmetric = "loss"\nkind = "ewm"\nalpha = 0\nfactor = true\n', "rule 'x': factor: Input should be a valid number (got True); alpha: Input should be greater than 0 (got 0)", id="every problem at once"),
        pytest.param('name = ""\nmetric = "loss"\nkind = "nonfinite"\n', "name: String should have at least 1 character", id="empty name"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nwindow = 2\n', "rule 'x': window: Input should be greater than or equal to 3 (got 2)", id="slope over two points"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nrate = 0\n', "rule 'x': rate: Input should be greater than 0 (got 0)", id="slope rate zero"),
        pytest.param('name = "x"\nmetric = "loss"\nkind = "slope"\nrate = "fast"\n', "rule 'x': rate: Input should be a valid number (got 'fast')", id="slope rate not a number"),
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
