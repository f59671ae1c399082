"""Training curves with known causes, shaped like real ones (warmup + cosine LR, noisy decaying loss,
grad norm with its own noise), for tests of detection and cause labelling and for the sample runs."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import polars as pl

SCENARIOS = ("clean", "lr_too_high", "gradient_explosion", "bad_batch", "numerical_instability", "lr_schedule", "model_architecture")


def curves(scenario: str, *, steps: int = 1200, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    peak_lr, warm = 3e-4, 100
    lr = np.where(t < warm, peak_lr * t / warm, peak_lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(math.pi * (t - warm) / (steps - warm)))))
    loss = 2.0 + 6.0 * np.exp(-t / 150) + rng.normal(0, 0.03, steps)
    gn = 1.0 + 0.8 * np.exp(-t / 100) + np.abs(rng.normal(0, 0.08, steps))
    scale = np.full(steps, 65536.0)
    s = 700  # index of the spike
    if scenario == "lr_too_high":
        peak_lr, warm, s = 1e-2, 400, 404
        lr = np.where(t < warm, peak_lr * t / warm, peak_lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(math.pi * (t - warm) / (steps - warm)))))
        loss[s : s + 6] = loss[s - 1] * np.array([2.6, 3.0, 2.8, 2.4, 2.2, 2.1])
        gn[s : s + 6] *= 2.0
    elif scenario == "gradient_explosion":
        gn[s - 1 : s + 3] = [25.0, 48.0, 30.0, 12.0]
        loss[s : s + 4] = loss[s - 1] * np.array([2.5, 3.1, 2.2, 2.05])
    elif scenario == "bad_batch":
        loss[s] = loss[s - 1] * 3.2
    elif scenario == "numerical_instability":
        scale[s - 4 :] = 65536.0 / 2.0 ** np.minimum(np.arange(steps - s + 4), 6)
        loss[s] = np.nan
        gn[s] = np.inf
        loss[s + 1 : s + 3] = loss[s - 1] * 2.4
    elif scenario == "lr_schedule":
        lr[s - 2 :] = peak_lr * 0.9  # the scheduler restarted at its peak
        loss[s : s + 5] = loss[s - 1] * np.array([2.3, 2.7, 2.4, 2.2, 2.1])
    elif scenario == "model_architecture":
        gn = gn * np.linspace(1.0, 6.0, steps)
        for k, at in enumerate((450, 650, 850, 1050)):
            loss[at : at + 2] = loss[at - 1] * (2.4 + 0.2 * k)
    return {"step": t, "loss": loss, "lr": lr, "grad_norm": gn, "loss_scale": scale}


def long_frame(scenario: str, *, run: str | None = None, steps: int = 1200, seed: int = 0) -> pl.DataFrame:
    c = curves(scenario, steps=steps, seed=seed)
    parts = []
    for metric in ("loss", "lr", "grad_norm", "loss_scale"):
        parts.append(
            pl.DataFrame(
                {"run": run or scenario, "source": f"{scenario}.jsonl", "step": c["step"], "metric": metric, "tag": metric, "value": c[metric], "wall_time": None},
                schema={"run": pl.String, "source": pl.String, "step": pl.Int64, "metric": pl.String, "tag": pl.String, "value": pl.Float64, "wall_time": pl.Float64},
            )
        )
    return pl.concat(parts)


DIVERGING = ("compounding 1.08x", "climb 1.00 -> 2.17", "climb 0.90 -> 1.72", "decay then climb")
"""The slow divergences of divergence_cases: each is one incident of the default rules."""


def divergence_cases() -> dict[str, list[float]]:
    """Loss curves by name (one value a step from 0): the slow divergences other tools' tests are made
    of (losslint's diverging.csv, 1.0 + 0.03 a point; trainspotter's decay, then +0.3 a point; a
    compounding 2.7 -> 254 in 60 points after a calm start; a noisy 0.90 -> 1.72 over 100 points),
    and runs that must stay quiet (a long plateau, a warm-up bump of 1.3x over the first 3% of the
    steps, a small model's per-batch loss moving 2x from one batch to the next)."""
    r = random.Random(1)
    decay = [5.0 * 0.9**i + 0.5 for i in range(30)]
    return {
        "compounding 1.08x": [2.7 * (1 + 0.01 * r.gauss(0, 1)) for _ in range(100)] + [2.7 * 1.08**k for k in range(1, 61)],
        "climb 1.00 -> 2.17": [1.0 + 0.03 * i for i in range(40)],
        "climb 0.90 -> 1.72": [0.9 + 0.82 * i / 99 + 0.02 * r.gauss(0, 1) for i in range(100)],
        "decay then climb": decay + [decay[-1] + 0.3 * i for i in range(1, 30)],
        "plateau (3,000 points)": [2.0 * (1 + 0.03 * r.gauss(0, 1)) for _ in range(3000)],
        "warm-up bump 1.3x": [(2.0 + 0.6 * i / 30 if i < 30 else 0.6 + 2.0 * math.exp(-(i - 30) / 200)) * (1 + 0.02 * r.gauss(0, 1)) for i in range(1000)],
        "noisy per-batch loss": [math.exp(math.log(0.3) + 0.5 * r.gauss(0, 1)) for _ in range(2000)],
    }


def write_loss_csv(path: Path, values: list[float]) -> Path:
    """A CSV logger's file of one loss a step from 0 (what Lightning's CSVLogger writes, less its other columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("step,loss\n" + "".join(f"{i},{v:.6f}\n" for i, v in enumerate(values)))
    return path
