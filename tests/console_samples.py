"""Console logs of today's trainers, laid out as each one's own logging code prints them (the file and
function are named at each), as small samples and as writers of a whole run's curves (synth.curves)."""

from __future__ import annotations

import math
import pprint

import numpy as np


def _mm_epoch_head(mode: str, epoch: int, i: int, n: int, max_epochs: int) -> str:
    """mmengine/runner/log_processor.py get_log_after_iter, by_epoch: the epoch right-aligned to the
    width of max_epochs (`[{epoch}]`.rjust(len(str(max_epochs)) + 3)), the batch to that of n."""
    return f"Epoch({mode}){f'[{epoch}]'.rjust(len(str(max_epochs)) + 3)}[{str(i).rjust(len(str(n)))}/{n}]  "


def _eta(seconds: int) -> str:
    import datetime

    return str(datetime.timedelta(seconds=seconds))  # get_log_after_iter: `eta: {timedelta}`


def mmengine(curves: dict, *, per_epoch: int = 300, max_epochs: int = 4, interval: int = 1) -> str:
    """An mmdetection run's log file (MMLogger's file handler: `%(asctime)s - %(name)s - INFO -
    %(message)s`, datefmt %Y/%m/%d %H:%M:%S): LogProcessor.get_log_after_iter's training lines (lr
    items `{:.4e}` joined by a space, then eta, time, data_time, memory, then the losses `{:.4f}`
    joined by two spaces), and after each epoch the validation's iteration lines and its
    get_log_after_epoch summary."""
    out = []
    for k, step in enumerate(curves["step"]):
        step = int(step)
        epoch, i = (step - 1) // per_epoch + 1, (step - 1) % per_epoch + 1
        if step % interval == 0:
            lr, loss, gn = curves["lr"][k], curves["loss"][k], curves["grad_norm"][k]
            out.append(
                f"2024/05/12 10:36:43 - mmengine - INFO - {_mm_epoch_head('train', epoch, i, per_epoch, max_epochs)}"
                f"base_lr: {lr:.4e} lr: {lr:.4e}  eta: {_eta(86400 + 3723 - step)}  time: 0.4012  data_time: 0.0103  memory: 3012  "
                f"grad_norm: {gn:.4f}  loss: {loss:.4f}  loss_rpn_cls: {loss * 0.2:.4f}  loss_cls: {loss * 0.5:.4f}  acc: 85.4492  loss_bbox: {loss * 0.3:.4f}"
            )
        if i == per_epoch:
            out.append(f"2024/05/12 11:36:43 - mmengine - INFO - {_mm_epoch_head('val', epoch, 100, 500, max_epochs)}  eta: 0:00:20  time: 0.0400  data_time: 0.0020  memory: 812  ")
            out.append(
                f"2024/05/12 11:37:43 - mmengine - INFO - Epoch(val) [{epoch}][500/500]    "
                "coco/bbox_mAP: 0.3670  coco/bbox_mAP_50: 0.5810  loss: 9.9000  data_time: 0.0041  time: 0.0432"
            )
    return "\n".join(out) + "\n"


MMENGINE = mmengine(
    {"step": np.array([1, 2, 3]), "lr": np.array([2e-4] * 3), "loss": np.array([2.7522, 2.6, float("nan")]), "grad_norm": np.array([3.0608, 3.0, 2.9])},
    per_epoch=2, max_epochs=12,
)

# mmsegmentation, iteration-based (IterBasedTrainLoop): `Iter(train) [{iter}/{max_iters}]`, the
# iteration right-aligned to max_iters' width; validation lines count their own dataloader.
MMSEG_ITER = """\
06/10 14:20:01 - mmengine - INFO - Iter(train) [  200/80000]  lr: 9.9777e-03  eta: 7:12:34  time: 0.3012  data_time: 0.0101  memory: 3012  loss: 2.7522  decode.loss_ce: 2.7522  decode.acc_seg: 30.1234
06/10 14:21:01 - mmengine - INFO - Iter(train) [  400/80000]  lr: 9.9553e-03  eta: 7:11:34  time: 0.3011  data_time: 0.0100  memory: 3012  loss: 2.5000  decode.loss_ce: 2.5000  decode.acc_seg: 33.1234
06/10 14:30:01 - mmengine - INFO - Iter(val) [ 50/500]    eta: 0:00:45  time: 0.1000  data_time: 0.0020  memory: 900  
06/10 14:31:01 - mmengine - INFO - Iter(val) [500/500]    aAcc: 80.1200  mIoU: 40.2100  mAcc: 50.1000  data_time: 0.0021  time: 0.1012
06/10 14:32:01 - mmengine - INFO - Iter(train) [  600/80000]  lr: 9.9330e-03  eta: 7:10:34  time: 0.3010  data_time: 0.0100  memory: 3012  loss: 2.4000  decode.loss_ce: 2.4000  decode.acc_seg: 35.1234
"""


def llmc(curves: dict, *, val_every: int = 250) -> str:
    """llm.c's `-o` log file, main.log (llmc/logger.h: logger_log_val `s:%d tel:%.4f`,
    logger_log_eval `s:%d eval:%.4f`, logger_log_train `s:%d trl:%.4f lr:%.6f norm:%.2f`), in the
    order train_gpt2.cu's loop writes them: a step's validation and HellaSwag first, then its train line."""
    out = []
    for k, step in enumerate(curves["step"]):
        step = int(step)
        if step % val_every == 0:
            out.append(f"s:{step} tel:{curves['loss'][k] + 0.1:.4f}")
            out.append(f"s:{step} eval:0.2550")
        out.append(f"s:{step} trl:{curves['loss'][k]:.4f} lr:{curves['lr'][k]:.6f} norm:{curves['grad_norm'][k]:.2f}")
    return "\n".join(out) + "\n"


LLMC_MAIN = "s:0 tel:11.0123\ns:0 eval:0.2500\ns:0 trl:11.0112 lr:0.000000 norm:15.43\ns:1 trl:10.9001 lr:0.000006 norm:13.98\ns:2 trl:nan lr:0.000012 norm:inf\n"


def format_float(value: float) -> str:
    """olmo_core/utils.py format_float, as the console prints every metric."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    a = abs(value)
    if a == 0.0:
        return "0.0"
    if a >= 1e9:
        for suffix, factor in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("B", 1e9)):
            if a >= factor:
                scaled = value / factor
                decimals = 1 if abs(scaled) > 100 else 2 if abs(scaled) > 10 else 3 if abs(scaled) > 1 else 4
                return f"{scaled:,.{decimals}f}{suffix}"
    if a < 0.0001:
        return f"{value:.2E}"
    if a >= 1000:
        return f"{int(value):,d}"
    return f"{value:.1f}" if a > 100 else f"{value:.2f}" if a > 10 else f"{value:.3f}" if a > 1 else f"{value:.4f}"


_OLMO_PREFIX = "2025-01-01 10:00:{:02d}.123\tjupiter-cs-aus-101:0\tolmo_core.train.callbacks.console_logger:{}\tINFO\t"


def olmo_core(curves: dict, *, max_steps: int | None = None, metrics_every: int = 1, eval_every: int = 0) -> str:
    """OLMo-core's console through its plain handler (olmo_core/utils.py setup_logging: `%(asctime)s
    \\t%(hostname)s:%(local_rank)s\\t%(name)s:%(lineno)s\\t%(levelname)s\\t%(message)s`):
    ConsoleLoggerCallback.log_metrics's marker and `    {name}={format_float(value)}` lines at metric
    steps (step 1 and every metrics_log_interval), post_step's bare marker at the others; an
    EvaluatorCallback.perform_eval block every `eval_every` steps."""
    total = max_steps or int(curves["step"][-1])
    out = []
    for k, step in enumerate(curves["step"]):
        step = int(step)
        if step == 1 or step % metrics_every == 0:
            out.append(_OLMO_PREFIX.format(step % 60, 76) + f"[step={step}/{total},epoch=0,eta=1h2m3s]")
            loss = float(curves["loss"][k])
            for name, value in (
                ("train/CE loss", loss), ("train/PPL", math.exp(min(loss, 700))), ("train/Z loss", 1.2e-05),
                ("optim/total grad norm", float(curves["grad_norm"][k])), ("optim/LR (group 0)", float(curves["lr"][k])),
                ("throughput/total tokens", step * 4_194_304.0), ("throughput/device/TPS", 12345.6),
            ):
                out.append(f"    {name}={format_float(value)}")
        else:
            out.append(_OLMO_PREFIX.format(step % 60, 60) + f"[step={step}/{total},epoch=0]")
        if eval_every and step % eval_every == 0:
            out.append("2025-01-01 10:00:00.000\tjupiter-cs-aus-101:0\tolmo_core.train.callbacks.evaluator_callback:135\tINFO\tRunning lm evals...")
            out.append("2025-01-01 10:00:00.000\tjupiter-cs-aus-101:0\tolmo_core.train.callbacks.evaluator_callback:174\tINFO\tFinished lm evals in 12.3 seconds. Metrics:")
            out.append(f"    c4_en-validation/CE loss={format_float(float(curves['loss'][k]) + 0.1)}")
            out.append("    c4_en-validation/PPL=24.53")
            out.append("2025-01-01 10:00:00.000\tjupiter-cs-aus-101:0\tolmo_core.train.callbacks.evaluator_callback:197\tINFO\tEvaluation speed:")
            out.append("    c4_en-validation/CE loss (+variants): 12.3 sec (10 batches)")
            out.append("    Total evaluation time: 12.3 seconds (10 batches)")
    return "\n".join(out) + "\n"


OLMO_CORE = olmo_core(
    {"step": np.array([1, 2, 3, 4]), "loss": np.array([10.91, 10.5, 9.812, float("nan")]), "grad_norm": np.array([3.21, 2.0, 1.234, 1.0]), "lr": np.array([2e-05, 4e-05, 6e-05, 8e-05])},
    max_steps=5000, metrics_every=3, eval_every=3,
)


def composer_file(curves: dict) -> str:
    """Composer's FileLogger file (composer/loggers/file_logger.py): log_metrics writes
    `[metric][batch={step}]: ` then `{name}: {format_log_data_value(value)} \\n` (floats `{:.4f}`,
    composer/loggers/logger.py), a line per metric; what it captures of stdout is prefixed
    `[stdout]: ` line by line (write), the ConsoleLogger's output among it."""
    out = ['[hyperparameter]: run_name: "mpt-125m" ', "[hyperparameter]: seed: 17 "]
    for k, step in enumerate(curves["step"]):
        step = int(step)
        loss, lr, gn = (float(curves[m][k]) for m in ("loss", "lr", "grad_norm"))
        out.append(f"[stdout]: [batch={step}/{int(curves['step'][-1])}]:")
        out.append(f"[stdout]: \t Train loss/train/total: {loss * 10:.4f}")
        for name, value in (("time/batch", step), ("loss/train/total", loss), ("lr-DecoupledAdamW/group0", lr), ("l2_norm/grad_global", gn)):
            out.append(f"[metric][batch={step}]: {name}: {value if isinstance(value, int) else f'{value:.4f}'} ")
    return "\n".join(out) + "\n"


COMPOSER_FILE = composer_file({"step": np.array([1, 2]), "loss": np.array([11.2345, float("nan")]), "lr": np.array([0.0, 0.0001]), "grad_norm": np.array([5.4321, 4.321])})


def clu(curves: dict) -> str:
    """clu's LoggingWriter (clu/metric_writers/logging_writer.py write_scalars: `[%d]%s %s`, the
    scalars sorted by name, a float `{k}={v:.6g}`) through absl's log line prefix
    (`I<mmdd> <time> <thread> <file>:<line>] `); its other writes name no scalar."""
    out = ["I0312 10:00:00.000001 140000 logging_writer.py:64] [Hyperparameters] {'learning_rate': 0.001, 'num_train_steps': 1200}"]
    for k, step in enumerate(curves["step"]):
        scalars = {"learning_rate": float(curves["lr"][k]), "loss": float(curves["loss"][k]), "grad_norm": float(curves["grad_norm"][k]), "train_accuracy": 0.5}
        values = ", ".join(f"{name}={value:.6g}" for name, value in sorted(scalars.items()))
        out.append(f"I0312 10:00:{int(step) % 60:02d}.123456 140000 logging_writer.py:48] [{int(step)}] {values}")
        if int(step) % 100 == 0:
            out.append(f"I0312 10:00:00.123456 140000 logging_writer.py:40] [{int(step)}] Got raw tensors: {{'attention': (8, 128)}}.")
    return "\n".join(out) + "\n"


CLU = clu({"step": np.array([100, 200, 300]), "loss": np.array([3.2, 3.0, float("nan")]), "lr": np.array([0.001] * 3), "grad_norm": np.array([1.5, 1.25, 1.0])})


def _verl_line(step: int, metrics: dict, *, legacy: bool) -> str:
    """verl/utils/logger/aggregate_logger.py concat_dict_to_str: `step:{step}`, then each number
    `{k}:{pprint.pformat(v)}` (before July 2025 `{k}:{v:.3f}`), joined by ` - `. Its metrics are
    NumPy's means (verl/utils/metric/utils.py reduce_metrics): pformat writes `np.float64(...)`."""
    parts = [f"step:{step}"] + [f"{k}:{v:.3f}" if legacy else f"{k}:{pprint.pformat(v)}" for k, v in metrics.items()]
    return " - ".join(parts)


def verl(curves: dict, *, legacy: bool = False) -> str:
    """verl's console backend (verl/utils/tracking.py Tracking(default_backend='console') ->
    LocalLogger.log: print), under Ray's `(TaskRunner pid=...)` prefix; step 0 is the validation
    before training (val-core/... names)."""
    out = ["(TaskRunner pid=4072644) " + _verl_line(0, {"val-core/openai/gsm8k/acc/mean@1": np.float64(0.508)}, legacy=legacy)]
    for k, step in enumerate(curves["step"]):
        metrics = {
            "actor/entropy": np.float64(0.323), "actor/pg_loss": np.float64(curves["loss"][k]), "actor/pg_clipfrac": np.float64(0.001),
            "actor/grad_norm": np.float64(curves["grad_norm"][k]), "actor/lr": float(curves["lr"][k]), "training/global_step": int(step),
            "critic/vf_loss": np.float64(0.25), "critic/score/mean": 0.558, "critic/rewards/mean": 0.558, "response_length/mean": 288.698,
        }
        out.append("(TaskRunner pid=4072644) " + _verl_line(int(step), metrics, legacy=legacy))
    return "\n".join(out) + "\n"


_VERL_CURVES = {"step": np.array([1, 2]), "loss": np.array([0.0123, float("nan")]), "grad_norm": np.array([0.279, 0.3]), "lr": np.array([1e-06, 1e-06])}
VERL = verl(_VERL_CURVES)
VERL_LEGACY = verl(_VERL_CURVES, legacy=True)


def openrlhf(curves: dict, *, eval_every: int = 100) -> str:
    """OpenRLHF's PPO trainer (openrlhf/trainer/ppo_trainer.py fit: `logger.info(f"✨ Global step
    {global_step}: {log_status}")`, evaluate: `... global_step {global_step}, eval_metrics: {logs}`)
    through its logger (openrlhf/utils/logging_utils.py: `%(levelname)s %(asctime)s
    %(filename)s:%(lineno)d] %(message)s`), among the prompt bar tqdm draws (pbar.update(prompts_consumed))."""
    out = []
    for k, step in enumerate(curves["step"]):
        step = int(step)
        status = {
            "policy_loss": float(curves["loss"][k]), "actor_lr": float(curves["lr"][k]), "actor_grad_norm": float(curves["grad_norm"][k]),
            "kl": 0.0012, "response_length": 512.3, "critic_loss": 0.05, "critic_lr": 5e-06, "timing/make_experience": 12.3,
        }
        out.append(f"INFO 08-13 19:25:45 ppo_trainer.py:547] ✨ Global step {step}: {status}")
        out.append(f"Episode [1/1]:  {step % 100:2d}%|▏         | {step * 8}/{len(curves['step']) * 8} [00:20<16:00, 10.00s/it]")
        if step % eval_every == 0:
            out.append(f"INFO 08-13 19:27:45 ppo_trainer.py:594] ✨ Evaluation completed in 0:01:02, global_step {step}, eval_metrics: {{'eval_pass1': 0.5, 'eval_response_length': 480.0}}")
    return "\n".join(out) + "\n"


OPENRLHF = openrlhf({"step": np.array([1, 2, 3]), "loss": np.array([0.0123, 0.0125, float("nan")]), "lr": np.array([1e-06, 2e-06, 3e-06]), "grad_norm": np.array([0.41, 0.39, 0.38])}, eval_every=2)


def fairseq_2017(curves: dict, *, per_epoch: int = 400) -> str:
    """fairseq-py's first release (2017-09, fairseq/progress_bar.py simple_progress_bar.__iter__:
    `'{} {:5d} / {:d} {}'.format(desc, i, size, postfix)`, desc `| epoch {:03d}` and the postfix
    tqdm's set_postfix of train.py's stats, `loss` as `'{:.2f} ({:.2f})'` of the batch's loss and
    its running average); an epoch's end: train.py's `| train loss` summary and validate's."""
    out = ["| [de] dictionary: 24898 types", "| model fconv_iwslt_de_en"]
    for k, step in enumerate(curves["step"]):
        step = int(step)
        epoch, i = (step - 1) // per_epoch + 1, (step - 1) % per_epoch + 1
        loss, gn = float(curves["loss"][k]), float(curves["grad_norm"][k])
        postfix = f"loss={loss:.2f} ({loss + 0.3:.2f}), wps=12345, wpb=4096, bsz=128, lr=0.25, clip=100%, gnorm={gn:.4f}"
        out.append(f"| epoch {epoch:03d} {i:5d} / {per_epoch} {postfix}")
        if i == per_epoch:
            out.append(f"| epoch {epoch:03d} | train loss {loss:2.2f} | train ppl {2 ** min(loss, 60):3.2f} | s/checkpoint    1234 | words/s  12345 | words/batch   4096 | bsz   128 | lr 0.250000 | clip 100% | gnorm {gn:.4f}")
            out.append(f"| epoch {epoch:03d} | valid on 'valid' subset | valid loss {loss + 0.2:2.2f} | valid ppl {2 ** min(loss, 60):3.2f}")
    return "\n".join(out) + "\n"


FAIRSEQ_2017 = fairseq_2017({"step": np.array([1, 2, 3]), "loss": np.array([9.57, 9.17, 8.97]), "grad_norm": np.array([1.2345, 1.1345, 1.0])}, per_epoch=2)


def capitalised_dicts(curves: dict) -> str:
    """A training script's own `print({'Epoch': epoch, 'Step': step, 'Loss': loss, 'LR': lr})` (print of
    a dict: Python's repr), the names capitalised."""
    return "".join(
        f"{ {'Epoch': 1 + int(s) // 400, 'Step': int(s), 'Loss': round(float(v), 4), 'LR': float(lr)} }\n" for s, v, lr in zip(curves["step"], curves["loss"], curves["lr"])
    )


CAPITALISED_DICTS = capitalised_dicts({"step": [100, 200, 300], "loss": [0.287, 0.2, float("nan")], "lr": [1e-3, 1e-3, 5e-4]})
EPOCH_DICTS = "{'Epoch': 1, 'Loss': 0.287}\n{'Epoch': 2, 'Loss': 0.2}\n{'Epoch': 3, 'Loss': 0.187}\n"
"""Only the epoch: numbered, as the HF console's dicts with no step are (a warning says so)."""


def plural_steps(curves: dict) -> str:
    """Optimus' VAE pretraining (microsoft/Optimus, code/examples/big_ae/run_lm_vae_pretraining_phdist_beta.py,
    train(): `logger.info("Steps {}, Rank {}, File {}, Epoch: [{}/{}][{}/{}], Beta: {}, Loss: {}, kl_Loss: {}, ppl: {}".format(...))`,
    the losses torch tensors, so their repr) through the transformers examples' logging format."""
    out = []
    for k, step in enumerate(curves["step"]):
        loss = float(curves["loss"][k])
        out.append(
            f"06/10/2020 14:20:01 - INFO - __main__ -   Steps {int(step)}, Rank 0, File 3, Epoch: [0/1.0][{int(step)}/100000], Beta: 0.5, "
            f"Loss: tensor({loss:.4f}, device='cuda:0', grad_fn=<MeanBackward0>), kl_Loss: tensor({loss / 10:.4f}, device='cuda:0', grad_fn=<MeanBackward0>), "
            f"ppl: tensor({math.exp(min(loss, 80)):.4f}, device='cuda:0')"
        )
    return "\n".join(out) + "\n"


PLURAL_STEPS = plural_steps({"step": np.array([100, 200]), "loss": np.array([8.43, 8.03])})

# torchtitan/tools/utils.py Color: the escapes MetricsProcessor prints between its words (on unless
# `--metrics.disable_color_printing`).
_TITAN_COLOR = {"red": "\033[31m", "green": "\033[32m", "yellow": "\033[33m", "blue": "\033[34m", "magenta": "\033[35m",
                "cyan": "\033[36m", "orange": "\033[38;2;180;60;0m", "turquoise": "\033[38;2;54;234;195m", "reset": "\033[39m"}
_TITAN_PREFIX = "[rank0]:[titan] 2026-08-22 10:00:{:02d},123 - root - INFO - "
"""torchtitan/tools/logging.py init_logger: `[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s`,
after torchrun's `--local-ranks-filter`/`--tee` rank prefix."""


def torchtitan(curves: dict, *, val_every: int = 100) -> str:
    """torchtitan/components/metrics.py MetricsProcessor.log's training lines (`step: {step:2}  loss:
    {loss:7.4f}  grad_norm: {grad_norm:7.4f}  memory: ...GiB(...%)  tps: {tps:,}  tflops: ...  mfu:
    ...%`, each field after its colour) and log_validation's (`validate step: {step:2}  loss: ...`,
    at the training step the validator ran at, trainer.py), the validation loss above the training's."""
    c = _TITAN_COLOR
    out = []
    for k, step in enumerate(curves["step"]):
        step, loss, gn = int(step), curves["loss"][k], curves["grad_norm"][k]
        out.append(
            _TITAN_PREFIX.format(k % 60) + f"{c['red']}step: {step:2}  {c['green']}loss: {loss:7.4f}  {c['orange']}grad_norm: {gn:7.4f}  "
            f"{c['turquoise']}memory: 60.12GiB(75.34%)  {c['blue']}tps: {6543:,}  {c['cyan']}tflops: 378.12  {c['magenta']}mfu: 31.23%{c['reset']}"
        )
        if step % val_every == 0:
            out.append(_TITAN_PREFIX.format(k % 60) + f"{c['yellow']}validate step: {step:2}  {c['green']}loss: {loss * 2.5:7.4f}  "
                       f"{c['turquoise']}memory: 60.12GiB(75.34%)  {c['blue']}tps: {7001:,}{c['reset']}")
    return "\n".join(out) + "\n"


TORCHTITAN = torchtitan({"step": np.array([1, 2, 3]), "loss": np.array([10.9095, 10.5, float("nan")]), "grad_norm": np.array([2.0088, 1.9, 1.8])}, val_every=2)


def maxtext(curves: dict, *, eval_every: int = 100, eval_steps: int = 3) -> str:
    """MaxText's metric_logger.py (src/maxtext/common/metric_logger.py) through absl's logging
    (`I0822 10:00:22.222206 139872261 metric_logger.py:230] `): _log_training_metrics' `completed step:
    N, seconds: ..., TFLOP/s/device: ..., Tokens/s/device: ..., total_weights: ..., loss: ...`,
    and every eval_every steps _log_running_eval_metrics' `Completed eval step: k, ... running
    loss=...` for each eval batch k, then _log_eval_metrics' `Completed eval after train step N,
    loss=..., perplexity=...`, the eval loss above the training's."""
    out = []

    def log(msg: str) -> None:
        out.append(f"I0822 10:00:{len(out) % 60:02d}.222206 139872261 metric_logger.py:230] {msg}")

    for k, step in enumerate(curves["step"]):
        step, loss = int(step), curves["loss"][k]
        log(f"completed step: {step}, seconds: 1.213, TFLOP/s/device: 160.123, Tokens/s/device: 6754.321, total_weights: 196608, loss: {loss:.3f}")
        if step % eval_every == 0:
            for e in range(eval_steps):
                log(f"Completed eval step: {e}, seconds: 0.300, running loss={loss * 2.5:.3f}, running perplexity=41587.212, running total_weights=196608.0")
            log(f"Completed eval after train step {step}, loss={loss * 2.5:.3f}, perplexity=41587.212, total_weights=983040.0, avg_z_loss=0.000")
    return "\n".join(out) + "\n"


MAXTEXT = maxtext({"step": np.array([0, 1, 2, 3]), "loss": np.array([10.9, 10.5, float("nan"), 10.1])}, eval_every=2)


def timm(curves: dict, *, per_epoch: int = 300) -> str:
    """timm's train.py (huggingface/pytorch-image-models): train_one_epoch's `Train: {epoch}
    [{update_idx:>4d}/{updates_per_epoch} ({pct:>3.0f}%)]  Loss: {loss_now:#.3g} ({loss_avg:#.3g})
    Time: ...  LR: {lr:.3e}  Data: ...` (epoch and update counted from 0), and after each epoch
    validate's `Test: [{batch_idx:>4d}/{last_idx}]  Time: ...  Loss: {val:>7.3f} ({avg:>6.4f})
    Acc@1: ...` lines, through timm/utils/log.py's file handler (`%(asctime)s - %(name)20s:
    [%(levelname)8s] - %(message)s`)."""
    out = []
    prefix = "2024-05-12 10:36:43,123 -                train: [    INFO] - "
    for k, step in enumerate(curves["step"]):
        epoch, i = divmod(int(step), per_epoch)
        loss, lr = curves["loss"][k], curves["lr"][k]
        out.append(
            prefix + f"Train: {epoch} [{i:>4d}/{per_epoch} ({100.0 * (i + 1) / per_epoch:>3.0f}%)]  Loss: {loss:#.3g} ({loss:#.3g})  "
            f"Time: 0.312s,  820.51/s  (0.320s,  800.00/s)  LR: {lr:.3e}  Data: 0.010 (0.012)"
        )
        if i == per_epoch - 1:
            for b in (0, 49):
                out.append(prefix.replace("train", "validate") + f"Test: [{b:>4d}/49]  Time: 0.500 (0.400)  Loss: {loss * 1.5:>7.3f} ({loss * 1.5:>6.4f})  Acc@1:  70.000 ( 69.500)")
    return "\n".join(out) + "\n"


TIMM = timm({"step": np.array([0, 1, 2, 3]), "loss": np.array([6.91, 6.86, float("nan"), 6.5]), "lr": np.array([1e-5, 1e-5, 2e-5, 2e-5])}, per_epoch=2)


def build_nanogpt(curves: dict, *, eval_every: int = 250) -> str:
    """karpathy/build-nanogpt's train_gpt2.py `log/log.txt`: every `eval_every` steps (and the last)
    `f"{step} val {val_loss_accum.item():.4f}\\n"` and `f"{step} hella {acc_norm:.4f}\\n"`, then
    every step `f"{step} train {loss_accum.item():.6f}\\n"`."""
    out = []
    steps = [int(s) for s in curves["step"]]
    for k, step in enumerate(steps):
        loss = curves["loss"][k]
        if step % eval_every == 0 or k == len(steps) - 1:
            out.append(f"{step} val {loss * 1.05:.4f}")
            out.append(f"{step} hella {0.25 + step / 1e5:.4f}")
        out.append(f"{step} train {loss:.6f}")
    return "\n".join(out) + "\n"


BUILD_NANOGPT = build_nanogpt({"step": np.array([0, 1, 2, 3]), "loss": np.array([10.955029, 10.284193, float("nan"), 9.5])}, eval_every=2)


ALL = {
    "mmengine_epochs": ("20240512_103600.log", MMENGINE),
    "mmengine_iters": ("20240610_142000.log", MMSEG_ITER),
    "llmc_main": ("main.log", LLMC_MAIN),
    "olmo_core": ("train.log", OLMO_CORE),
    "composer_file": ("logs-rank0.txt", COMPOSER_FILE),
    "clu": ("train.INFO", CLU),
    "verl": ("verl_demo.log", VERL),
    "verl_legacy": ("verl_old.log", VERL_LEGACY),
    "openrlhf": ("train_ppo.log", OPENRLHF),
    "fairseq_2017": ("train.log", FAIRSEQ_2017),
    "capitalised_dicts": ("stdout.txt", CAPITALISED_DICTS),
    "plural_steps": ("pretrain.log", PLURAL_STEPS),
    "torchtitan": ("train.log", TORCHTITAN),
    "maxtext": ("train.log", MAXTEXT),
    "timm": ("train.log", TIMM),
    "build_nanogpt": ("log.txt", BUILD_NANOGPT),
}
"""name -> (file name, text). Each is also in samples.ALL (sniffing, reading in pieces)."""
