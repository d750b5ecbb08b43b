"""Expert selection in one Triton kernel (ungrouped routing): scores, top-k, renormalisation
and scaling for one token per program.

The torch ops of topk.py cost six or seven small launches per MoE layer (softmax, topk,
gather, sum, divide, multiply); at batch 1 each is a few microseconds of GPU time, which adds
up over 26-48 layers. Top-k here is k rounds of argmax over the token's experts (k <= 16),
taking each winner out of the running; the chosen set equals torch.topk's (up to exact ties).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

MAX_TOP_K = 16
MAX_EXPERTS = 1024


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_l,
                  scaling_factor,
                  TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                  SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr,
                  PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    t = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < num_experts
    if HAS_BIAS:   # (a weight: read before the wait for the router's logits)
        bias = tl.load(bias_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    x = tl.load(logits_ptr + t * stride_l + offs, mask=ok, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-x))
    else:
        e = tl.exp(x - tl.max(x, 0))
        scores = e / tl.sum(e, 0)
    scores = tl.where(ok, scores, 0.0)
    choice = scores
    if HAS_BIAS:
        choice += bias
    choice = tl.where(ok, choice, float("-inf"))
    offs_k = tl.arange(0, BLOCK_K)
    picked_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    picked_i = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(choice, 0)
        w = tl.sum(tl.where(offs == best, scores, 0.0), 0)
        picked_w = tl.where(offs_k == j, w, picked_w)
        picked_i = tl.where(offs_k == j, best.to(tl.int32), picked_i)
        choice = tl.where(offs == best, float("-inf"), choice)
    if RENORMALIZE:
        picked_w = picked_w / (tl.sum(picked_w, 0) + 1e-20)
    picked_w = picked_w * scaling_factor
    tl.store(weights_ptr + t * TOP_K + offs_k, picked_w, mask=offs_k < TOP_K)
    tl.store(ids_ptr + t * TOP_K + offs_k, picked_i, mask=offs_k < TOP_K)


def supports(num_experts: int, top_k: int) -> bool:
    return top_k <= MAX_TOP_K and num_experts <= MAX_EXPERTS and top_k <= num_experts


def route(logits: torch.Tensor, top_k: int, sigmoid: bool, renormalize: bool,
          scaling_factor: float, correction_bias: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] float32, ids [T, k] int32)."""
    t, e = logits.shape
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t == 0:
        return weights, ids
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    bias = correction_bias if correction_bias is not None else weights
    _route_kernel[(t,)](
        logits, bias, weights, ids, e, logits.stride(0), float(scaling_factor),
        TOP_K=top_k, BLOCK_E=triton.next_power_of_2(e),
        BLOCK_K=max(2, triton.next_power_of_2(top_k)), SIGMOID=sigmoid,
        HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize and top_k > 1,
        num_warps=1 if e <= 128 else 4, **pdl_kwargs(logits.device, t))
    return weights, ids
