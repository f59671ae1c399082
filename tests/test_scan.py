"""`lossguard scan` as a user runs it: on the sample runs, on bad input, in every output format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.cli import main

from .conftest import FIXTURES

RUNS = FIXTURES / "runs"
sys.path.insert(0, str(FIXTURES))
import make_runs  # noqa: E402


def lossguard(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return subprocess.run([sys.executable, "-m", "lossguard.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def scan_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["scan", *args, "--format", "json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


def test_sample_runs_are_labelled_with_the_causes_they_were_made_with(capsys):
    code, doc = scan_json(capsys, str(RUNS))
    assert code == 1
    runs = {r["run"]: r for r in doc["runs"]}
    assert set(runs) == set(make_runs.EXPECTED)
    for run, cause in make_runs.EXPECTED.items():
        spikes = [s for s in runs[run]["spikes"] if s["metric"] == "loss"]
        if cause is None:
            assert spikes == [], run
        else:
            assert spikes[0]["causes"][0]["cause"] == cause, run


def test_sample_runs_script_rebuilds_the_shipped_runs(tmp_path, capsys):
    make_runs.main(tmp_path / "runs")
    _, fresh = scan_json(capsys, str(tmp_path / "runs"))
    _, shipped = scan_json(capsys, str(RUNS))

    def essence(doc):
        return [(r["run"], r["format"], r["steps"], [(s["rule"], s["step"], s["causes"][0]["cause"]) for s in r["spikes"]]) for r in doc["runs"]]

    assert essence(fresh) == essence(shipped)


def test_json_report_is_stable_and_documented(capsys):
    _, doc = scan_json(capsys, str(RUNS))
    assert set(doc) == {"lossguard_version", "rules", "runs", "warnings", "summary"}
    run = next(r for r in doc["runs"] if r["run"] == "megatron-grad-explosion")
    assert set(run) == {"run", "source", "format", "metrics", "steps", "first_step", "last_step", "spikes", "warnings"}
    assert run["source"].endswith("megatron-grad-explosion/train.log")
    assert run["metrics"] == {"loss": "lm loss", "lr": "learning rate", "grad_norm": "grad norm", "step_time": "elapsed time per iteration (ms)"}
    grad, spike = run["spikes"]  # the grad norm warned a step before the loss followed
    assert (grad["rule"], grad["step"], spike["rule"]) == ("grad-norm-spike", 700, "loss-spike")
    assert set(grad) == {"run", "metric", "rule", "kind", "severity", "step", "peak_step", "end_step", "value", "baseline", "threshold", "ratio", "points", "causes"}
    assert set(spike) == set(grad) | {"follows"} and spike["follows"] == {"rule": "grad-norm-spike", "step": 700}  # the same trouble, grown
    assert spike["step"] == 701 and spike["end_step"] == 705 and spike["ratio"] > 2
    assert doc["summary"]["spikes"] == sum(len(r["spikes"]) for r in doc["runs"])
    nan_spike = next(s for r in doc["runs"] for s in r["spikes"] if s["rule"] == "loss-nonfinite")
    assert nan_spike["value"] == "NaN"


def test_run_names_are_relative_to_the_path_given(capsys):
    _, doc = scan_json(capsys, str(RUNS / "lightning-bad-batch"))
    assert [r["run"] for r in doc["runs"]] == ["version_0"]


def test_table_on_a_pipe_has_no_colour_and_no_progress():
    res = lossguard("scan", str(RUNS))
    assert res.returncode == 1
    assert "\x1b[" not in res.stdout and res.stderr == ""
    assert "megatron-grad-explosion" in res.stdout and "gradient_explosion" in res.stdout
    assert "▁" in res.stdout  # the sparkline


def test_clean_runs_exit_zero(capsys):
    assert main(["scan", str(RUNS / "tb-clean"), str(RUNS / "nanogpt-clean"), "--quiet"]) == 0
    assert "0 finding(s) in 0 of 2 run(s)." in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,message",
    [
        pytest.param(["nope/"], "nope: no such file or folder", id="missing path"),
        pytest.param(["{runs}", "--rules", "{bad}"], "rule 'x': unknown kind 'ratoi'", id="bad rules"),
        pytest.param(["{empty}"], "no training logs found under", id="empty folder"),
        pytest.param(["{runs}", "--jobs", "0"], "--jobs must be at least 1", id="bad jobs"),
    ],
)
def test_bad_input_is_one_clear_message_and_exit_2(tmp_path, args, message):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nname = "x"\nmetric = "loss"\nkind = "ratoi"\n')
    (tmp_path / "empty").mkdir()
    args = [a.format(runs=RUNS, bad=bad, empty=tmp_path / "empty") for a in args]
    res = lossguard("scan", *args)
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1


def test_many_empty_files_are_a_quick_scan_with_a_few_warnings(tmp_path):
    # Each was a run of its own, analysed and warned about: 159 s and 50,000 lines on stderr for
    # 50,000 files (3.2 ms of CPU each). Now an empty file is no run, its warning is counted in its
    # folder's one summary line, and the scan's CPU is a small cost per file: 10,000 prove it as
    # 50,000 did (a few seconds less of creating files).
    import resource

    n = 10_000
    shutil.copytree(RUNS / "tb-clean", tmp_path / "good")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for i in range(n):
        os.close(os.open(jobs / f"job{i:05d}.log", os.O_WRONLY | os.O_CREAT, 0o644))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = lossguard("scan", str(tmp_path), "--format", "json")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        *(f"warning: {jobs / f'job{i:05d}.log'}: empty file: no records" for i in range(3)),
        f"warning: {jobs}: ... and {n - 3:,} more file(s) in this folder: empty file: no records",
    ]
    doc = json.loads(res.stdout)
    assert doc["summary"]["warnings"] == 4 and doc["summary"]["files"] == n + 1
    assert [r["run"] for r in doc["runs"]] == ["good"]  # (not 10,001 runs)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert cpu < 1.0 + n * 0.5e-3, f"{cpu:.1f} s of CPU for {n:,} empty files"  # (~0.1 ms each here; 3.2 ms before)


def test_folder_of_only_unreadable_files_is_exit_2_with_each_named(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"\x00\x01garbage")
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"not an event file at all")
    res = lossguard("scan", str(tmp_path))
    assert res.returncode == 2
    assert "a.jsonl" in res.stdout + res.stderr and "events.out.tfevents.1.host" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_some_bad_files_do_not_hide_the_good_ones_and_strict_makes_them_fatal(tmp_path):

    shutil.copytree(RUNS / "megatron-grad-explosion", tmp_path / "good")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    res = lossguard("scan", str(tmp_path))
    assert res.returncode == 1
    assert "gradient_explosion" in res.stdout and "broken/metrics.jsonl" in res.stdout
    assert lossguard("scan", str(tmp_path), "--strict").returncode == 2


def test_parallel_scan_gives_the_same_report(capsys):
    _, one = scan_json(capsys, str(RUNS), "--jobs", "1")
    _, two = scan_json(capsys, str(RUNS), "--jobs", "2")
    assert one == two


def test_filters_since_metric_and_run(capsys):
    _, doc = scan_json(capsys, str(RUNS), "--run", "megatron-*", "--metric", "loss", "--since", "702")
    assert [r["run"] for r in doc["runs"]] == ["megatron-fp16-overflow", "megatron-grad-explosion"]
    assert [(s["rule"], s["step"]) for r in doc["runs"] for s in r["spikes"]] == [("loss-spike", 702)]


@pytest.mark.parametrize("preset", ["llm-foundry", "olmo-core", "lightning", "metaseq", "megatron"])
def test_every_preset_scans(capsys, preset):
    code, doc = scan_json(capsys, str(RUNS), "--rules", f"rules/presets/{preset}.toml")
    assert code in (0, 1)
    assert {r["name"] for r in doc["rules"]} and all(r["name"].startswith(preset.split("-")[0]) for r in doc["rules"])


def test_compare_rules_shows_what_each_flags_alone(capsys):
    code = main(["scan", str(RUNS), "--compare-rules", "rules/default.toml", "rules/presets/olmo-core.toml", "--format", "json", "--quiet"])
    doc = json.loads(capsys.readouterr().out)
    runs = {r["run"]: r for r in doc["runs"]}
    bad = runs["lightning-bad-batch/version_0"]
    assert bad["a"] == 1 and bad["a_per_10k_steps"] == pytest.approx(1 / 1200 * 1e4, rel=1e-3)
    assert all(r["b"] <= r["a"] + len(r["only_b"]) for r in doc["runs"])
    assert code in (0, 1)
    main(["scan", str(RUNS), "--compare-rules", "rules/default.toml", "llm-foundry", "--quiet"])
    text = capsys.readouterr().out
    assert "ONLY A (steps)" in text and "alerts per 10k steps over all runs" in text


def test_markdown_report_is_a_github_table(capsys):
    main(["scan", str(RUNS), "--format", "markdown", "--quiet"])
    out = capsys.readouterr().out
    assert out.startswith("## lossguard scan: ")
    assert "| run | format | steps | last step | findings | worst | top cause |" in out
    assert "| megatron-grad-explosion | 701 | loss-spike | warning |" in out


def test_output_file(tmp_path, capsys):
    target = tmp_path / "report.md"
    assert main(["scan", str(RUNS), "--format", "markdown", "--output", str(target), "--quiet"]) == 1
    assert capsys.readouterr().out == ""
    assert target.read_text().startswith("## lossguard scan")


def test_a_report_written_to_a_file_says_where_it_went_on_stderr(tmp_path, capsys):
    target = tmp_path / "report.html"
    assert main(["scan", str(RUNS), "--format", "html", "-o", str(target)]) == 1
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.splitlines()[-1] == f"lossguard: wrote the html report to {target} (8 run(s), 12 finding(s))"
    assert target.read_text().startswith("<!doctype html>")


def test_progress_line_counts_runs_and_bytes_and_ends_with_a_newline():
    import io

    from lossguard.cli.progress import Progress

    out = io.StringIO()
    progress = Progress(stream=out, delay=0.0)
    progress(1, 4, 5_000_000)
    progress(4, 4, 20_000_000)
    progress.close()
    text = out.getvalue()
    assert "1/4 runs, 5.0 MB" in text and "4/4 runs, 20.0 MB" in text and text.endswith("\n")
    quiet = io.StringIO()
    fast = Progress(stream=quiet, delay=60.0)
    fast(4, 4, 1)
    fast.close()
    assert quiet.getvalue() == ""  # a scan that finished in a moment shows no bar


def test_steps_is_the_span_a_run_covers_and_points_what_it_logged(capsys):
    """A run logging every 500 steps: 430 points over 500..215000 steps. Alerts per 10k steps in a
    backtest are per 10k of the span, not of the points."""
    from .conftest import CORPUS

    t5 = CORPUS / "hf_trainer" / "t5_summarization_trainer_state.json"
    main(["scan", str(t5), "--quiet"])
    header, _, row = capsys.readouterr().out.splitlines()[2:5]
    assert header.split()[2:4] == ["STEPS", "POINTS"] and row.split()[2:4] == ["500..215000", "430"]
    main(["scan", str(t5), "--compare-rules", "rules/default.toml", "olmo-core", "--format", "json", "--quiet"])
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert (run["steps"], run["points"], run["a"]) == (214501, 430, 1) and run["a_per_10k_steps"] == round(1 / 214501 * 1e4, 4)


def test_small_files_read_together_report_what_each_read_alone_reports(tmp_path, capsys, monkeypatch):
    """A worker reads its batch's small JSON lines, Megatron and key-value logs in one parse (readmany); the
    report is the one reading each file alone gives, runs whose lines depend on their file's earlier
    lines (an OVERFLOW before any iteration, JSON lines with no step) included."""
    from lossguard.report import audit

    shutil.copytree(RUNS, tmp_path / "runs")
    shutil.copytree(FIXTURES / "corpus", tmp_path / "corpus")
    for k in range(6):
        run = tmp_path / f"sweep-{k}"
        run.mkdir()
        lines = [f" iteration {s:8d}/    1200 | learning rate: 3.0E-04 | lm loss: {2.0 + 0.01 * ((s * (k + 3)) % 7) + (9.0 if s == 20 + k else 0.0)} | loss scale: 4096.0 | grad norm: {0.5 + k / 10} |" for s in range(1, 60)]
        if k % 2:
            lines.insert(0, "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8192, reducing to 4096")
        (run / "train.log").write_text("\n".join(lines) + "\n")
        kv = tmp_path / f"nanogpt-{k}"
        kv.mkdir()
        (kv / "out.log").write_text("".join(f"step {s:5d} | loss: {2.0 + 0.01 * (s % 5) + (8.0 if s == 25 + k else 0.0):.6f} | lr 6.0e-04 | norm: 0.5{k} | dt: 412.1ms\n" for s in range(60)))
        (run / "metrics.jsonl").write_text("".join(f'{{"loss": {1.5 + (9.0 if s == 30 else 0.0)}, "lr": 1e-4}}\n' if k == 5 else f'{{"step": {s}, "loss": {1.5 + (9.0 if s == 30 + k else 0.0)}}}\n' for s in range(50)))
    read_together = []
    real = audit.readmany.read_many

    def counted(jobs, **kw):
        got = real(jobs, **kw)
        read_together.extend(job.path.parent.name for job, res in zip(jobs, got) if res is not None)
        return got

    monkeypatch.setattr(audit.readmany, "read_many", counted)
    code, together = scan_json(capsys, str(tmp_path), "--jobs", "1")
    # The sweep's files but the three OVERFLOW-first logs and the stepless JSON lines; the fixtures' small logs.
    assert sorted(r for r in read_together if r.startswith("sweep")) == sorted(["sweep-0", "sweep-0", "sweep-1", "sweep-2", "sweep-2", "sweep-3", "sweep-4", "sweep-4"])
    assert sorted(r for r in read_together if r.startswith("nanogpt-")) == sorted([*(f"nanogpt-{k}" for k in range(6)), "nanogpt-clean"])
    assert len(read_together) > 8
    monkeypatch.setattr(audit, "TOGETHER_BYTES", 0)
    code_alone, alone = scan_json(capsys, str(tmp_path), "--jobs", "1")
    assert (code, together) == (code_alone, alone)
    assert {r["run"] for r in together["runs"] if r["spikes"]} >= {f"{name}-{k}" for k in range(6) for name in ("sweep", "nanogpt")}


def _pool_size(_: int) -> int:
    import polars as pl

    return pl.thread_pool_size()


def test_scan_workers_share_the_cores_and_a_users_polars_setting_stands(monkeypatch):
    """Each of N workers gets cores/N polars threads (a thread per core in every worker cost 10-25%
    more CPU a small run); the setting is the workers', not left in the caller's environment."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from lossguard.report import audit

    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))

    def sizes(jobs: int) -> set[int]:
        with audit._threads_each(jobs), ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            return set(pool.map(_pool_size, range(jobs)))

    assert sizes(2) == {max(1, cores // 2)}
    assert "POLARS_MAX_THREADS" not in os.environ
    # Shared only when the work is fine-grained: a scan that ends on one large run gives it every core.
    assert audit._fine_grained({f"run{k}": 345_000 for k in range(1000)}, 2)
    assert not audit._fine_grained({"big": 100 << 20, **{f"run{k}": 345_000 for k in range(100)}}, 2)
    monkeypatch.setenv("POLARS_MAX_THREADS", "3")
    assert sizes(2) == {3} and os.environ["POLARS_MAX_THREADS"] == "3"


def test_a_growing_files_last_record_not_yet_whole_is_said_but_is_no_strict_failure(tmp_path):
    """A live W&B run's `.wandb` always ends inside a record (wandb-core writes a block when it fills):
    a nightly `scan --strict` of a box with a run still training must not fail on it. A file that
    could not be read still fails it."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "live"))
    for step in range(60):
        writer.add_scalar("train/loss", 10.0 if step == 50 else 2.0 + 0.01 * (step % 3), step)
    writer.close()
    (log,) = (tmp_path / "live").glob("events.out.tfevents.*")
    log.write_bytes(log.read_bytes()[:-5])  # the next record half written
    res = lossguard("scan", str(tmp_path), "--strict")
    assert res.returncode == 1, res.stderr
    assert "last event record is incomplete" in res.stdout + res.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    assert lossguard("scan", str(tmp_path), "--strict").returncode == 2


def test_table_columns_line_up_in_terminal_cells_for_wide_run_names(tmp_path, capsys):
    # Acceptance run 3: columns were padded by characters, so a run named in Chinese (each character
    # two cells wide in a terminal) pushed its row's later columns two cells right.
    import unicodedata

    for name in ("实验一", "baseline"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text("".join(f"step {s} loss {2.0 + (s % 3) * 0.01}\n" for s in range(1, 30)))
    main(["scan", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith(("RUN", "实验一", "baseline"))]
    assert len(table) == 3

    def cell_of(line: str, word: str) -> int:  # where `word` starts, in terminal cells
        at = line.index(word)
        return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line[:at])

    assert len({cell_of(line, "kv_lines" if not line.startswith("RUN") else "FORMAT") for line in table}) == 1, table


def _loss_jsonl(path: Path, *, spike_at: int | None) -> None:
    path.parent.mkdir(parents=True)
    rows = ({"step": s, "loss": 9.0 if s == spike_at else 2.0 - s * 0.001 + (0.01 if s % 2 else -0.01)} for s in range(1, 301))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_files_among_several_roots_are_named_as_alone_under_the_folders_that_tell_them_apart(tmp_path, monkeypatch, capsys):
    for folder in ("a", "b"):
        _loss_jsonl(tmp_path / folder / "train.jsonl", spike_at=None)
    _loss_jsonl(tmp_path / "c" / "exp2" / "metrics.jsonl", spike_at=None)
    _loss_jsonl(tmp_path / "s" / "solo.jsonl", spike_at=None)
    monkeypatch.chdir(tmp_path)
    _, doc = scan_json(capsys, "a/train.jsonl", "b/train.jsonl", "c", "s/solo.jsonl")
    assert sorted(r["run"] for r in doc["runs"]) == ["a/train", "b/train", "c/exp2", "solo"]


def test_two_roots_of_one_name_given_relative_and_absolute_are_two_runs(tmp_path, monkeypatch, capsys):
    _loss_jsonl(tmp_path / "a" / "runs" / "exp1" / "metrics.jsonl", spike_at=150)
    _loss_jsonl(tmp_path / "b" / "runs" / "exp1" / "metrics.jsonl", spike_at=None)
    monkeypatch.chdir(tmp_path)
    code, doc = scan_json(capsys, "a/runs", str(tmp_path / "b" / "runs"))
    assert code == 1
    runs = {r["run"]: (r["source"], r["steps"], len(r["spikes"])) for r in doc["runs"]}
    assert runs == {"a/runs/exp1": ("a/runs/exp1/metrics.jsonl", 300, 1), "b/runs/exp1": (f"{tmp_path}/b/runs/exp1/metrics.jsonl", 300, 0)}
    assert main(["scan", "a/runs", str(tmp_path / "b" / "runs"), "--quiet"]) == 1
    table = capsys.readouterr().out
    assert "a/runs/exp1  jsonl   1..300     300" in table and "b/runs/exp1  jsonl   1..300     300" in table
    # The same folder named both ways is one run, read once.
    code, doc = scan_json(capsys, "a/runs", str(tmp_path / "a" / "runs"))
    assert code == 1
    assert [(r["run"], r["steps"]) for r in doc["runs"]] == [("runs/exp1", 300)]
