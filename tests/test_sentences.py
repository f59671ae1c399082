"""Metrics written as sentences (formats/sentences.py): BigDL's DistriOptimizer lines, as its
optim/DistriOptimizer.scala logs each iteration (`${header} Trained ${n} records in ${t} seconds.
Throughput is ${r} records/second. Loss is ${loss}. ${getHyperParameterLog(...)}`, the header
`[Epoch e n/N][Iteration i][Wall Clock ts]`), read with a name for each value and the iteration as
the step."""

from __future__ import annotations

import pytest

from lossguard.ingest.reader import ReadOptions, read_paths

from .conftest import run_lossguard, run_lossguard_in_process

BIGDL = (
    "2017-09-26 10:13:05 INFO  DistriOptimizer$:337 - [Epoch 1 {seen}/60000][Iteration {i}][Wall Clock {clock:.3f}s] "
    "Trained 128 records in 0.5 seconds. Throughput is 256.0 records/second. Loss is {loss:.4f}. Current learning rate is 0.01. "
)


def bigdl_log(path, *, spike_at: int | None = 150, loss: bool = True, n: int = 200):
    lines = ["2017-09-26 10:13:00 INFO  DistriOptimizer$:100 - caching training rdd ..."]
    for i in range(1, n + 1):
        value = 9.5 if i == spike_at else 2.3 - i * 0.004 + (0.01 if i % 3 else -0.01)
        line = BIGDL.format(seen=i * 128, i=i, clock=i * 0.5, loss=value)
        # A value's name the vocabulary does not know for the loss: the critic's, in an RL run.
        lines.append(line if loss else line.replace(" Loss is ", " Critic_loss is "))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bigdl_iterations_read_the_loss_lr_and_throughput_at_the_iteration(tmp_path):
    frame, results, problems = read_paths([bigdl_log(tmp_path / "train.log")], ReadOptions())
    assert results[0].format == "kv_lines" and not problems
    assert set(frame.get_column("tag").unique()) == {"Epoch", "Wall Clock", "Throughput", "Loss", "Current learning rate"}
    step3 = {t: v for t, v in frame.filter(frame["step"] == 3).select("tag", "value").rows()}
    assert step3 == {"Epoch": 1.0, "Wall Clock": 1.5, "Throughput": 256.0, "Loss": pytest.approx(2.3 - 0.012 - 0.01), "Current learning rate": 0.01}
    assert sorted(frame.filter(frame["metric"] == "loss").get_column("step")) == list(range(1, 201))
    assert set(frame.filter(frame["tag"] == "Current learning rate").get_column("metric")) == {"lr"}


def test_a_spike_in_a_bigdl_log_is_found_and_its_loss_named_loss(tmp_path):
    (tmp_path / "bigdl").mkdir()
    bigdl_log(tmp_path / "bigdl" / "train.log", spike_at=150)
    scanned = run_lossguard("scan", str(tmp_path / "bigdl"))
    assert scanned.returncode == 1, scanned.stdout + scanned.stderr
    assert "no loss" not in scanned.stdout + scanned.stderr
    read = run_lossguard("read", str(tmp_path / "bigdl" / "train.log"), "--format", "table")
    assert read.stdout.splitlines()[0] == "metrics (train): loss <- Loss, lr <- Current learning rate, throughput <- Throughput"


def test_a_bigdl_log_with_no_loss_lists_only_real_metric_names(tmp_path):
    (tmp_path / "bigdl").mkdir()
    bigdl_log(tmp_path / "bigdl" / "train.log", loss=False)
    scanned = run_lossguard_in_process("scan", str(tmp_path / "bigdl"))
    assert "no loss in this run" in scanned.stderr + scanned.stdout
    frame, _, _ = read_paths([tmp_path / "bigdl" / "train.log"], ReadOptions())
    assert set(frame.get_column("tag").unique()) == {"Epoch", "Wall Clock", "Throughput", "Critic_loss", "Current learning rate"}


@pytest.mark.parametrize(
    "pairs, tags",
    [
        pytest.param("loss: 2.5 | time: 12 ms", {"loss": 2.5, "time": 12.0}, id="a unit after a separator keeps its name"),
        pytest.param("loss 2.5 samples 1280", {"loss": 2.5, "samples": 1280.0}, id="a unit word with a number is a name"),
        pytest.param("loss 2.5 processed 64 images", {"loss": 2.5}, id="a number counting images is no value"),
        pytest.param("loss 2.5, 30 tokens/sec", {"loss": 2.5}, id="a rate counts its unit"),
        pytest.param("loss 2.5 in 3", {"loss": 2.5}, id="a word no name ends with"),
        pytest.param("the val loss was 3.5. lr = 0.1", {"the val loss": 3.5, "lr": 0.1}, id="was, and = as before"),
        pytest.param("loss 2.5. Epoch finished. Wall clock time is 123ms", {"loss": 2.5, "Wall clock time": 123.0}, id="the sentence's words"),
    ],
)
def test_words_around_numbers_are_no_metric_names(tmp_path, pairs, tags):
    path = tmp_path / "log.txt"
    path.write_text("".join(f"step {i} {pairs}\n" for i in range(1, 4)))
    frame, results, _ = read_paths([path], ReadOptions())
    assert results[0].format == "kv_lines"
    assert dict(frame.filter(frame["step"] == 2).select("tag", "value").rows()) == tags
