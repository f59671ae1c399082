"""Each line format on the lines its tools really print, noise and odd values included."""

from __future__ import annotations

import math

import polars as pl
import pytest

from lossguard.ingest.cursor import Cursor
from lossguard.detection.engine import tags_used
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.detection.streams import stream

from . import samples
from .conftest import assert_one_error_line, run_lossguard


def read_text(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    frame, results, problems = read_paths([path], ReadOptions())
    return frame, results, problems


def points(frame, metric):
    return frame.filter(pl.col("metric") == metric).select("step", "value").rows()


def test_hf_console_dicts_take_their_step_from_the_progress_bar_before_them(tmp_path):
    frame, results, problems = read_text(tmp_path, "train_stdout.txt", samples.HF_CONSOLE)
    assert results[0].format == "hf_console"
    assert problems == []
    loss = points(frame, "loss")
    assert [s for s, _ in loss] == [10, 20, 30, 40]
    assert math.isnan(loss[2][1])
    # The evaluation's own bar (13 batches) is not the training's: its dict is at the step before it.
    assert points(frame, "eval_loss") == [(20, 2.05)]
    assert points(frame, "grad_norm")[1] == (20, 1.5)  # np.float64(1.5)
    assert points(frame, "grad_norm")[2] == (30, math.inf)
    assert "train_loss" not in frame.get_column("tag").to_list()


def test_hf_console_without_a_bar_takes_epoch_times_the_banners_steps_per_epoch(tmp_path):
    frame, results, problems = read_text(tmp_path, "stdout.log", samples.HF_CONSOLE_NO_BAR)
    assert results[0].format == "hf_console" and problems == []
    assert [s for s, _ in points(frame, "loss")] == [10, 20, 30]
    assert points(frame, "eval_loss") == [(20, 2.05)]


def test_hf_console_total_steps_over_epochs_is_the_steps_per_epoch_of_older_banners(tmp_path):
    text = samples.HF_CONSOLE_NO_BAR.replace("  Num update steps per epoch = 100\n", "")
    frame, _, problems = read_text(tmp_path, "stdout.log", text)
    assert [s for s, _ in points(frame, "loss")] == [10, 20, 30] and problems == []


def test_hf_console_dicts_are_numbered_only_as_a_last_resort_and_a_warning_says_so(tmp_path):
    frame, results, problems = read_text(tmp_path, "train_stdout.txt", samples.HF_CONSOLE_DICTS)
    assert results[0].format == "hf_console"
    assert [s for s, _ in points(frame, "loss")] == [1, 2, 4, 5]
    assert points(frame, "eval_loss") == [(3, 2.05)]
    assert "train_loss" not in frame.get_column("tag").to_list()
    assert [p.message for p in problems] == [
        "no step in this file (no progress bar, no epoch with a known number of steps per epoch): its records are numbered 1, 2, 3... in file order"
    ]


def _read_line_by_line(path, text, fmt):
    lines = text.splitlines(keepends=True)
    cursor, frames, said = Cursor(), [], []
    for n in range(1, len(lines) + 1):
        path.write_text("".join(lines[:n]))
        res = read(path, cursor, run="r", fmt=fmt, final=False, options=ReadOptions())
        frames.append(res.frame)
        said += [p.message for p in res.problems]
        cursor = res.cursor
    return pl.concat(frames), said


@pytest.mark.parametrize(
    "text",
    [
        # A log collector that turns tqdm's \r into line breaks: every bar is on a line before its dict.
        pytest.param(samples.HF_CONSOLE.replace("\r", "\n"), id="bar on the lines before"),
        pytest.param(samples.HF_CONSOLE, id="bar on the same line"),
        pytest.param(samples.HF_CONSOLE_NO_BAR, id="banner's steps per epoch"),
        pytest.param(samples.HF_CONSOLE_DICTS, id="numbered"),
    ],
)
def test_hf_console_read_a_line_at_a_time_places_every_dict_as_one_read_does(tmp_path, text):
    # The daemon reads what was appended since its last pass: the bar, its total and the banner's
    # steps per epoch ride in the cursor, and the numbering warning is said once.
    path = tmp_path / "train_stdout.txt"
    grown, said = _read_line_by_line(path, text, "hf_console")
    whole = read(path, Cursor(), run="r", fmt="hf_console", final=True, options=ReadOptions())
    assert whole.frame.height and grown.equals(whole.frame)
    assert said == [p.message for p in whole.problems]


def test_nanogpt_iter_lines(tmp_path):
    frame, results, _ = read_text(tmp_path, "nanogpt.log", samples.NANOGPT)
    assert results[0].format == "kv_lines"
    assert points(frame, "eval_loss") == [(20, 8.9331)]
    # The eval-time estimate of the train loss means the loss too (a tag means its metric on its
    # own, so pieces read as one read does), but it is not the per-iteration loss: the stream is
    # read from `loss`, which outranks it (a canonical name beats another spelling).
    assert sorted(points(frame, "loss")) == [(0, 10.9917), (10, 9.4371), (20, 8.8012), (20, 8.9123)]
    assert tags_used(frame)["loss"] == "loss"
    assert stream(frame, "loss").select("step", "value").rows() == [(0, 10.9917), (10, 9.4371), (20, 8.8012)]


def test_llmc_step_lines_with_two_word_names(tmp_path):
    frame, _, _ = read_text(tmp_path, "llmc.log", samples.LLMC)
    assert points(frame, "loss") == [(1, 11.010029), (2, 10.847216), (3, 10.532)]
    assert points(frame, "grad_norm")[0] == (1, 15.4317)
    assert points(frame, "lr")[2] == (3, 3e-06)


@pytest.mark.parametrize(
    "line",
    [
        # An array of one element printed with %s or str(): PaddlePaddle's `loss.numpy()`, a numpy
        # reduction kept in an array (`print("step: %d, loss: %s" % (step, loss))`).
        pytest.param("[2024-01-01 10:00:00] epoch: 0, step: {s}, loss: [{v}], lr: 0.001", id="a one-element list"),
        # repr() of a 0-d numpy array: `print(f"iter {it} loss={loss!r}")`.
        pytest.param("iter {s} loss=array({v}, dtype=float32)", id="a 0-d numpy array"),
        pytest.param("step {s} loss: tensor({v}, device='cuda:0', grad_fn=<NllLossBackward0>)", id="a torch tensor"),
    ],
)
def test_a_loss_printed_in_a_list_or_an_array_is_read_as_its_number(tmp_path, line):
    text = "".join(line.format(s=s, v=f"{2.0 + (s % 3) / 100:.4f}") + "\n" for s in range(1, 13))
    frame, results, _ = read_text(tmp_path, "train.log", text)
    assert results[0].format == "kv_lines"
    assert points(frame, "loss") == [(s, round(2.0 + (s % 3) / 100, 4)) for s in range(1, 13)]


def test_thousands_separators_are_part_of_the_number(tmp_path):
    frame, results, _ = read_text(tmp_path, "titan.log", samples.TORCHTITAN)
    assert results[0].format == "kv_lines"
    assert frame.filter(pl.col("tag") == "tps").select("step", "value").rows() == [(1, 1234.0), (2, 12345678.0)]
    assert points(frame, "loss") == [(1, 12.2345), (2, 11.9876)] and points(frame, "grad_norm") == [(2, 4.5678)]


def test_flashlight_pipe_separated_key_colon_value_lines_take_nupdates_as_the_step(tmp_path):
    frame, results, problems = read_text(tmp_path, "001_log", samples.FLASHLIGHT)
    assert results[0].format == "kv_lines" and problems == []
    assert points(frame, "loss")[0] == (1000, 42.51234)
    step, loss = points(frame, "loss")[1]
    assert step == 2000 and math.isinf(loss)  # `loss:        inf`
    assert points(frame, "lr") == [(1000, 0.1), (2000, 0.2)]
    assert points(frame, "epoch") == [(1000, 1.0), (2000, 1.0)]  # a value here: nupdates is finer
    # glog's prefix says who printed the line and where: not metrics. The flags line names no step.
    tags = set(frame.get_column("tag").to_list())
    assert not tags & {"I0312", "Train.cpp", "nupdates", "arch", "lr=0.4"}
    assert points(frame, "dev-clean-loss") == [(1000, 30.12345), (2000, 29.80001)]


def test_epoch_is_the_step_only_when_nothing_finer_exists_and_a_warning_says_so(tmp_path):
    frame, results, problems = read_text(tmp_path, "001_log", samples.WAV2LETTER_EPOCHS)
    assert results[0].format == "kv_lines"
    assert [s for s, _ in points(frame, "loss")] == [1, 2, 3]
    assert [p.message for p in problems] == ["no step finer than the epoch in this file: its epochs are the steps"]


def test_epoch_steps_read_in_pieces_warn_once_and_match_one_read(tmp_path):
    path = tmp_path / "001_log"
    grown, said = _read_line_by_line(path, samples.WAV2LETTER_EPOCHS, "kv_lines")
    whole = read(path, Cursor(), run="r", fmt="kv_lines", final=True, options=ReadOptions())
    assert grown.equals(whole.frame)
    assert said == [p.message for p in whole.problems] and len(said) == 1


def test_once_a_finer_step_was_read_a_later_epoch_only_line_is_no_record(tmp_path):
    # modded-nanogpt style step lines, then an end-of-epoch summary naming only the epoch: read in
    # one go it has no step (the file has finer ones); read later alone, the cursor remembers that.
    path = tmp_path / "train.log"
    steps = "step:100/2000 train_loss:3.2100 train_time:12345ms\nstep:200/2000 train_loss:3.0100 train_time:24690ms\n"
    summary = "epoch: 1 | val_loss: 3.3000\n"
    path.write_text(steps)
    first = read(path, Cursor(), run="r", fmt="kv_lines", final=False, options=ReadOptions())
    path.write_text(steps + summary)
    later = read(path, first.cursor, run="r", fmt="kv_lines", final=False, options=ReadOptions())
    whole = read(path, Cursor(), run="r", fmt="kv_lines", final=True, options=ReadOptions())
    assert later.frame.height == 0 and later.problems == ()
    assert whole.frame.filter(pl.col("tag") == "val_loss").height == 0 and whole.problems == ()


def test_deepspeed_console_lists_prefixes_and_overflow_lines(tmp_path):
    frame, results, problems = read_text(tmp_path, "ds.log", samples.DEEPSPEED)
    assert results[0].format == "kv_lines" and problems == []
    assert points(frame, "lr") == [(10, 9.9e-05), (20, 9.8e-05)]  # the first group's rate
    assert points(frame, "loss") == [(10, 2.345), (20, 2.301), (30, 2.29)]
    # Printed while step 21 ran: the halved scale is a loss_scale value at 21, as in Megatron logs.
    assert points(frame, "loss_scale") == [(21, 32768.0)]
    tags = set(frame.get_column("tag").to_list())
    assert not {t for t in tags if t.endswith(".py") or t.lower() == "rank"}


def test_composer_console_headers_name_the_step_and_eval_lines_the_last_train_step(tmp_path):
    frame, results, problems = read_text(tmp_path, "train.out", samples.COMPOSER)
    assert results[0].format == "composer" and problems == []
    loss = points(frame, "loss")
    # [epoch=2][batch=16/100] is step 100 + 16; a NaN loss is kept.
    assert loss[:3] == [(1, 11.2345), (2, 10.9876), (116, 2.1)] and loss[3][0] == 117 and math.isnan(loss[3][1])
    assert points(frame, "eval_loss") == [(2, 10.5)]
    assert points(frame, "lr") == [(1, 0.0), (2, 0.0001)] and points(frame, "grad_norm") == [(1, 5.4321), (2, 4.321)]
    assert "max_duration" not in frame.get_column("tag").to_list()


def test_fairseq_simple_hydra_and_json_lines(tmp_path):
    frame, _, _ = read_text(tmp_path, "fairseq.log", samples.FAIRSEQ)
    assert points(frame, "loss") == [(100, 9.21), (200, 8.71)]
    assert points(frame, "grad_norm") == [(100, 1.2), (200, 1.1)]


def test_fairseq_json_log_lines(tmp_path):
    text = "\n".join(line for line in samples.FAIRSEQ.splitlines() if "{" in line) + "\n"
    frame, results, _ = read_text(tmp_path, "fairseq_json.log", text)
    assert results[0].format == "jsonl"
    assert points(frame, "loss") == [(300, 8.5)]
    assert points(frame, "grad_norm") == [(300, 1.05)]


def test_jsonl_keeps_nan_inf_duplicates_and_rewinds(tmp_path):
    frame, _, _ = read_text(tmp_path, "metrics.jsonl", samples.JSONL)
    loss = points(frame, "loss")
    assert [s for s, _ in loss] == [1, 2, 3, 3, 2]
    assert math.isnan(loss[1][1]) and math.isnan(loss[2][1])
    assert points(frame, "grad_norm")[1] == (2, math.inf)
    assert "note" not in frame.get_column("tag").to_list()


def test_lightning_csv_sparse_columns(tmp_path):
    frame, results, _ = read_text(tmp_path, "metrics.csv", samples.LIGHTNING_CSV)
    assert results[0].format == "csv"
    loss = points(frame, "loss")
    assert [s for s, _ in loss] == [49, 99, 149, 199] and math.isnan(loss[3][1])
    assert points(frame, "eval_loss") == [(99, 7.3)]
    assert points(frame, "lr") == [(49, 0.001), (99, 0.001), (149, 0.0009), (199, 0.0009)]
    assert frame.filter(pl.col("metric") == "lr").get_column("tag").unique().to_list() == ["lr-AdamW"]


def test_csv_without_a_step_column_numbers_rows(tmp_path):
    frame, _, _ = read_text(tmp_path, "log.csv", "loss,acc\n3.0,0.1\n2.5,0.2\n")
    assert points(frame, "loss") == [(1, 3.0), (2, 2.5)]


def test_megatron_lines_with_prefixes_overflow_and_validation(tmp_path):
    frame, results, _ = read_text(tmp_path, "megatron.log", samples.MEGATRON)
    assert results[0].format == "megatron"
    assert points(frame, "loss") == [(100, 5.2), (101, 5.1)]
    assert points(frame, "eval_loss") == [(101, 5.05)]
    scale = frame.filter(pl.col("metric") == "loss_scale").select("step", "tag", "value").rows()
    assert scale == [(100, "loss scale", 4096.0), (101, "OVERFLOW loss scale", 2048.0), (101, "loss scale", 2048.0)]
    assert points(frame, "number of skipped iterations") == [(100, 0.0), (101, 1.0)]


def test_user_defined_regex_format_from_config(tmp_path):
    config = tmp_path / "lossguard.toml"
    config.write_text(
        """
[aliases]
loss = ["objective"]

[[formats]]
name = "mytrainer"
files = "*.mylog"
pattern = 'it=(?P<step>\\d+) objective=(?P<objective>\\S+) eta=(?P<lr>\\S+)'
"""
    )
    log = tmp_path / "job.mylog"
    log.write_text("boot\nit=1 objective=4.5 eta=0.1\nnoise it=x\nit=2 objective=nan eta=0.1\n")
    from lossguard.ingest.config import read_options

    frame, results, problems = read_paths([log], read_options(config))
    assert results[0].format == "mytrainer"
    loss = points(frame, "loss")
    assert loss[0] == (1, 4.5) and loss[1][0] == 2 and math.isnan(loss[1][1])
    assert points(frame, "lr") == [(1, 0.1), (2, 0.1)]


@pytest.mark.parametrize(
    "body,message",
    [
        pytest.param('[[formats]]\nname = "x"\npattern = "(unclosed"\n', "not a valid regular expression", id="bad regex"),
        pytest.param('[[formats]]\nname = "x"\npattern = "(?P<step>\\\\d+)"\n', "at least one named group", id="no metric group"),
        pytest.param('[[formats]]\nname = "jsonl"\npattern = "(?P<loss>\\\\d+)"\n', "built-in format", id="shadows a built-in"),
        pytest.param('[[formats]]\nname = "x"\npattern = "(?<=loss=)(?P<loss>\\\\S+)"\n', "[[formats]] x: pattern: the regex engine that reads the logs (polars, Rust's regex) refuses it: look-around", id="lookbehind only Python reads"),
        pytest.param('[[formats]]\nname = "x"\npattern = "(?P<loss>\\\\d)(?P=loss)"\n', "[[formats]] x: pattern: the regex engine that reads the logs", id="backreference only Python reads"),
        pytest.param('[[formats]]\nname = "x"\npattern = "(?P<loss>\\\\p{N}+)"\n', "[[formats]] x: pattern: not a valid regular expression: bad escape", id="class only polars reads"),
        pytest.param("[aliases]\nloss = 'x'\n", "must be a list", id="alias not a list"),
        pytest.param("[aliases\n", "not valid TOML", id="bad toml"),
    ],
)
def test_bad_config_names_the_file_and_the_problem(tmp_path, body, message):
    from lossguard.ingest.config import read_options
    from lossguard.errors import ConfigError

    config = tmp_path / "lossguard.toml"
    config.write_text(body)
    with pytest.raises(ConfigError) as info:
        read_options(config)
    assert str(config) in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("command", ["read", "scan"])
def test_a_format_only_python_can_compile_stops_the_command_with_one_line(tmp_path, command):
    config = tmp_path / "lossguard.toml"
    config.write_text('[[formats]]\nname = "after"\npattern = \'(?<=loss=)(?P<loss>\\S+)\'\n')
    log = tmp_path / "train.log"
    log.write_text("step 1 loss=2.5\n")
    res = run_lossguard(command, str(log), "--config", str(config), timeout=30)
    assert_one_error_line(res, str(config), "[[formats]] after", "look-around")


def test_hf_console_bars_drawn_with_block_glyphs_place_dicts_as_ascii_bars_do(tmp_path):
    """A bar redrawn after a short dict on its line counts for the next dict. tqdm draws with `█`, three
    bytes to a character: the line is cut at its `{` by characters, not by byte offsets."""
    from .samples import _bar

    def log(glyph: str) -> str:
        bar = lambda n: _bar(n).replace("█", glyph)  # noqa: E731
        return (
            "***** Running training *****\n  Total optimization steps = 300\n"
            # Three redraws of a nearly full bar before the dict (54 bytes more than characters), the
            # dict at 290; the bar drawn after it, 295, is the next dict's.
            f"{bar(270)}{bar(280)}{bar(290)}{{'loss': 2.3}}{bar(295)}\n"
            "{'loss': 2.1}\n"
            f"{bar(300)}{{'loss': 2.0}}\n"
        )

    steps = {}
    for glyph in ("█", "#"):
        path = tmp_path / f"{ord(glyph)}.log"
        path.write_text(log(glyph))
        frame = read(path, run="r", fmt="hf_console", final=True, options=ReadOptions()).frame
        steps[glyph] = frame.filter(pl.col("metric") == "loss").get_column("step").to_list()
    assert steps["█"] == steps["#"] == [290, 295, 300]


@pytest.mark.parametrize("lines", [10, 3000], ids=["a few lines (regex path)", "many lines (NDJSON path)"])
def test_a_json_key_written_with_escapes_names_its_tag_as_json_means_it(tmp_path, lines):
    """Some writers escape `/` (`"train\\/loss"`); the tag is `train/loss` whichever path reads the
    lines, or a daemon reading a few new lines and a scan of the whole file would name it apart."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {i}, "train\\/loss": 2.0, "caf\\u00e9": 1.0, "a\\\\b": 0.5}}\n' for i in range(1, lines + 1)))
    frame = read(path, run="r", fmt="jsonl", final=True, options=ReadOptions()).frame
    assert sorted(frame.get_column("tag").unique().to_list()) == ["a\\b", "café", "train/loss"]
    assert set(frame.filter(pl.col("tag") == "train/loss").get_column("metric").to_list()) == {"loss"}


def _hf_run(tmp_path, logging_steps=1):
    from lossguard import api
    from . import synth

    c = synth.curves("model_architecture")  # four loss spikes
    (tmp_path / "console").mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "console" / "train_stdout.txt").write_text(samples.hf_trainer_console(c, logging_steps=logging_steps))
    (tmp_path / "state" / "trainer_state.json").write_text(samples.hf_trainer_state(c, logging_steps=logging_steps))
    return {d: api.scan(tmp_path / d) for d in ("console", "state")}


def test_hf_console_dicts_between_bar_redraws_are_the_steps_between_them_and_scan_finds_every_spike(tmp_path):
    """500 steps a second: tqdm redraws the bar every 0.1 s (50 steps), and tqdm.write redraws it
    after each dict at that dict's own count. Every dict but the second (before any interval is
    known) is at its step, and scan finds the spikes trainer_state.json of the same run shows."""
    logging_steps = 1
    reports = _hf_run(tmp_path, logging_steps)
    console = read(tmp_path / "console" / "train_stdout.txt", run="r", fmt="hf_console", final=True, options=ReadOptions())
    steps = console.frame.filter(pl.col("metric") == "loss").get_column("step").to_list()
    truth = list(range(logging_steps, 1201, logging_steps))
    assert len(steps) == len(truth) and sum(a != b for a, b in zip(steps, truth)) == 1
    spikes = {d: [(s["metric"], s["step"], s["peak_step"]) for r in rep.runs for s in r["spikes"]] for d, rep in reports.items()}
    assert len(spikes["state"]) == 4 and spikes["console"] == spikes["state"]


def test_hf_console_dicts_after_the_last_bar_continue_at_the_logging_interval(tmp_path):
    """No bar since the one before 40 dicts: they go on every 5 steps, as the bars before implied."""
    bars = "".join(f"{samples._bar(n)}{{'loss': 2.{n}, 'epoch': 0.1}}\n" for n in (5, 10, 15))
    text = bars + "".join(f"{{'loss': 1.{i}, 'epoch': 0.1}}\n" for i in range(40))
    frame, _, problems = read_text(tmp_path, "train_stdout.txt", text)
    assert [s for s, _ in points(frame, "loss")] == list(range(5, 220, 5)) and problems == []


def test_read_says_how_the_hf_console_steps_were_placed(tmp_path):
    from . import synth

    log = tmp_path / "r" / "train_stdout.txt"
    log.parent.mkdir()
    log.write_text(samples.hf_trainer_console(synth.curves("clean")))
    res = run_lossguard("read", str(log), "--metric", "loss", timeout=60)
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("metrics (train_stdout): loss <- loss")
    assert "steps of train_stdout.txt: 24 at a progress bar's count, 1,175 at the logging interval after it (1 step), 1 at the step before it" in first


def test_hf_console_of_a_fast_run_read_a_few_lines_at_a_time_places_every_dict_as_one_read_does(tmp_path):
    from . import synth

    text = samples.hf_trainer_console(synth.curves("clean", steps=300), logging_steps=2)
    path = tmp_path / "train_stdout.txt"
    grown, said = _read_line_by_line(path, text, "hf_console")
    whole = read(path, Cursor(), run="r", fmt="hf_console", final=True, options=ReadOptions())
    assert whole.frame.height and grown.equals(whole.frame) and said == [p.message for p in whole.problems]
