"""The command line: every command documents itself with an example; `lossguard read` prints exactly
the canonical table."""

from __future__ import annotations

import json

import pytest

from lossguard.cli import build_parser, main

from .conftest import CORPUS


def _commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_has_help_with_an_example(name, capsys):
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Example:" in out and f"lossguard {name}" in out


def test_top_level_help_and_no_command(capsys):
    assert main([]) == 2
    assert "Example:" in capsys.readouterr().out


def test_read_csv_has_the_canonical_header_and_values(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 2.5, "lr": 0.001}\n{"step": 2, "loss": NaN}\n')
    assert main(["read", str(log), "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "run,source,step,metric,tag,value,wall_time"
    assert out[1] == f"metrics,{log},1,loss,loss,2.5,"
    assert out[2] == f"metrics,{log},1,lr,lr,0.001,"
    assert out[3] == f"metrics,{log},2,loss,loss,NaN,"


def test_read_json_is_one_object_per_row_with_nan_as_a_string(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": Infinity}\n')
    main(["read", str(log), "--format", "json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == {"run": "metrics", "source": str(log), "step": 1, "metric": "loss", "tag": "loss", "value": 2.5, "wall_time": None}
    assert rows[1]["value"] == "Infinity"


def test_read_table_filters_by_metric_and_shows_wall_time_for_event_files(capsys):
    main(["read", str(CORPUS / "tfevents/satd_hmer_lightning_lr_sgd"), "--metric", "lr"])
    lines = capsys.readouterr().out.splitlines()
    # The mapping block (every metric, whatever --metric keeps), a blank line, then the table.
    # (The run folder given is the run, named as it is: not ".".)
    assert lines[0] == "metrics (satd_hmer_lightning_lr_sgd): loss <- train_loss, eval_loss <- val_loss, lr <- lr-SGD" and lines[1] == ""
    lines = lines[2:]
    assert lines[0].split() == ["run", "source", "step", "metric", "tag", "value", "wall_time"]
    assert len(lines) == 241 and all(" lr-SGD " in line for line in lines[1:])
    assert float(lines[1].split()[-1]) > 1.6e9


def test_read_with_an_explicit_format_and_a_bad_one(tmp_path, capsys):
    log = tmp_path / "weird.dat"
    log.write_text("step 1 | loss: 3.0\nstep 2 | loss: 2.0\n")
    assert main(["read", str(log), "--log-format", "kv_lines", "--format", "csv"]) == 0
    assert capsys.readouterr().out.count("\n") == 3
    assert main(["read", str(log), "--log-format", "nope"]) == 2
    assert "unknown format 'nope'" in capsys.readouterr().err


def test_scan_log_format_forces_the_format_as_read_does(tmp_path, capsys):
    # A step and a metric no sniffer claims (no `loss` on the line): only a forced format reads it.
    (tmp_path / "train.log").write_text("step 1 | ce: 3.0\nstep 2 | ce: 2.9\nstep 3 | ce: 2.8\n")
    assert main(["scan", str(tmp_path), "--format", "json"]) == 2
    assert "no training metrics recognised" in capsys.readouterr().err
    assert main(["scan", str(tmp_path), "--format", "json", "--log-format", "kv_lines"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert (run["format"], run["first_step"], run["last_step"]) == ("kv_lines", 1, 3)
    assert main(["scan", str(tmp_path), "--log-format", "nope"]) == 2
    assert "unknown format 'nope'" in capsys.readouterr().err


def test_read_warns_about_unreadable_files_on_stderr_and_goes_on(tmp_path, capsys):
    (tmp_path / "good.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (tmp_path / "bad.jsonl").write_bytes(b"\x00\x01\x02")
    assert main(["read", str(tmp_path), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert "good.jsonl" in captured.out
    assert f"warning: {tmp_path / 'bad.jsonl'}: no training metrics recognised in this file" in captured.err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception):
        main(["--debug", "scan", str(tmp_path / "missing")])


# --- the edges a new user hits first -----------------------------------------------------------
def _sample_runs() -> str:
    from .conftest import FIXTURES

    return str(FIXTURES / "runs")


def test_a_run_glob_matching_nothing_says_so_and_names_the_runs_found():
    from .conftest import assert_one_error_line, run_lossguard

    line = assert_one_error_line(run_lossguard("scan", _sample_runs(), "--run", "x*"), "no run matches 'x*'")
    assert "runs found: hf-lr-too-high, jsonl-lr-restart" in line


def test_a_metric_no_run_logs_is_a_usage_error_naming_the_metrics_found():
    # (In this process: scan's one-line error in a real one is the run glob's case above.)
    from .conftest import assert_one_error_line, run_lossguard_in_process

    line = assert_one_error_line(run_lossguard_in_process("scan", _sample_runs(), "--metric", "gradnorm"), "'gradnorm'")
    assert "metrics found: eval_loss, grad_norm, loss" in line
    assert run_lossguard_in_process("scan", _sample_runs(), "--metric", "grad_norm", "--quiet").returncode == 1


def test_rules_default_by_name_the_presets_in_help_and_o_for_output(tmp_path):
    from .conftest import run_lossguard_in_process

    out = tmp_path / "r.txt"
    done = run_lossguard_in_process("scan", _sample_runs(), "--rules", "default", "-o", str(out), "--quiet")
    assert done.returncode == 1 and out.read_text().startswith("lossguard") and "rules: default (" in out.read_text()
    helped = run_lossguard_in_process("scan", "--help").stdout
    for preset in ("default", "lightning", "llm-foundry", "megatron", "metaseq", "olmo-core"):
        assert preset in helped


def test_read_of_a_folder_with_nothing_readable_exits_2(tmp_path):
    from .conftest import run_lossguard

    (tmp_path / "train.log").write_text("no metrics here\n")
    done = run_lossguard("read", str(tmp_path))
    assert done.returncode == 2 and "nothing readable under" in done.stderr.splitlines()[-1] and "Traceback" not in done.stderr


def test_read_of_a_folder_holding_no_log_at_all_exits_2_as_scan_does(tmp_path):
    # `read` printed a CSV header and exited 0, where `scan` of the same folder exits 2.
    from .conftest import run_lossguard, run_lossguard_in_process

    (tmp_path / "empty").mkdir()
    for command, run in (("read", run_lossguard), ("scan", run_lossguard_in_process)):  # (scan's real process: the run glob's case)
        res = run(command, str(tmp_path / "empty"))
        assert res.returncode == 2 and res.stderr.splitlines()[-1].endswith(f"no training logs found under {tmp_path / 'empty'}"), res.stderr
    csv = run_lossguard_in_process("read", str(tmp_path / "empty"), "--format", "csv")
    assert csv.returncode == 2 and csv.stdout == ""  # (no header before the error)


def test_status_of_an_empty_state_prints_no_dangling_colons(tmp_path):
    from lossguard.state import State

    from .conftest import run_lossguard

    State(tmp_path / "state").close()
    out = run_lossguard("status", "--state-dir", str(tmp_path / "state")).stdout.splitlines()
    assert out == ["following 0 file(s)", "0 open incident(s)", "0 undelivered notification(s)", "0 silence(s) in force"]


def test_without_config_the_first_lossguard_toml_found_is_used_and_config_check_says_which(tmp_path):
    from .conftest import run_lossguard

    home = tmp_path / "xdg"
    (home / "lossguard").mkdir(parents=True)
    (home / "lossguard" / "lossguard.toml").write_text("poll_interval = 7.0\n")
    env = {"XDG_CONFIG_HOME": str(home), "HOME": str(tmp_path)}
    import subprocess
    import sys

    def check(cwd):
        return subprocess.run([sys.executable, "-m", "lossguard", "config", "check"], capture_output=True, text=True, cwd=cwd,
                              env={**__import__("os").environ, **env}, timeout=60)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def setting(out: str, key: str) -> str:
        return next(line.split(None if key != "config file" else "  ", 1)[1].strip() for line in out.splitlines() if line.startswith(key + " "))

    out = check(elsewhere).stdout
    assert setting(out, "config file").startswith(f"{home / 'lossguard' / 'lossguard.toml'} (found") and setting(out, "poll_interval") == "7.0"
    (elsewhere / "lossguard.toml").write_text("poll_interval = 3.0\n")  # the current folder's comes first
    out = check(elsewhere).stdout
    assert setting(out, "config file").startswith("lossguard.toml (found") and setting(out, "poll_interval") == "3.0"
    assert setting(out, "state_dir").startswith(f"{tmp_path / '.local' / 'state' / 'lossguard'} (default")  # resolved, not None
    assert run_lossguard("config", "show").returncode == 2  # (one way to do it)


def test_shell_completion_completes_commands_and_each_commands_options_in_a_real_bash(tmp_path):
    import shutil
    import subprocess

    from .conftest import run_lossguard, run_lossguard_in_process

    script = tmp_path / "lossguard.bash"
    script.write_text(run_lossguard("completion", "bash").stdout)
    if shutil.which("bash") is None:
        pytest.skip("no bash here")

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        probe = f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _lossguard; printf "%s\\n" "${{COMPREPLY[@]}}"'
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30).stdout.split()

    assert complete("lossguard", "sc") == ["scan"]
    assert complete("lossguard", "o") == ["outbox"]
    assert complete("lossguard", "scan", "--fo") == ["--format"]
    assert complete("lossguard", "watch", "--st") == ["--stall-after", "--state-dir"]
    zsh = run_lossguard_in_process("completion", "zsh").stdout
    assert zsh.startswith("#compdef lossguard") and "bashcompinit" in zsh and "_lossguard()" in zsh


def test_every_option_of_every_command_says_what_it_does():
    import argparse

    from lossguard.cli import build_parser

    def parsers(parser: argparse.ArgumentParser, name: str = "lossguard"):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from parsers(sub, f"{name} {sub_name}")

    silent = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)) and not action.help
    ]
    assert silent == []
