"""Which canonical metric a tag means, from its words rather than from a list of spellings.

Trainers combine namespaces and spellings freely (`optim/grad_norm`, `optim/total grad norm`,
`Train/Samples/train_loss`, `lr-AdamW/pg1`), so a list of whole tags always misses the next one and a
missed grad norm silently turns a gradient explosion into a "bad batch". A tag is read instead:

1. split into words: `/ . - _ ( ) %` and spaces separate, camelCase splits (`CrossEntropyLoss`), case
   is ignored;
2. leading namespaces are dropped (`train/ training/ optim/ optimizer/ trainer/ metrics/
   loss_metrics/ Train/Samples/`); `eval/ val/ valid/ validation/ test/` anywhere make it an eval
   tag; `train` anywhere is dropped (`train_loss`, `loss/train/total`);
3. a Lightning `_step` suffix is the per-step value, an `_epoch` suffix or an `epoch_` prefix (Keras)
   an epoch aggregate;
4. what is left must be one of a metric's spellings (VOCABULARY), or `lr` followed by an optimizer
   name and/or a param group (`lr-AdamW/pg1`, `optim/LR (group 0)`, `learning_rate_group0`).

Short words some loggers print: llm.c's `trl` (train loss) and `tel` (its eval loss), `norm` and
`gnorm` (the grad norm).

Reinforcement learning (verl, OpenRLHF): `actor/` is a namespace, and so is a leading `actor`
word (OpenRLHF's `actor_lr`, `actor_grad_norm`), so the policy's optimizer metrics are the run's
(`actor/grad_norm`, `actor/lr`), and its policy-gradient loss (verl's `actor/pg_loss`, OpenRLHF's
`policy_loss`) is the loss: the one objective the optimizer steps on (a spike there is a bad update, as in
pretraining), though it hovers near 0 and changes sign, where a language model's loss only falls.
`critic/` is not a namespace: the value model's loss and grad norm (`critic/vf_loss`,
`critic/grad_norm`, `critic_loss`) keep their own names, as do the reward curves (`critic/score/mean`,
`critic/rewards/mean`), readable by name; a rule on them is the user's choice.

Anything else keeps its own name: an extra word changes the meaning (`grad_norm_clip`, `moe_aux_loss`,
`lr-Adam-momentum`, Megatron's `lm loss vs samples`, whose x axis is samples, not steps).

Precedence, when several tags of one run mean one metric (lower rank wins, see `streams.preferred`):
0 the user's [aliases]; 1 the canonical name itself (`loss`); 2 any other spelling (`train/loss`,
`train_loss_step`); 3 a test-set loss, as eval_loss; 4 an epoch aggregate (`train_loss_epoch`).
Eval, val and test losses are eval_loss or nothing, never loss.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

RANK_USER, RANK_CANONICAL, RANK_SPELLING, RANK_TEST, RANK_AGGREGATE, RANK_PARTS = 0, 1, 2, 3, 4, 5
PARTS_SEPARATOR = " + "
"""Between the names of a loss's parts in the tag of their sum (detection.loss_parts): the sum of a
run's parts ranks below every tag that names its loss itself (RANK_PARTS)."""
NOT_PARTS = {"dev", "heldout", "holdout", "best", "final", "min", "max", "std", "target", "ref", "reference"}
"""Words that make a loss-like name something else than a training loss's part: another split's, a
record's, a statistic's, a goal's."""

CANONICAL = ("loss", "eval_loss", "lr", "grad_norm", "loss_scale", "step_time", "throughput")

# Each metric's spellings, as words after normalisation. Qualifiers are listed whole, not combined
# freely: `reduced loss` is NeMo's per-step loss, `reduced lm loss` one of its components.
VOCABULARY: dict[str, tuple[str, ...]] = {
    "loss": (
        "loss", "lm loss", "ce loss", "cross entropy loss", "avg loss", "average loss", "mean loss",
        "running loss", "batch loss", "reduced loss", "global avg loss", "total loss", "loss total",
        "trl", "pg loss", "policy loss",
    ),
    "eval_loss": ("tel",),
    "lr": ("lr", "learning rate"),
    "grad_norm": (
        "grad norm", "gnorm", "norm", "gradient norm", "total norm", "total grad norm", "grad l2 norm",
        "grad norm total", "grad 2 0 norm total", "l2 norm grad global",
    ),
    "loss_scale": ("loss scale", "grad scale", "scaler scale", "overflow loss scale"),
    # The time of one step, in whatever unit the tag says (rules compare a run with itself). Not
    # `train_runtime` (HF's whole run) nor modded-nanogpt's `step_avg` (a running mean since step 0,
    # which a slowdown moves only slowly); nanoGPT prints `time 151.20ms`, build-nanogpt `dt`.
    "step_time": (
        "elapsed time per iteration", "time", "dt", "iter time", "iteration time", "step time", "time per step",
        "time per iteration", "step timing", "batch time", "time per batch", "elapsed time per step",
    ),
    # A rate of work, higher is faster: tokens, samples, images or words a second, FLOPs, MFU.
    "throughput": (
        "throughput", "tps", "tokens per sec", "tokens per second", "tokens per s", "tokens s", "tokens sec",
        "tok sec", "tok s", "toks sec", "toks s", "samples per sec", "samples per second", "samples s", "samples sec",
        "images per sec", "images per second", "img s", "img sec", "wps", "mfu", "tflops", "tflop s", "tflop s gpu",
        "throughput per gpu tflop s gpu", "tflops per gpu", "model tflops", "bps",
    ),
}
PACE = ("step_time", "throughput")
UNIT_WORDS = {"ms", "s", "sec", "secs", "seconds", "in"}
"""Trailing unit words of a step time (`elapsed time per iteration (ms)`, NeMo's `train_step_timing in s`)."""
RUN_SUMMARIES = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second"}
"""HF Trainer's end-of-run summary: one value for the whole run, not a step's pace."""
# Spellings that are the loss only on an eval set (Composer's eval metric, Megatron's validation line).
EVAL_ONLY = ("language cross entropy", "lm loss value")

# Leading path segments that only say where a metric was logged.
NAMESPACES = {"optim", "optimizer", "trainer", "metrics", "loss metrics", "samples", "actor", "ray", "tune", "throughput", "device", "perf", "timing", "speed"}
"""(`ray/tune/`: Ray Tune's TensorBoard logger puts every reported result under it; OLMo-core's
`throughput/device/TPS`, whose `throughput/total tokens`, a count, is no rate.)"""
LEADING = {"actor", "current"}
"""A first word that, like a namespace, only says where the metric was logged (`actor_lr`), or
when: BigDL's `Current learning rate is 0.01` is the learning rate."""
TRAIN_WORDS = {"train", "training"}
EVAL_WORDS = {"eval", "evaluation", "val", "valid", "validation"}
TEST_WORDS = {"test"}
MARKERS = TRAIN_WORDS | EVAL_WORDS | TEST_WORDS
# Words after `lr` that make it something else than the learning rate.
NOT_LR = {
    "momentum", "weight", "decay", "wd", "beta", "betas", "beta1", "beta2", "eps", "scale", "ratio", "min",
    "max", "mult", "multiplier", "factor", "warmup", "schedule", "scheduler", "base", "init", "initial",
    "peak", "end", "final", "update", "vs", "samples", "tokens",
}
_GROUP = re.compile(r"^(?:group|pg|param|groups?\d+|pg\d+|\d+)$")

_SPELLINGS = {tuple(s.split()): m for m, spellings in VOCABULARY.items() for s in spellings}
_EVAL_SPELLINGS = {tuple(s.split()) for s in EVAL_ONLY}


@dataclass(frozen=True)
class Match:
    metric: str
    rank: int


def words(text: str) -> list[str]:
    """`optim/LR (group 0)` -> optim lr group 0; `train/CrossEntropyLoss` -> train cross entropy loss."""
    text = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", text)
    return re.findall(r"[a-z0-9]+", text.lower())


@lru_cache(maxsize=4096)
def recognise(tag: str) -> Match | None:
    """The canonical metric `tag` means by the built-in vocabulary, or None. Pure and cached: the
    daemon asks again for every chunk it reads."""
    if tag.lower() in CANONICAL:
        return Match(tag.lower(), RANK_CANONICAL)
    if tag.rsplit("/", 1)[-1].lower() in RUN_SUMMARIES:
        return None
    raw = [r for r in tag.split("/") if words(r)]
    if not raw:
        return None
    # HF writes its end-of-run summary as train/train_loss, train/train_runtime: not the curve.
    if len(raw) > 1 and words(raw[0]) == ["train"] and words(raw[1])[0] == "train":
        return None
    evaluated = tested = False
    while len(raw) > 1 and _namespace(words(raw[0])):
        first = words(raw.pop(0))
        evaluated |= any(w in EVAL_WORDS for w in first)
        tested |= any(w in TEST_WORDS for w in first)
    segments = [words(r) for r in raw]
    ws = [w for s in segments for w in s]
    evaluated |= any(w in EVAL_WORDS for w in ws)
    tested |= any(w in TEST_WORDS for w in ws)
    ws = [w for w in ws if w not in MARKERS]
    if len(ws) > 1 and ws[0] in LEADING:
        ws = ws[1:]
    aggregate = False
    if len(ws) > 1 and ws[-1] == "step":
        ws = ws[:-1]
    elif len(ws) > 1 and (ws[-1] == "epoch" or ws[0] == "epoch"):
        ws = ws[:-1] if ws[-1] == "epoch" else ws[1:]
        aggregate = True
    named = raw[0].lower().startswith("lr-") or (len(raw) > 1 and segments[0] == ["lr"])
    metric = _lr(ws, named=named) or _SPELLINGS.get(tuple(ws)) or _step_time(ws)
    if metric in PACE and (aggregate or (ws == ["time"] and words(tag) != ["time"])):
        # An epoch's time is no step's; `time` alone is nanoGPT's step time, but `train_time` is
        # modded-nanogpt's time since the start (a count, like `consumed samples`).
        return None
    if metric is None and evaluated and len(segments) > 1:
        # An evaluation's loss on one of its sets: the segments before the loss name the evaluator
        # and the set (OLMo-core's `eval/lm/c4_en-validation/CE loss`).
        metric = "loss" if _SPELLINGS.get(tuple(w for w in segments[-1] if w not in MARKERS)) == "loss" else None
    if evaluated or tested:
        if metric != "loss" and tuple(ws) not in _EVAL_SPELLINGS:
            return None
        metric = "eval_loss"
    if metric is None:
        return None
    rank = RANK_AGGREGATE if aggregate else RANK_TEST if tested and not evaluated else RANK_SPELLING
    return Match(metric, rank)


def _step_time(ws: list[str]) -> str | None:
    """A step time followed by its unit (`iter time (ms)`, `step_time_s`, `train_step_timing in s`)."""
    while len(ws) > 1 and ws[-1] in UNIT_WORDS:
        ws = ws[:-1]
    return "step_time" if _SPELLINGS.get(tuple(ws)) == "step_time" else None


def _namespace(ws: list[str]) -> bool:
    """A leading segment that only says where the metric was logged (`optim`, `Train`, `eval`,
    torchtitan's `loss_metrics` and `validation_metrics`)."""
    rest = [w for w in ws if w not in MARKERS]
    return len(rest) < len(ws) and not rest or " ".join(rest) in NAMESPACES


def _lr(ws: list[str], *, named: bool) -> str | None:
    """`lr`, `learning rate`, then a param group (`group 0`, `group0`, `pg1`); after Lightning's and
    Composer's `lr-` also the optimizer's name (`lr-AdamW`, `lr-DecoupledAdamW/group0`)."""
    if ws[:1] == ["lr"]:
        rest = ws[1:]
    elif ws[:2] == ["learning", "rate"]:
        rest = ws[2:]
    else:
        return None
    if any(w in NOT_LR for w in rest):
        return None
    if all(_GROUP.match(w) for w in rest):
        return "lr"
    return "lr" if named else None


@lru_cache(maxsize=4096)
def is_loss_part(tag: str) -> bool:
    """A training loss logged as one part of a loss the run never logs whole (YOLO's
    `train/box_loss`, DeepSpeed-Chat's `act_loss`): a name whose last words are `<something> loss`,
    that no metric's spelling claims and no eval, val or test word makes an evaluation's. Such parts
    are summed into the loss where a run has none (detection.loss_parts)."""
    if recognise(tag) is not None:
        return False
    ws = words(tag)
    if any(w in EVAL_WORDS or w in TEST_WORDS or w in NOT_PARTS for w in ws):
        return False
    # (HF's end-of-run summary `train/train_loss` leaves `loss` alone: no part.)
    rest = [w for w in ws if w not in MARKERS]
    return len(rest) > 1 and rest[-1] == "loss"


def rank_of(tag: str, metric: str) -> int:
    """The tag's rank as a source of `metric`: the vocabulary's, or the user's when the vocabulary
    would not have made it that metric (only a user alias can have)."""
    if PARTS_SEPARATOR in tag:
        return RANK_PARTS
    found = recognise(tag)
    return found.rank if found is not None and found.metric == metric else RANK_USER
