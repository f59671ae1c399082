"""Small logs in each text format, as their tools print them (noise included), for tests that
need to cut, grow and damage files."""

from __future__ import annotations

def _bar(n: int, total: int = 300) -> str:
    """One redraw of tqdm's default bar, as a non-terminal receives it (\\r, no newline)."""
    pct = 100 * n // total
    filled = "█" * (10 * n // total)
    return f"\r{pct:3d}%|{filled:<10}| {n}/{total} [00:{n // 3:02d}<01:30,  3.20it/s]"


# tqdm.write clears the bars (\r, spaces, \r), writes the line, then redraws them.
_CLEAR = "\r" + " " * 50 + "\r"

# HF Trainer run with `> train_stdout.txt 2>&1`: the banner (trainer.py's logger.info lines), then the
# training bar and ProgressCallback's dicts written through it (transformers/trainer_callback.py:
# `self.training_bar.write(str(logs))`), an evaluation with its own bar (prediction_bar, another
# total, on the next line: tqdm's position 1) whose dict takes the step of the dict before it, and
# the end-of-training summary. logging_steps=10, 300 steps.
HF_CONSOLE = (
    "***** Running training *****\n"
    "  Num examples = 1,000\n"
    "  Num Epochs = 3\n"
    "  Instantaneous batch size per device = 10\n"
    "  Total optimization steps = 300\n"
    f"{_bar(0)}{_bar(7)}{_bar(10)}{_CLEAR}{{'loss': 2.3026, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.1}}\n"
    f"{_bar(10)}{_bar(14)}{_bar(20)}{_CLEAR}{{'loss': 2.1, 'grad_norm': np.float64(1.5), 'learning_rate': 4.8e-05, 'epoch': 0.2}}\n"
    f"{_bar(20)}\n"
    f"{_bar(0, 13)}\x1b[A\n{_bar(9, 13)}\x1b[A\n{_bar(13, 13)}\x1b[A{_CLEAR}{{'eval_loss': 2.05, 'eval_runtime': 1.2, 'eval_samples_per_second': 80.0, 'epoch': 0.2}}\n"
    f"{_bar(20)}{_bar(27)}{_bar(30)}{_CLEAR}{{'loss': nan, 'grad_norm': inf, 'learning_rate': 4.7e-05, 'epoch': 0.3}}\n"
    f"{_bar(30)}{_bar(40)}{_CLEAR}{{'loss': 1.95, 'grad_norm': 0.9, 'learning_rate': 4.6e-05, 'epoch': 0.4}}\n"
    f"{_bar(40)}{_bar(300)}{_CLEAR}{{'train_runtime': 100.1, 'train_samples_per_second': 29.9, 'train_steps_per_second': 3.0, 'train_loss': 2.0, 'epoch': 3.0}}\n"
    f"{_bar(300)}\n"
)

# The same run with disable_tqdm=True: PrinterCallback prints the dicts (`print(logs)`), no bar; the
# banner's `Num update steps per epoch` (newer trainer.py) gives the steps from the epoch.
HF_CONSOLE_NO_BAR = """\
***** Running training *****
  Num examples = 1,000
  Num Epochs = 3
  Num update steps per epoch = 100
  Total optimization steps = 300
{'loss': 2.3026, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.1}
{'loss': 2.1, 'grad_norm': 1.5, 'learning_rate': 4.8e-05, 'epoch': 0.2}
{'eval_loss': 2.05, 'eval_runtime': 1.2, 'eval_samples_per_second': 80.0, 'epoch': 0.2}
{'loss': 1.95, 'grad_norm': 0.9, 'learning_rate': 4.6e-05, 'epoch': 0.3}
"""

# Only the dicts (a notebook's output saved, a wrapper printing them): no bar, no banner.
HF_CONSOLE_DICTS = """\
{'loss': 2.3026, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.03}
{'loss': 2.1, 'grad_norm': np.float64(1.5), 'learning_rate': 4.8e-05, 'epoch': 0.07}
{'eval_loss': 2.05, 'eval_runtime': 1.2, 'eval_samples_per_second': 80.0, 'epoch': 0.1}
{'loss': nan, 'grad_norm': inf, 'learning_rate': 4.7e-05, 'epoch': 0.1}
{'loss': 1.95, 'grad_norm': 0.9, 'learning_rate': 4.6e-05, 'epoch': 0.13}
{'train_runtime': 100.1, 'train_samples_per_second': 29.9, 'train_steps_per_second': 3.0, 'train_loss': 2.0, 'epoch': 1.0}
"""

NANOGPT = """\
tokens per iteration will be: 491,520
iter 0: loss 10.9917, time 5126.47ms, mfu -100.00%
iter 10: loss 9.4371, time 312.15ms, mfu 42.11%
step 20: train loss 8.9123, val loss 8.9331
iter 20: loss 8.8012, time 311.90ms, mfu 42.13%
"""

LLMC = """\
step    1/74 | train loss 11.010029 | norm 15.4317 | lr 1.00e-06 | 3125.80 ms | 42.1% bf16 MFU | 167738 tok/s
step    2/74 | train loss 10.847216 | norm 13.9807 | lr 2.00e-06 | 311.39 ms | 42.3% bf16 MFU | 168383 tok/s
val loss 10.7
step    3/74 | train loss 10.532 | norm 12.5 | lr 3.00e-06 | 311.0 ms | 42.3% bf16 MFU | 168401 tok/s
"""

FAIRSEQ = """\
2021-03-01 10:00:00 | INFO | fairseq_cli.train | task: language_modeling
2021-03-01 10:00:10 | INFO | train_inner | epoch 001:    100 / 1000 loss=9.21, ppl=592.3, wps=12345.6, ups=1.2, wpb=4096, bsz=8, num_updates=100, lr=0.0005, gnorm=1.2, clip=0, train_wall=80, wall=90
| epoch 001 | loss 8.71 | ppl 418.9 | wps 12000 | ups 1.1 | num_updates 200 | lr 0.0005 | gnorm 1.1 |
2021-03-01 10:01:00 | INFO | train_inner | {"epoch": 1, "update": 0.3, "loss": "8.5", "ppl": "362", "num_updates": "300", "lr": "0.0005", "gnorm": "1.05"}
"""

# fairseq <= 0.9 printed its progress bars (`| ` before `epoch`); some versions also print running
# averages mid-validation. Run with --update-freq 4: four batches an update, and epoch 2's batch
# counter restarts; num_updates is the step.
FAIRSEQ_LEGACY = """\
| distributed init (rank 0): tcp://localhost:16011
| model transformer_lm_gpt, criterion CrossEntropyCriterion
| num. model params: 247037952 (num. trained: 247037952)
| epoch 001:    400 / 8000 loss=9.871, nll_loss=9.871, ppl=936.4, wps=41233, ups=1, wpb=32768.000, bsz=64.000, num_updates=100, lr=0.0005, gnorm=2.751, clip=0.000, oom=0.000, loss_scale=64.000, wall=80, train_wall=75
| epoch 001:    800 / 8000 loss=nan, nll_loss=nan, ppl=inf, wps=41250, ups=1, wpb=32768.000, bsz=64.000, num_updates=200, lr=0.0005, gnorm=inf, clip=1.000, oom=0.000, loss_scale=32.000, wall=160, train_wall=150
| epoch 001 | loss 9.5 | nll_loss 9.5 | ppl 724.08 | wps 41240 | ups 1 | wpb 32768.000 | bsz 64.000 | num_updates 2000 | lr 0.0005 | gnorm 2.4 | clip 0.000 | oom 0.000 | loss_scale 32.000 | wall 1600 | train_wall 1500
| epoch 001 | valid on 'valid' subset:    100 / 120 loss=7.3, nll_loss=7.3, ppl=157.6, num_updates=2000
| epoch 001 | valid on 'valid' subset | loss 7.2 | nll_loss 7.2 | ppl 147.03 | num_updates 2000
| saved checkpoint checkpoints/checkpoint1.pt (epoch 1 @ 2000 updates) (writing took 3.1 seconds)
| epoch 002:    400 / 8000 loss=7.01, nll_loss=7.01, ppl=128.9, wps=41300, ups=1, wpb=32768.000, bsz=64.000, num_updates=2100, lr=0.0005, gnorm=1.2, clip=0.000, oom=0.000, loss_scale=32.000, wall=1680, train_wall=1575
"""

# A trainer of fairseq's lineage that prints no num_updates: steps are counted in batches.
FAIRSEQ_NO_UPDATES = """\
| epoch 001 | loss 9.9 | ppl 955.2 | lr 0.0005
| epoch 001:    500 / 1500 loss=9.1, ppl=548.7, lr=0.0005, gnorm=1.9
| epoch 001:   1000 / 1500 loss=8.6, ppl=388.0, lr=0.0005, gnorm=1.7
| epoch 001 | loss 8.9 | ppl 477.7 | lr 0.0005 | gnorm 1.8
| epoch 001 | valid on 'valid' subset | loss 8.4 | ppl 337.8
| epoch 002:    500 / 1500 loss=8.1, ppl=274.4, lr=0.0005, gnorm=1.5
"""

# fairseq 0.6 (fairseq/train.py: get_training_stats formats `clip` as a percentage, get_valid_stats
# names its values `valid_loss`... itself; SimpleProgressBar.log/print in fairseq/progress_bar.py).
FAIRSEQ_06 = """\
| [en] dictionary: 40000 types
| epoch 001:   1000 / 331737 loss=6.872, nll_loss=5.125, ppl=34.90, wps=21234, ups=1.2, wpb=16384, bsz=512, num_updates=1000, lr=0.0005, gnorm=2.751, clip=100%, oom=0, loss_scale=64.000, wall=813
| epoch 001:   2000 / 331737 loss=6.101, nll_loss=4.525, ppl=23.02, wps=21301, ups=1.2, wpb=16384, bsz=512, num_updates=2000, lr=0.0005, gnorm=1.903, clip=62%, oom=0, loss_scale=64.000, wall=1626
| epoch 001 | loss 6.870 | nll_loss 5.130 | ppl 34.90 | wps 21240 | ups 1.2 | wpb 16384 | bsz 512 | num_updates 2500 | lr 0.0005 | gnorm 2.751 | clip 100% | oom 0 | loss_scale 64.000 | wall 2040 | train_wall 1900
| epoch 001 | valid on 'valid' subset | valid_loss 5.91 | valid_nll_loss 4.21 | valid_ppl 18.45 | num_updates 2500 | best 5.91
"""

# fairseq's JSON log (--log-format json through `logging`: JsonProgressBar.log/print in
# fairseq/logging/progress_bar.py; print() prefixes every value with the tag, num_updates too).
# The first validation ran before any update was logged and, as in versions that pass no
# num_updates to validate(), names no update count.
FAIRSEQ_JSON = """\
2020-10-12 09:12:01 | INFO | valid | {"epoch": 1, "valid_loss": "9.71", "valid_nll_loss": "9.71", "valid_ppl": "837.84", "valid_wps": "51234.5", "valid_wpb": "3421.1", "valid_bsz": "120.4"}
2020-10-12 09:13:01 | INFO | train_inner | {"epoch": 1, "update": 0.3, "loss": "8.5", "ppl": "362", "wps": "12345", "num_updates": "300", "lr": "0.0005", "gnorm": "1.05"}
2020-10-12 09:13:31 | INFO | train_inner | {"epoch": 1, "update": 0.31, "loss": "8.4", "ppl": "337", "wps": "12340", "num_updates": "310", "lr": "0.0005", "gnorm": "1.01"}
2020-10-12 09:14:01 | INFO | valid | {"epoch": 1, "valid_loss": "7.2", "valid_nll_loss": "7.2", "valid_ppl": "147.03", "valid_num_updates": "320", "valid_best_loss": "7.2"}
2020-10-12 09:15:01 | INFO | valid | {"epoch": 1, "valid_loss": "7.1", "valid_nll_loss": "7.1", "valid_ppl": "137.03"}
"""

# flashlight's ASR trainer (flashlight/app/asr/runtime/Logger.cpp getLogString: `key: value` items
# joined by " | ", `epoch` "%8d", `nupdates` "%12d", `loss` "%10.5f"), printed through glog
# (Train.cpp: LOG_MASTER(INFO) << logMsg) with its `I<mmdd> <time> <thread> <file>:<line>]` prefix.
FLASHLIGHT = """\
I0312 10:00:02.101234 31337 Train.cpp:412] Parsed flags: --arch=am_transformer_ctc.arch --lr=0.4 --batchsize=8
I0312 10:11:12.345678 31337 Train.cpp:580] epoch:        1 | nupdates:         1000 | lr: 0.100000 | lrcriterion: 0.000000 | scale-factor: 32768.000000 | runtime: 00:10:23 | bch(ms): 623.31 | smp(ms): 1.02 | fwd(ms): 210.12 | crit-fwd(ms): 10.55 | bwd(ms): 380.11 | optim(ms): 20.02 | loss:   42.51234 | train-TER: 85.32 | train-WER: 98.12 | dev-clean-loss:   30.12345 | dev-clean-TER: 70.12 | dev-clean-WER: 90.12 | avg-isz: 1234 | avg-tsz: 045 | max-tsz: 123 | avr-batchsize: 8.00 | hrs:  123.45 | thrpt(sec/sec): 234.56 | timestamp: 2020-03-12 10:11:12
I0312 10:21:12.345678 31337 Train.cpp:580] epoch:        1 | nupdates:         2000 | lr: 0.200000 | lrcriterion: 0.000000 | scale-factor: 16384.000000 | runtime: 00:20:23 | bch(ms): 621.10 | smp(ms): 1.01 | fwd(ms): 209.80 | crit-fwd(ms): 10.51 | bwd(ms): 379.95 | optim(ms): 20.01 | loss:        inf | train-TER: 84.90 | train-WER: 97.85 | dev-clean-loss:   29.80001 | dev-clean-TER: 69.50 | dev-clean-WER: 89.70 | avg-isz: 1230 | avg-tsz: 045 | max-tsz: 121 | avr-batchsize: 8.00 | hrs:  246.90 | thrpt(sec/sec): 235.01 | timestamp: 2020-03-12 10:21:12
"""

# wav2letter before `nupdates` (wav2letter src/runtime/Logger.cpp getStatus(verbose, " | "): `epoch`
# "%8d" first, no finer count), as its per-epoch log file holds it: the epoch is all the step there is.
WAV2LETTER_EPOCHS = """\
epoch:        1 | lr: 0.100000 | lrcriterion: 0.000000 | runtime: 01:02:03 | bch(ms): 623.31 | smp(ms): 1.02 | fwd(ms): 210.12 | crit-fwd(ms): 10.55 | bwd(ms): 380.11 | optim(ms): 20.02 | loss:   42.51234 | train-TER: 85.32 | dev-clean-TER: 70.12 | dev-clean-loss:   30.12345 | avg-isz: 1234 | avg-tsz: 045 | max-tsz: 123 | hrs:  123.45 | thrpt(sec/sec): 234.56
epoch:        2 | lr: 0.100000 | lrcriterion: 0.000000 | runtime: 02:04:05 | bch(ms): 622.01 | smp(ms): 1.01 | fwd(ms): 209.92 | crit-fwd(ms): 10.50 | bwd(ms): 380.02 | optim(ms): 20.00 | loss:   40.51234 | train-TER: 80.32 | dev-clean-TER: 60.12 | dev-clean-loss:   29.12345 | avg-isz: 1234 | avg-tsz: 045 | max-tsz: 123 | hrs:  246.90 | thrpt(sec/sec): 234.80
epoch:        3 | lr: 0.050000 | lrcriterion: 0.000000 | runtime: 03:06:07 | bch(ms): 621.77 | smp(ms): 1.00 | fwd(ms): 209.85 | crit-fwd(ms): 10.49 | bwd(ms): 379.90 | optim(ms): 19.98 | loss:        inf | train-TER: 78.02 | dev-clean-TER: 58.40 | dev-clean-loss:   28.70011 | avg-isz: 1234 | avg-tsz: 045 | max-tsz: 123 | hrs:  370.35 | thrpt(sec/sec): 235.10
"""

JSONL = """\
{"step": 1, "loss": 3.5, "lr": 1e-4, "grad_norm": 2.0}
{"step": 2, "loss": NaN, "lr": 1e-4, "grad_norm": Infinity}
{"step": 3, "loss": "nan", "lr": 1e-4, "note": "ok", "grad_norm": 1.5}
{"step": 3, "loss": 3.4, "lr": 1e-4}
{"step": 2, "loss": 3.6, "lr": 1e-4}
"""

LIGHTNING_CSV = """\
epoch,step,train_loss_step,val_loss,lr-AdamW
0,49,7.62,,0.001
0,99,7.10,,0.001
0,99,,7.3,
1,149,6.90,,0.0009
1,199,nan,,0.0009
"""

MEGATRON = """\
using world size: 8
 iteration      100/   1000 | consumed samples:  800 | learning rate: 1.000E-04 | global batch size:     8 | lm loss: 5.200000E+00 | loss scale: 4096.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |
[2022-01-19 13:09:13,305] [INFO] [stage_1_and_2.py:1644:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096.0, reducing to 2048.0
[default3]: iteration      101/   1000 | consumed samples:  808 | learning rate: 1.000E-04 | global batch size:     8 | lm loss: 5.100000E+00 | loss scale: 2048.0 | grad norm: 1.100 | number of skipped iterations:   1 | number of nan iterations:   0 |
-------------------------------------------------------------------------------------------------
 validation loss at iteration 101 | lm loss value: 5.050000E+00 | lm loss PPL: 1.560E+02 |
-------------------------------------------------------------------------------------------------
"""

TORCHTITAN = """\
[rank0]:2024-05-01 10:00:00,000 - root - INFO - step:  1  loss: 12.2345  memory: 30.12GiB(31.72%)  tps: 1,234  tflops: 45.6  mfu: 12.3%
[rank0]:2024-05-01 10:00:01,000 - root - INFO - step:  2  loss: 11.9876  grad_norm:  4.5678  memory: 30.12GiB(31.72%)  tps: 12,345,678  mfu: 12.3%
"""

DEEPSPEED = """\
[2024-03-01 10:00:01,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[9.9e-05, 9.9e-05], mom=[(0.9, 0.95), (0.9, 0.95)]
Epoch 0 | step 10 | loss 2.345
[2024-03-01 10:00:02,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=20, skipped=0, lr=[9.8e-05, 9.8e-05], mom=[(0.9, 0.95), (0.9, 0.95)]
Epoch 0 | step 20 | loss 2.301
[2024-03-01 10:00:03,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768
Epoch 0 | step 30 | loss 2.290
"""

# Composer's ConsoleLogger (llm-foundry's stdout), laid out as composer/loggers/console_logger.py
# prints it: a progress header, then a tab, a space and `Train name: value` / `Eval name: value`.
COMPOSER = """\
******************************
Config:
max_duration: 200ba
******************************
[batch=1/200]:
\t Train time/batch: 0
\t Train loss/train/total: 11.2345
\t Train lr-DecoupledAdamW/group0: 0.0000
\t Train l2_norm/grad_global: 5.4321
[batch=2/200]:
\t Train loss/train/total: 10.9876
\t Train lr-DecoupledAdamW/group0: 0.0001
\t Train l2_norm/grad_global: 4.3210
[Eval batch=1/10] Eval on eval data
[Eval batch=10/10] Eval on eval data:
\t Eval metrics/eval/LanguageCrossEntropy: 10.5000
\t Eval metrics/eval/LanguagePerplexity: 36315.5000
[epoch=2][batch=16/100]:
\t Train loss/train/total: 2.1000
[epoch=2][batch=17/100]:
\t Train loss/train/total: nan
"""


ALL = {
    "hf_console": ("train_stdout.txt", HF_CONSOLE),
    "hf_console_no_bar": ("stdout.log", HF_CONSOLE_NO_BAR),
    "kv_nanogpt": ("nanogpt.log", NANOGPT),
    "kv_llmc": ("llmc.log", LLMC),
    "fairseq": ("fairseq.log", FAIRSEQ),
    "fairseq_legacy": ("train.log", FAIRSEQ_LEGACY),
    "fairseq_no_updates": ("train.out", FAIRSEQ_NO_UPDATES),
    "fairseq_06": ("train06.log", FAIRSEQ_06),
    "fairseq_json": ("fairseq_json.log", FAIRSEQ_JSON),
    "kv_flashlight": ("001_log", FLASHLIGHT),
    "kv_torchtitan": ("titan.log", TORCHTITAN),
    "kv_deepspeed": ("ds.log", DEEPSPEED),
    "composer": ("composer.log", COMPOSER),
    "jsonl": ("metrics.jsonl", JSONL),
    "csv": ("metrics.csv", LIGHTNING_CSV),
    "megatron": ("megatron.log", MEGATRON),
}


def _with_console_samples() -> None:
    """Today's console formats (console_samples.py, bar_samples.py) are samples like the others."""
    from . import bar_samples, console_samples

    ALL.update(console_samples.ALL)
    ALL.update(bar_samples.ALL)


_with_console_samples()


def _tqdm_meter(n: int, total: int, elapsed: float) -> str:
    """tqdm's default bar (tqdm/std.py format_meter) when the output is not a terminal (no width:
    a 10-character bar of `Bar`'s unicode blocks): `{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}
    [{elapsed}<{remaining}, {rate_fmt}]`."""
    frac = n / total
    full, part = divmod(int(frac * 10 * 8), 8)
    bar = "█" * full + ((" ▏▎▍▌▋▊▉"[part] + " " * (10 - full - 1)) if full < 10 else "")
    clock = lambda t: f"{int(t) // 60:02d}:{int(t) % 60:02d}"  # noqa: E731 (format_interval)
    if not n or not elapsed:
        return f"{frac * 100:3.0f}%|{bar}| {n}/{total} [{clock(elapsed)}<?, ?it/s]"
    rate = n / elapsed
    speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
    return f"{frac * 100:3.0f}%|{bar}| {n}/{total} [{clock(elapsed)}<{clock((total - n) / rate)}, {speed}]"


def hf_trainer_console(curves: dict, *, logging_steps: int = 1, seconds_per_step: float = 0.002, first_step: float = 1.5) -> str:
    """What `python -u train.py > train_stdout.txt 2>&1` holds for a Trainer run over `curves`
    (synth.curves: a step, loss, lr and grad norm per step), tqdm and transformers' ProgressCallback
    (trainer_callback.py) playing out on a simulated clock (tqdm is not a dependency of the tests):

    - on_train_begin: `tqdm(total=max_steps)` draws its bar at 0 (status_printer: `\\r` + the bar +
      spaces over what the last draw left);
    - each step's on_step_end: `update(1)`, which redraws only when `mininterval` (0.1 s) has passed
      since the last redraw and at least `miniters` steps (tqdm's dynamic miniters, smoothing 0.3);
    - each `logging_steps`-th step's on_log: `write(str(logs))`, which clears the bar (`\\r`, spaces,
      `\\r`), writes the dict and a newline, then redraws the bar (`refresh`) at the same count;
    - the end: the summary dict, then `close()` (a last draw and a newline).
    The dicts hold what Trainer._maybe_log_save_evaluate logs (loss rounded to 4 places, the epoch
    to 2 by ProgressCallback)."""
    steps = curves["step"]
    total = int(steps[-1])
    per_epoch = total / 3
    out, last_len = [], 0
    state = {"last_print_n": 0, "last_print_t": 0.0, "miniters": 0.0}

    def draw(n: int, t: float) -> None:
        nonlocal last_len
        s = _tqdm_meter(n, total, t)
        out.append("\r" + s + " " * max(last_len - len(s), 0))
        last_len = len(s)

    draw(0, 0.0)
    t = 0.0
    for i, step in enumerate(steps):
        step = int(step)
        t += first_step if i == 0 else seconds_per_step
        dn, dt = step - state["last_print_n"], t - state["last_print_t"]
        if dn >= state["miniters"] and dt >= 0.1:
            draw(step, t)
            state["miniters"] = 0.3 * dn * (0.1 / dt) + 0.7 * state["miniters"]
            state["last_print_n"], state["last_print_t"] = step, t
        if step % logging_steps == 0:
            logs = {"loss": round(float(curves["loss"][i]), 4), "grad_norm": float(curves["grad_norm"][i]), "learning_rate": float(curves["lr"][i]), "epoch": round(step / per_epoch, 2)}
            out.append("\r" + " " * last_len + "\r")
            last_len = 0
            out.append(str(logs) + "\n")
            draw(step, t)
    out.append("\r" + " " * last_len + "\r")
    last_len = 0
    out.append(str({"train_runtime": round(t, 4), "train_samples_per_second": 100.0, "train_steps_per_second": round(total / t, 3), "train_loss": 2.5, "epoch": 3.0}) + "\n")
    draw(total, t)
    out.append("\n")
    return "".join(out)


def hf_trainer_state(curves: dict, *, logging_steps: int = 1) -> str:
    """The trainer_state.json of the same run: `log_history` as the Trainer keeps it (the full epoch,
    the step)."""
    import json

    steps = curves["step"]
    total = int(steps[-1])
    history = [
        {"epoch": int(s) / (total / 3), "grad_norm": float(curves["grad_norm"][i]), "learning_rate": float(curves["lr"][i]), "loss": round(float(curves["loss"][i]), 4), "step": int(s)}
        for i, s in enumerate(steps) if int(s) % logging_steps == 0
    ]
    return json.dumps({"epoch": 3.0, "global_step": total, "log_history": history, "max_steps": total, "logging_steps": logging_steps}, indent=2)
