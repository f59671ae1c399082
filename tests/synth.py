"""Training curves with known causes, shaped like real ones (warmup + cosine LR, noisy decaying loss,
grad norm with its own noise), for tests of detection and cause labelling and for the sample runs."""

from __future__ import annotations

import math

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
