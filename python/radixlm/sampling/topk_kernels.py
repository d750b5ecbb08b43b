"""The k best tokens of each row, with their logprobs, in two small kernels.

What the sampler reports besides the chosen token: a grammar row's best tokens by its adjusted
scores (`SampleOutput.alternatives`, the redraw list of grammar_sampling.py) and the top
logprobs a request asks for. The PyTorch code for them (float32 copy, logsumexp, topk, gathers,
stack, casts) is a dozen or more launches, each on the host's critical path: about 0.37 ms of
host time a step at batch 64 in the structured-output benchmark. Here:

  stage 1  grid (B, chunks): a program loads CHUNK scores of one row and the same CHUNK raw
           logits (once when they are the same tensor), keeps the chunk's (max, sum of exp) of
           the raw logits and its K best scores, found by K rounds of "maximum, then the first
           index holding it, then take it out".
  stage 2  grid (B,): the row's logsumexp from its chunks, then the same K rounds over the
           chunks' candidates; each winner's logprob is its raw logit minus the logsumexp.

Order: best score first, equal scores by lower token id, so the first token is torch.argmax's
choice. A NaN score is never picked (it counts as -inf); rows with fewer than K finite scores
fill the rest with -inf entries of the lowest unpicked ids. Capturable in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.sampling.logprob_kernels import fold_chunk_stats, load_scores_and_logits

CHUNK = 2048           # scores a stage-1 program loads (16 a thread at 4 warps)
MAX_K = 32             # larger k (a request's top_logprobs) stays with torch.topk
_NO_ID = tl.constexpr(2147483647)   # sorts after every token id


@triton.jit
def _chunk_topk_kernel(scores, stride_s, logits, stride_l, part_max, part_sum, cand_val,
                       cand_id, V, num_chunks, K: tl.constexpr, CHUNK: tl.constexpr,
                       SAME: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    idx = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = idx < V
    s, r = load_scores_and_logits(scores, stride_s, logits, stride_l, row, idx, valid, SAME)
    c_max = tl.max(r, 0)
    # (a -inf logit adds exactly 0; exp(-inf - -inf) would be NaN)
    c_sum = tl.sum(tl.where(r == float("-inf"), 0.0, tl.exp(r - c_max)), 0)
    slot = row * num_chunks + chunk
    tl.store(part_max + slot, c_max)
    tl.store(part_sum + slot, c_sum)
    s = tl.where(s != s, float("-inf"), s)        # NaN -> -inf
    key = tl.where(valid, idx, _NO_ID)            # taken and padding lanes: _NO_ID
    out = slot * K
    for j in tl.static_range(K):
        best = tl.max(s, 0)
        pos = tl.min(tl.where(s == best, key, _NO_ID), 0)
        tl.store(cand_val + out + j, best)
        tl.store(cand_id + out + j, pos)
        taken = key == pos
        s = tl.where(taken, float("-inf"), s)
        key = tl.where(taken, _NO_ID, key)


@triton.jit
def _combine_topk_kernel(part_max, part_sum, cand_val, cand_id, logits, stride_l, out,
                         num_rows, num_chunks, k_out, K: tl.constexpr,
                         BLOCK_C: tl.constexpr, BLOCK_CAND: tl.constexpr):
    row = tl.program_id(0)
    _, _, lse = fold_chunk_stats(part_max, part_sum, row, num_chunks, BLOCK_C)

    offs = tl.arange(0, BLOCK_CAND)
    n_cand = num_chunks * K
    v = tl.load(cand_val + row * n_cand + offs, mask=offs < n_cand, other=float("-inf"))
    key = tl.load(cand_id + row * n_cand + offs, mask=offs < n_cand, other=_NO_ID)
    # out is [3, num_rows, k_out]: ids, scores, logprobs. A loop with a run-time count: one
    # compiled variant serves every k up to K.
    o_ids = out + row * k_out
    o_val = out + (num_rows + row) * k_out
    o_lp = out + (2 * num_rows + row) * k_out
    for j in range(0, k_out):
        best = tl.max(v, 0)
        pos = tl.min(tl.where(v == best, key, _NO_ID), 0)
        raw = tl.load(logits + row.to(tl.int64) * stride_l + pos).to(tl.float32)
        tl.store(o_ids + j, pos.to(tl.float32))
        tl.store(o_val + j, best)
        tl.store(o_lp + j, raw - lse)
        taken = key == pos
        v = tl.where(taken, float("-inf"), v)
        key = tl.where(taken, _NO_ID, key)


def supports(logits: torch.Tensor, k: int) -> bool:
    """Whether `top_k_with_logprobs` takes k best of these logits (ids must be exact in
    float32: below 2**24)."""
    return (logits.dim() == 2 and logits.stride(1) == 1 and 1 <= k <= MAX_K
            and k <= logits.shape[1] and logits.shape[1] <= 1 << 24)


def top_k_with_logprobs(scores: torch.Tensor, logits: torch.Tensor, k: int) -> torch.Tensor:
    """[3, B, k] float32: per row the k best tokens by `scores` [B, V], best first, as
    [ids, scores, log_softmax(logits) at them]. `scores` may be `logits` itself (one read) or
    adjusted logits (penalties, bans, a grammar mask); any float dtypes, rows contiguous."""
    b, v = logits.shape
    if scores.shape != logits.shape or not supports(logits, k) or scores.stride(1) != 1:
        raise ValueError(f"top_k_with_logprobs: k={k} over scores {tuple(scores.shape)} and "
                         f"logits {tuple(logits.shape)} not supported")
    out = torch.empty((3, b, k), dtype=torch.float32, device=logits.device)
    if b == 0:
        return out
    # One compiled variant per power of two of k (k varies with the request's top_logprobs).
    k_pad = max(4, triton.next_power_of_2(k))
    chunks = triton.cdiv(v, CHUNK)
    part_max = torch.empty((b, chunks), dtype=torch.float32, device=logits.device)
    part_sum = torch.empty_like(part_max)
    cand_val = torch.empty((b, chunks, k_pad), dtype=torch.float32, device=logits.device)
    cand_id = torch.empty((b, chunks, k_pad), dtype=torch.int32, device=logits.device)
    _chunk_topk_kernel[(b, chunks)](
        scores, scores.stride(0), logits, logits.stride(0), part_max, part_sum, cand_val,
        cand_id, v, chunks, K=k_pad, CHUNK=CHUNK, SAME=scores is logits, num_warps=4)
    _combine_topk_kernel[(b,)](
        part_max, part_sum, cand_val, cand_id, logits, logits.stride(0), out, b, chunks, k,
        K=k_pad, BLOCK_C=max(16, triton.next_power_of_2(chunks)),
        BLOCK_CAND=max(16, triton.next_power_of_2(chunks * k_pad)), num_warps=4)
    return out
