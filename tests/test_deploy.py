"""Deployment: the systemd units pass systemd-analyze (and are hardened), install.sh installs,
upgrades without touching a user's config and uninstalls, and `config check` validates and masks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lossguard.cli import main
from lossguard.watch.settings import Settings

from .conftest import assert_one_error_line, run_lossguard, run_lossguard_in_process

REPO = Path(__file__).parent.parent
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (.ci/run installs it)")


def _install_env() -> dict[str, str]:
    """install.sh run as a packager runs it, with this interpreter; pip installs lossguard alone
    (PIP_NO_DEPS). What install.sh owns is tested: the venv where the units look for it, the
    program built from this checkout and installed into it, the rewritten scripts, the config,
    credentials and units. Pulling the dependencies into that venv was pip's work, 400 MB of wheels
    unpacked (15-60 s of this suite); that pyproject's dependencies resolve and install into a fresh
    venv is what .ci/run's own `pip install -e '.[test]'` proves before any test runs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # (a checkout on the path would hide the installed package)
    return {**env, "PYTHON": sys.executable, "PIP_NO_DEPS": "1"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    done = subprocess.run(["bash", str(REPO / "deploy/install.sh"), "--root", str(root)], capture_output=True, text=True, env=_install_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, done.stdout


def test_install_into_a_root_writes_program_config_credential_and_units(installed):
    root, out = installed
    assert (root / "opt/lossguard/venv/bin/lossguard").exists()
    assert (root / "etc/lossguard/lossguard.toml").read_text() == (REPO / "deploy/lossguard.toml").read_text()
    for credential in ("slack_token", "slack_app_token", "slack_webhook_url", "alertmanager_password", "alertmanager_bearer_token", "notify_urls"):
        token = root / "etc/lossguard" / credential
        assert token.exists() and token.stat().st_size == 0 and oct(token.stat().st_mode & 0o777) == "0o600"
        assert f"LoadCredential={credential}:/etc/lossguard/{credential}" in (REPO / "systemd/lossguard.service").read_text()
    for unit in ("lossguard.service", "lossguard-scan.service", "lossguard-scan.timer"):
        assert (root / "etc/systemd/system" / unit).read_text() == (REPO / "systemd" / unit).read_text()
    assert "Two steps remain" in out and "systemctl enable --now lossguard.service" in out
    assert oct((root / "etc/lossguard/lossguard.toml").stat().st_mode & 0o777) == "0o640"  # it may hold a token
    # Staged for a package: the scripts name where the venv will live, not the staging folder.
    script = root / "opt/lossguard/venv/bin/lossguard"
    assert script.read_text().splitlines()[0] == "#!/opt/lossguard/venv/bin/python"
    assert str(root) not in "".join(f.read_text(errors="replace") for f in (root / "opt/lossguard/venv/bin").iterdir() if f.is_file())
    # Run outside this checkout: `-m` and `-c` put the current folder first on the path.
    staged = root / "opt/lossguard/venv/bin/python"
    ran = subprocess.run([str(staged), "-m", "lossguard.cli", "--version"], capture_output=True, text=True, env=_install_env(), cwd=root)
    assert ran.returncode == 0 and ran.stdout.startswith("lossguard "), ran.stderr
    where = subprocess.run([str(staged), "-c", "import lossguard; print(lossguard.__file__)"], capture_output=True, text=True, env=_install_env(), cwd=root)
    assert where.stdout.startswith(str(root / "opt/lossguard/venv/lib/")), where.stdout + where.stderr  # the installed copy, not this checkout


@needs_analyze
def test_units_pass_systemd_analyze_verify(installed, tmp_path):
    root, _ = installed
    # Point ExecStart at the program installed into the temporary root: verify checks it exists.
    for unit in (REPO / "systemd").iterdir():
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/lossguard", str(root / "opt/lossguard")))
    units = [str(tmp_path / n) for n in ("lossguard.service", "lossguard-scan.service", "lossguard-scan.timer")]
    done = subprocess.run([ANALYZE, "verify", *units], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


@needs_analyze
def test_service_exposure_is_at_most_2():
    done = subprocess.run([ANALYZE, "security", "--offline=true", str(REPO / "systemd/lossguard.service")], capture_output=True, text=True)
    match = re.search(r"Overall exposure level for lossguard.service: ([0-9.]+)", done.stdout)
    assert match, done.stdout[-2000:] + done.stderr[-2000:]
    assert float(match.group(1)) <= 2.0


def test_example_config_documents_every_setting_with_its_default():
    text = (REPO / "deploy/lossguard.toml").read_text()
    data = tomllib.loads(text)
    for name, field in Settings.model_fields.items():
        table = next((t for t in ("slack", "alertmanager", "notify") if name.startswith(f"{t}_")), None)
        key = name.removeprefix(f"{table}_") if table else name
        documented = re.search(rf"^#? ?{re.escape(key)} =", text, re.M)
        assert documented, f"deploy/lossguard.toml does not mention {name}"
        value = data.get(table, {}).get(key) if table else data.get(name)
        if value is not None and not field.is_required() and not callable(field.default_factory):
            assert value == field.default, name


def test_config_check_prints_the_effective_settings_with_secrets_masked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOSSGUARD_SLACK_TOKEN", "xoxb-very-secret")
    config = tmp_path / "lossguard.toml"
    config.write_text('paths = ["/data/runs"]\npoll_interval = 5\n[slack]\nchannel = "#alerts"\n')
    assert main(["config", "check", "--config", str(config)]) == 0
    out = capsys.readouterr()
    assert "xoxb-very-secret" not in out.out + out.err
    assert re.search(r"slack_token\s+\*+ \(set\)", out.out) and re.search(r"poll_interval\s+5.0", out.out)
    assert re.search(r"slack_channel\s+#alerts", out.out) and "rules (loaded)" in out.out
    assert "/data/runs" in out.err  # does not exist here: a warning, not an error


@pytest.mark.parametrize(
    "body,message",
    [
        pytest.param("pol_interval = 5\n", "unknown setting(s): pol_interval", id="typo"),
        pytest.param("poll_interval = -1\n", "poll_interval", id="negative interval"),
        pytest.param('rules = ["nope.toml"]\n', "nope.toml: no such file", id="missing rules"),
        pytest.param("[slack]\nchanel = 'x'\n", "slack.chanel", id="slack typo"),
    ],
)
def test_config_check_rejects_bad_configuration(tmp_path, body, message, capsys):
    config = tmp_path / "lossguard.toml"
    config.write_text(body)
    assert main(["config", "check", "--config", str(config)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["config", "check"], ["watch", "{runs}", "--state-dir", "{state}"]], ids=["config check", "watch"]
)
@pytest.mark.parametrize(
    "body,named",
    [
        pytest.param("formats = 5\n", ":1: formats: must be an array of tables", id="formats not a list"),
        pytest.param("# every 10 s\npoll_interval = inf\n", ":2: poll_interval: Input should be a finite number", id="poll interval inf"),
        pytest.param("poll_interval = 1e300\n", ":1: poll_interval: Input should be less than or equal to 86400", id="poll interval 1e300"),
        pytest.param('polling = "yes"\n', ':1: polling: must be a TOML boolean (true or false)', id="boolean as a string"),
        pytest.param('stall_after = "10"\n', ":1: stall_after: must be a TOML number", id="number as a string"),
        pytest.param('[slack]\nchannel = "#a"\nroutes = [{channel = 5}]\n', ":3: slack.routes[0].channel: Input should be a valid string", id="slack route field"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_file_line_and_setting(tmp_path, command, body, named):
    config = tmp_path / "lossguard.toml"
    config.write_text(body)
    args = [a.format(runs=REPO / "tests/fixtures/runs/tb-clean", state=tmp_path / "state") for a in command]
    # One case of each command in a real process (the exit code as a user sees it); the rest in this one.
    run = run_lossguard if body == "formats = 5\n" else run_lossguard_in_process
    res = run(*args, "--config", str(config))
    assert_one_error_line(res, f"{config}{named}")


@pytest.mark.parametrize(
    "variable,value,named",
    [
        pytest.param("LOSSGUARD_POLL_INTERVAL", "inf", "LOSSGUARD_POLL_INTERVAL: Input should be a finite number", id="interval"),
        pytest.param("LOSSGUARD_SLACK_ROUTES", "#alerts", "LOSSGUARD_SLACK_ROUTES: not valid JSON", id="routes not JSON"),
        pytest.param("LOSSGUARD_PATHS", "[/data", "LOSSGUARD_PATHS: not a JSON list of paths", id="paths half JSON"),
        pytest.param("LOSSGUARD_SLACK_BASE_URL", "http://slack.example.com/api/", "LOSSGUARD_SLACK_BASE_URL: must use https:// (plain http would send the bot token in clear) (got 'http://slack.example.com/api/')", id="base url in clear"),
        pytest.param("LOSSGUARD_SLACK_BASE_URL", "slack.com/api", "LOSSGUARD_SLACK_BASE_URL: must start with https:// (got 'slack.com/api')", id="base url no scheme"),
    ],
)
def test_a_bad_environment_variable_is_one_line_naming_it(variable, value, named):
    run = run_lossguard if variable == "LOSSGUARD_POLL_INTERVAL" else run_lossguard_in_process  # (one in a real process)
    assert_one_error_line(run("config", "check", env={variable: value}), named)


@pytest.mark.parametrize("value", ["{a}", "{a}:{b}", '["{a}", "{b}"]'], ids=["one path", "as PATH writes them", "JSON list"])
def test_paths_from_the_environment_are_one_path_or_a_list(tmp_path, value):
    a, b = tmp_path / "a", tmp_path / "b"
    run = run_lossguard if value == "{a}" else run_lossguard_in_process  # (one in a real process)
    res = run("config", "check", env={"LOSSGUARD_PATHS": value.format(a=a, b=b)})
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    expected = [str(a)] if value == "{a}" else [str(a), str(b)]
    assert re.search(r"^paths\s+(.*)$", res.stdout, re.M).group(1) == repr(expected)


def test_scan_reads_its_paths_from_the_config(tmp_path, capsys):
    config = tmp_path / "lossguard.toml"
    config.write_text(f'paths = ["{REPO / "tests/fixtures/runs/megatron-grad-explosion"}"]\n')
    assert main(["scan", "--config", str(config), "--format", "json", "--quiet"]) == 1
    assert '"gradient_explosion"' in capsys.readouterr().out


# Last: it uninstalls what the module's fixture installed.
def test_install_again_keeps_the_users_config_and_uninstall_keeps_config_and_state(installed, tmp_path):
    root, _ = installed
    config = root / "etc/lossguard/lossguard.toml"
    config.write_text(config.read_text() + "\n# mine\n")
    env = _install_env()
    again = subprocess.run(["bash", str(REPO / "deploy/install.sh"), "--root", str(root)], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and config.read_text().endswith("# mine\n")
    (root / "var/lib/lossguard").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/lossguard/state.db").write_text("x")
    gone = subprocess.run(["bash", str(REPO / "deploy/install.sh"), "--root", str(root), "--uninstall"], capture_output=True, text=True, env=env)
    assert gone.returncode == 0
    assert not (root / "opt/lossguard").exists() and not (root / "etc/systemd/system/lossguard.service").exists()
    assert config.exists() and (root / "var/lib/lossguard/state.db").exists()
    purge = subprocess.run(["bash", str(REPO / "deploy/install.sh"), "--root", str(root), "--uninstall", "--purge"], capture_output=True, text=True, env=env)
    assert purge.returncode == 0 and not config.exists() and not (root / "var/lib/lossguard").exists()


def test_the_service_raises_its_open_file_limit_above_systemds_1024():
    limits = re.findall(r"^LimitNOFILE=(\d+)$", (REPO / "systemd/lossguard.service").read_text(), re.M)
    assert len(limits) == 1 and int(limits[0]) >= 8192, limits


def test_ci_runs_the_readmes_test_command_verbatim():
    # What a contributor is told to run is what CI proves: the same extras, the same workers.
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^# Run the whole test suite.*\n(.+)$", readme, re.M).group(1)
    assert "pytest" in command and "-n " in command
    assert (REPO / ".ci/run").read_text().rstrip("\n").splitlines()[-1] == command
