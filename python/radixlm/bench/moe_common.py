"""What the MoE benchmarks share (bench/moe.py, moe_sweeps.py, moe_tune.py): the expert shapes
of the models the issues name, timing helpers, FP8 copies of expert stacks."""

from __future__ import annotations

import time
from typing import Callable

import torch

from radixlm.bench.common import median, sync_device

# (experts, top_k, hidden, expert intermediate) of the models the issue names.
EXPERT_SHAPES = {
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v2-lite": (64, 6, 2048, 1408),
}


def time_fn(fn: Callable[[], object], device: torch.device, iters: int = 20) -> float:
    """Median seconds of fn() after two warm-up calls, each call timed alone."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        sync_device(device)
        t = time.perf_counter()
        fn()
        sync_device(device)
        times.append(time.perf_counter() - t)
    return median(times)


def graphed(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """fn captured in a CUDA graph (after a warm-up call); returns its replay."""
    fn()
    sync_device(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def fp8_copy(w13: torch.Tensor, w2: torch.Tensor):
    """FP8 copies of the experts with 128x128 block scales (the layout of DeepSeek-V3 and
    Qwen3-FP8 checkpoints): (w13, w2, scales)."""
    from radixlm.layers.moe.experts import Fp8ExpertScales
    from radixlm.layers.moe.fp8_experts import quantize_experts
    q13, s13 = quantize_experts(w13, (128, 128))
    q2, s2 = quantize_experts(w2, (128, 128))
    return q13, q2, Fp8ExpertScales(s13, s2, (128, 128))
