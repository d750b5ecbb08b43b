"""One pass over the logits for the sampler's per-row reductions: the greedy token and the
chosen token's logprob (log_softmax of the raw logits at it).

The PyTorch code (sampler.py) converts the [B, V] logits to float32, then runs argmax, a
logsumexp (max, exp, sum, log) and a gather: six or seven kernels that each read the whole
matrix: ~125 us a step at batch 64 over Qwen3's 151,936-token vocabulary on an H200, and at
batch 1 torch's argmax alone took 28 us over Llama-3's 128,256 tokens (too few rows to fill the
GPU). Here:

  stage 1  grid (B, chunks): each program reads CHUNK logits of one row in their own dtype and
           keeps, per lane, the running maximum, the sum of exp(x - maximum) (rescaled when the
           maximum grows) and the first index of the maximum; it then folds its lanes into one
           (max, sum, first index of max) for the chunk.
  stage 2  grid (B,): folds a row's chunks: lse = max + log(sum); the greedy token is the first
           index holding the maximum (torch.argmax's choice among ties), its logprob max - lse;
           with the tokens given (sampled rows), the logprob is x[token] - lse.

Rows of -inf only give token 0 and a NaN logprob, as torch does (a NaN logit is not picked,
where torch.argmax would pick it). Capturable in CUDA graphs (shapes decide the grid and the
buffers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048          # logits a program loads at once (16 a thread at 4 warps)
ITERS = 4             # loads a program makes: CHUNK = 8,192 logits a program
CHUNK = BLOCK * ITERS


@triton.jit
def online_lse_step(lane_max, lane_sum, x):
    """One step of a running (max, sum of exp(x - max)) per lane: the new pair after x.
    exp(-inf - -inf) is NaN: an unchanged maximum scales by exactly 1, a -inf value adds
    exactly 0."""
    new_max = tl.maximum(lane_max, x)
    scale = tl.where(new_max == lane_max, 1.0, tl.exp(lane_max - new_max))
    term = tl.where(x == float("-inf"), 0.0, tl.exp(x - new_max))
    return new_max, lane_sum * scale + term


@triton.jit
def load_scores_and_logits(scores, stride_s, logits, stride_l, row, idx, valid,
                           SAME: tl.constexpr):
    """One row's scores and raw logits at idx as float32 (-inf past the row), loaded once when
    they are the same tensor (SAME) (topk_kernels.py, draw_kernels.py)."""
    s = tl.load(scores + row.to(tl.int64) * stride_s + idx, mask=valid,
                other=float("-inf")).to(tl.float32)
    if SAME:
        r = s
    else:
        r = tl.load(logits + row.to(tl.int64) * stride_l + idx, mask=valid,
                    other=float("-inf")).to(tl.float32)
    return s, r


@triton.jit
def _chunk_stats_kernel(logits, stride_row, part_max, part_sum, part_idx, V, num_chunks,
                        BLOCK: tl.constexpr, ITERS: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base = logits + row.to(tl.int64) * stride_row
    first = chunk * (BLOCK * ITERS)
    offs = tl.arange(0, BLOCK)
    lane_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    lane_idx = first + offs      # an all -inf row keeps each lane's first index (min: 0)
    for it in tl.static_range(ITERS):
        idx = first + it * BLOCK + offs
        x = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        lane_idx = tl.where(x > lane_max, idx, lane_idx)   # strict: the first index stays
        lane_max, lane_sum = online_lse_step(lane_max, lane_sum, x)
    chunk_max = tl.max(lane_max, 0)
    weight = tl.where(lane_max == float("-inf"), 0.0, tl.exp(lane_max - chunk_max))
    chunk_sum = tl.sum(lane_sum * weight, 0)
    chunk_idx = tl.min(tl.where(lane_max == chunk_max, lane_idx, 2147483647), 0)
    slot = row * num_chunks + chunk
    tl.store(part_max + slot, chunk_max)
    tl.store(part_sum + slot, chunk_sum)
    tl.store(part_idx + slot, chunk_idx)


@triton.jit
def fold_chunk_stats(part_max, part_sum, row, num_chunks, BLOCK_C: tl.constexpr):
    """A row's (chunk maxima [BLOCK_C], maximum, logsumexp) from its chunks' (max, sum of
    exp(x - max)) (also topk_kernels.py's stage 2)."""
    offs = tl.arange(0, BLOCK_C)
    mask = offs < num_chunks
    c_max = tl.load(part_max + row * num_chunks + offs, mask=mask, other=float("-inf"))
    c_sum = tl.load(part_sum + row * num_chunks + offs, mask=mask, other=0.0)
    row_max = tl.max(c_max, 0)
    weight = tl.where(c_max == float("-inf"), 0.0, tl.exp(c_max - row_max))
    return c_max, row_max, row_max + tl.log(tl.sum(c_sum * weight, 0))


@triton.jit
def _combine_kernel(part_max, part_sum, part_idx, logits, stride_row, ids, logprobs,
                    num_chunks, GREEDY: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    c_max, row_max, lse = fold_chunk_stats(part_max, part_sum, row, num_chunks, BLOCK_C)
    if GREEDY:
        offs = tl.arange(0, BLOCK_C)
        mask = offs < num_chunks
        c_idx = tl.load(part_idx + row * num_chunks + offs, mask=mask, other=2147483647)
        token = tl.min(tl.where(c_max == row_max, c_idx, 2147483647), 0)
        tl.store(ids + row, token.to(tl.int64))
        tl.store(logprobs + row, row_max - lse)
    else:
        token = tl.load(ids + row)
        x = tl.load(logits + row.to(tl.int64) * stride_row + token).to(tl.float32)
        tl.store(logprobs + row, x - lse)


def _launch(logits: torch.Tensor, ids: torch.Tensor, greedy: bool) -> torch.Tensor:
    b, v = logits.shape
    assert logits.stride(1) == 1
    chunks = triton.cdiv(v, CHUNK)
    part_max = torch.empty((b, chunks), dtype=torch.float32, device=logits.device)
    part_sum = torch.empty_like(part_max)
    part_idx = torch.empty((b, chunks), dtype=torch.int32, device=logits.device)
    logprobs = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b == 0:
        return logprobs
    _chunk_stats_kernel[(b, chunks)](logits, logits.stride(0), part_max, part_sum, part_idx, v,
                                     chunks, BLOCK=BLOCK, ITERS=ITERS, num_warps=4)
    _combine_kernel[(b,)](part_max, part_sum, part_idx, logits, logits.stride(0), ids, logprobs,
                          chunks, GREEDY=greedy, BLOCK_C=max(16, triton.next_power_of_2(chunks)),
                          num_warps=1)
    return logprobs


def greedy_with_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] (any float dtype, rows contiguous) -> (argmax [B] int64, log_softmax at
    it [B] float32), as torch.argmax and logits.float() - logsumexp give them."""
    ids = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    return ids, _launch(logits, ids, greedy=True)


def chosen_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[row, ids[row]] for each row, [B] float32."""
    return _launch(logits, ids.contiguous(), greedy=False)
