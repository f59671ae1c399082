"""What a crash finding says to do, by the rule's `advice`: for an out-of-memory, the seed's memory
checklist (batch size 32 -> 8 with gradient accumulation 4 for the same effective batch, fp16/bf16,
max_seq_len 2048 -> 1024, gradient checkpointing, flash attention, optimizer offload), ordered by
what the log shows: memory reserved but unallocated beyond what was asked (fragmentation:
`expandable_segments`) first, then the batch size and the sequence length where the log names them,
then the rest. Pure: the log's last lines in, causes out."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..model import Cause

_SIZE = r"(\d+(?:\.\d+)?) ?([KMGT]i?B|bytes)"
TRIED = re.compile(rf"Tried to allocate {_SIZE}")
"""c10/cuda/CUDACachingAllocator.cpp's message, old and new: `Tried to allocate 2.00 GiB`."""
UNALLOCATED = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")
"""torch >= 2.1: `... and 6.12 GiB is reserved by PyTorch but unallocated.`"""
FREE = re.compile(rf"(?:of which {_SIZE} is free|; {_SIZE} free;)")
OLD_RESERVED = re.compile(rf"{_SIZE} already allocated;.*?{_SIZE} reserved in total by PyTorch")
"""torch < 2.1: `(GPU 0; 11.17 GiB total capacity; 10.58 GiB already allocated; 11.81 MiB free;
10.76 GiB reserved in total by PyTorch)`."""
BATCH = re.compile(r"\b(?:per_device_train_|train_|micro_|global_)?batch[_ ]size(?: per device)?\b['\"]?\s*[:=]?\s*(\d+)", re.IGNORECASE)
"""`batch_size: 32`, `--micro_batch_size 4`, transformers' `Instantaneous batch size per device = 32`."""
SEQ_LEN = re.compile(r"\b(?:max_seq_len(?:gth)?|seq_len(?:gth)?|max_length|block_size|sequence_length|context_length)\b['\"]?\s*[:=]?\s*(\d+)", re.IGNORECASE)
_UNITS = {"bytes": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
FRAGMENTED = 0.5
"""Reserved-but-unallocated memory at least this share of the failed allocation: the allocator held
the room but not in one piece, which expandable segments fix without any other change."""


def _bytes(number: str, unit: str) -> float:
    return float(number) * _UNITS[unit]


def _last(pattern: re.Pattern[str], lines: Sequence[str]) -> re.Match[str] | None:
    for line in reversed(lines):
        found = None
        for found in pattern.finditer(line):
            pass
        if found is not None:
            return found
    return None


def _memory(lines: Sequence[str], where: str, reached: str) -> tuple[Cause, ...]:
    tried, free = _last(TRIED, lines), _last(FREE, lines)
    asked = f"tried to allocate {tried[1]} {tried[2]}" if tried else "ran out of GPU memory"
    if free is not None:
        number, unit = (free[1], free[2]) if free[1] else (free[3], free[4])
        asked += f" with {number} {unit} free"
    out: list[Cause] = []
    spare = _last(UNALLOCATED, lines)
    old = _last(OLD_RESERVED, lines)
    held = _bytes(spare[1], spare[2]) if spare else (_bytes(old[3], old[4]) - _bytes(old[1], old[2]) if old else 0.0)
    if tried and held >= FRAGMENTED * _bytes(tried[1], tried[2]) and held > 0:
        said = f"{spare[1]} {spare[2]} reserved by PyTorch but unallocated" if spare else f"{old[3]} {old[4]} reserved against {old[1]} {old[2]} allocated"
        out.append(Cause(
            "memory fragmentation", 0.7, f"{asked}; {said} ({where})",
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (max_split_size_mb on torch < 2.1): the reserved memory is "
            "there but in pieces; then the checklist below if it still does not fit",
        ))
    batch, seq = _last(BATCH, lines), _last(SEQ_LEN, lines)
    if batch is not None and int(batch[1]) > 1:
        size = int(batch[1])
        smaller = max(1, size // 4)
        out.append(Cause(
            "batch too large for the GPU", 0.6, f"{asked} {reached}; the log sets batch size {size} ({where})",
            f"batch size {size} → {smaller} with gradient accumulation {size // smaller} (the same effective batch of {smaller * (size // smaller)})",
        ))
    else:
        out.append(Cause(
            "batch too large for the GPU", 0.4, f"{asked} {reached} ({where})",
            "a quarter of the batch size (32 → 8) with gradient accumulation 4, which keeps the effective batch",
        ))
    if seq is not None and int(seq[1]) > 1:
        length = int(seq[1])
        out.append(Cause(
            "sequences too long for the GPU", 0.5, f"the log sets a sequence length of {length} ({where})",
            f"max_seq_len {length} → {length // 2} (activation memory grows with it)",
        ))
    out.append(Cause(
        "model state too large for the GPU", 0.3, f"{asked} {reached} ({where})",
        "mixed precision (bf16/fp16 instead of fp32), gradient checkpointing, flash attention, "
        "optimizer state offloaded to CPU" + ("" if seq is not None else ", max_seq_len 2048 → 1024"),
    ))
    return tuple(out)


Advice = Callable[[Sequence[str], str, str], tuple[Cause, ...]]


def _one(cause: str, suggestion: str) -> Advice:
    def said(lines: Sequence[str], where: str, reached: str) -> tuple[Cause, ...]:
        return (Cause(cause, 0.6, f"the run stopped {reached} ({where})", suggestion),)
    return said


ADVICE: dict[str, Advice] = {
    "gpu-memory": _memory,
    "host-memory": _one(
        "out of host memory (the OOM killer)",
        "check `sacct -j <job> -o MaxRSS` or `dmesg`; fewer data loader workers and less prefetch, a dataset streamed or "
        "memory-mapped rather than loaded whole, or ask the scheduler for more memory (--mem)",
    ),
    "collective": _one(
        "a rank stopped answering a collective (NCCL timeout)",
        "read the other ranks' logs for the first error (one rank's OOM or exception hangs the rest); NCCL_DEBUG=INFO "
        "and TORCH_NCCL_TRACE_BUFFER_SIZE for the stuck operation; a longer process group timeout only if a long step "
        "(a checkpoint save, an evaluation) on one rank is expected",
    ),
    "time-limit": _one(
        "the job reached its time limit",
        "resume from the last checkpoint; ask for more time (--time), checkpoint more often, or requeue on a signal "
        "before the limit (--signal)",
    ),
    "signal": _one(
        "the process was killed (SIGKILL): usually the kernel's OOM killer",
        "check `dmesg` for the OOM killer and the host's memory; fewer data loader workers, less prefetch",
    ),
    "segfault": _one(
        "native code crashed (segmentation fault)",
        "rerun with `python -X faulthandler` for the stack; check the CUDA, driver and extension builds match; a data "
        "loader worker's crash shows with num_workers=0",
    ),
    "launcher": _one(
        "a worker process failed",
        "the failing rank's own output (its stderr.log, or the error_file torchrun names) holds the first error",
    ),
    "exception": _one(
        "the training script raised an exception",
        "the exception line and the frame above it say where; fix and resume from the last checkpoint",
    ),
}
"""Each rule's `advice`: the causes its findings carry."""


def causes_for(advice: str, lines: Sequence[str], *, where: str, reached: str) -> tuple[Cause, ...]:
    return ADVICE[advice](lines, where, reached)
