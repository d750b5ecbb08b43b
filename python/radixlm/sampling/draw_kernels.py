"""A sampled batch's draw in one pass over the logits: temperature, cut-off, Gumbel noise,
argmax, and the chosen token's logprob; for a constrained batch also its token masks and the
move of its device automata's states (token_mask.py).

The PyTorch code (sampler.py, noise.py) divides by the temperature, masks the tokens below the
row's cut-off, builds the [B, V] noise with a dozen int64 elementwise ops (the hash of
noise.py), adds it, takes the argmax, and then computes the logprob in another pass: about
twenty launches that each stream a [B, V] matrix, 78 MB per int64 op at batch 64 over Qwen3's
151,936 tokens. Here, two kernels:

  stage 1  grid (B, chunks): a program reads CHUNK scores of one row (and the raw logits, once
           when they are the same tensor); per lane it keeps the running (max, sum of exp) of
           the raw logits and the best noisy score with its first index, where the noisy score
           of a token is scores / T + gumbel(row key, token) if scores / T >= cut-off, else
           -inf; then folds its lanes into one of each for the chunk.
  stage 2  grid (B,): folds a row's chunks; the token is the first index of the best noisy
           score, its logprob raw logit - logsumexp.

A mask (token_mask.TokenMask) makes a disallowed token's noisy score -inf in stage 1 (its bit
read from the row's words and from its automaton state's table row); stage 2 then moves the
row's automaton state by the token. The logprob stays that of the raw logits, as the sampler's
PyTorch code reports it.

The noise is noise.py's: the same 32-bit hash bits, the same float32 ops on them (uint32
arithmetic wraps here, which is the reference's `& 0xFFFFFFFF`). The division is rounded to
nearest as torch's; only `log` may differ from torch's in the last bit, which can change the
winner only between two noisy scores within an ulp of each other. Greedy rows (temperature 1,
cut-off -inf) get no noise: their argmax. Capturable in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.sampling.logprob_kernels import (fold_chunk_stats, load_scores_and_logits,
                                              online_lse_step)
from radixlm.sampling.noise import _MUL1, _MUL2, _TOKEN_SALT, _UNIFORM_BITS
from radixlm.sampling.token_mask import TokenMask

BLOCK = 256           # logits a program loads at once (2 a thread at 4 warps)
ITERS = 8             # loads a program makes, unrolled: CHUNK = 2,048 logits a program
CHUNK = BLOCK * ITERS
WARPS = 4
_NO_ID = tl.constexpr(2147483647)
_M1 = tl.constexpr(_MUL1)
_M2 = tl.constexpr(_MUL2)
_SALT = tl.constexpr(_TOKEN_SALT)
_SHIFT = tl.constexpr(32 - _UNIFORM_BITS)
_UNIT = tl.constexpr(2.0 ** -_UNIFORM_BITS)


@triton.jit
def mix32(x):
    """noise.py's `mix` on uint32 lanes (products wrap modulo 2**32)."""
    x = x ^ (x >> 16)
    x = x * _M1
    x = x ^ (x >> 15)
    x = x * _M2
    return x ^ (x >> 15)


@triton.jit
def noise_bits(row_key, idx):
    """noise.hash_bits of (row key: uint32 scalar, token ids: int32 lanes), as uint32."""
    return mix32(row_key ^ mix32(idx.to(tl.uint32) ^ _SALT))


@triton.jit
def gumbel(row_key, idx):
    """Standard Gumbel noise of (row key: uint32 scalar, token ids: int32 lanes), bit for bit
    noise.gumbel_noise's up to the two logs."""
    bits = noise_bits(row_key, idx)
    u = ((bits >> _SHIFT).to(tl.float32) + 0.5) * _UNIT
    return -tl.log(-tl.log(u))


# The per-row parameters' alignment is not specialised (views into SamplingBatchInfo's stacked
# tensors: aligned or not depending on the batch size).
@triton.jit
def allowed_bits(words, stride_w, table, stride_t, states, slots, row, idx, valid,
                 WORDS: tl.constexpr, TABLE: tl.constexpr):
    """Whether each token of idx is allowed by the row's mask (token_mask.py): its bit in the
    row's words (WORDS) and in its automaton state's table row (TABLE; rows with slot -1 have
    none)."""
    word = idx >> 5
    bit = idx & 31
    ok = valid
    if WORDS:
        w = tl.load(words + row.to(tl.int64) * stride_w + word, mask=valid, other=0)
        ok = ok & (((w >> bit) & 1) != 0)
    if TABLE:
        slot = tl.load(slots + row)
        state = tl.load(states + tl.maximum(slot, 0))    # (a valid state for any row)
        t = tl.load(table + state * stride_t + word, mask=valid, other=-1)
        ok = ok & ((((t >> bit) & 1) != 0) | (slot < 0))
    return ok


@triton.jit(do_not_specialize=["has_cut", "stride_w", "stride_t"],
            do_not_specialize_on_alignment=["temps", "cutoffs", "greedy", "row_keys", "words",
                                            "slots"])
def _draw_chunk_kernel(scores, stride_s, logits, stride_l, temps, cutoffs, has_cut, greedy,
                       row_keys, part_max, part_sum, part_best, part_idx, V, num_chunks,
                       words, stride_w, table, stride_t, states, slots,
                       BLOCK: tl.constexpr, ITERS: tl.constexpr, SAME: tl.constexpr,
                       WORDS: tl.constexpr, TABLE: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    t = tl.load(temps + row)
    cut = tl.where(has_cut != 0, tl.load(cutoffs + row), float("-inf"))
    noisy = tl.load(greedy + row) == 0
    key = tl.load(row_keys + row).to(tl.uint32)
    first = chunk * (BLOCK * ITERS)
    offs = tl.arange(0, BLOCK)
    lane_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    lane_best = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_idx = first + offs      # a row of -inf only keeps each lane's first index (min: 0)
    for it in tl.static_range(ITERS):
        idx = first + it * BLOCK + offs
        valid = idx < V
        x, r = load_scores_and_logits(scores, stride_s, logits, stride_l, row, idx, valid,
                                      SAME)
        # The raw logits' (max, sum of exp), as logprob_kernels' stage 1.
        lane_max, lane_sum = online_lse_step(lane_max, lane_sum, r)
        s = tl.math.div_rn(x, t)
        v = tl.where(noisy, s + gumbel(key, idx), s)
        keep = (s >= cut) & valid
        if WORDS or TABLE:
            keep = keep & allowed_bits(words, stride_w, table, stride_t, states, slots, row,
                                       idx, valid, WORDS, TABLE)
        v = tl.where(keep, v, float("-inf"))
        lane_idx = tl.where(v > lane_best, idx, lane_idx)     # strict: the first index stays
        lane_best = tl.maximum(lane_best, v)
    c_max = tl.max(lane_max, 0)
    weight = tl.where(lane_max == float("-inf"), 0.0, tl.exp(lane_max - c_max))
    best = tl.max(lane_best, 0)
    slot = row * num_chunks + chunk
    tl.store(part_max + slot, c_max)
    tl.store(part_sum + slot, tl.sum(lane_sum * weight, 0))
    tl.store(part_best + slot, best)
    tl.store(part_idx + slot, tl.min(tl.where(lane_best == best, lane_idx, _NO_ID), 0))


@triton.jit(do_not_specialize=["stride_n", "width"], do_not_specialize_on_alignment=["slots"])
def _draw_combine_kernel(part_max, part_sum, part_best, part_idx, logits, stride_l, ids,
                         logprobs, num_chunks, next_state, stride_n, width, states, slots,
                         BLOCK_C: tl.constexpr, MOVE: tl.constexpr):
    row = tl.program_id(0)
    _, _, lse = fold_chunk_stats(part_max, part_sum, row, num_chunks, BLOCK_C)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < num_chunks
    c_best = tl.load(part_best + row * num_chunks + offs, mask=mask, other=float("-inf"))
    c_idx = tl.load(part_idx + row * num_chunks + offs, mask=mask, other=_NO_ID)
    token = tl.min(tl.where(c_best == tl.max(c_best, 0), c_idx, _NO_ID), 0)
    tl.store(ids + row, token.to(tl.int64))
    raw = tl.load(logits + row.to(tl.int64) * stride_l + token).to(tl.float32)
    tl.store(logprobs + row, raw - lse)
    if MOVE:
        # The row's automaton state moves by its token (a token past the table: no fault).
        slot = tl.load(slots + row)
        if slot >= 0:
            state = tl.load(states + slot)
            column = tl.minimum(token, width - 1)
            tl.store(states + slot, tl.load(next_state + state * stride_n + column).to(tl.int64))


@triton.jit
def _noise_bits_kernel(row_keys, out, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    bits = noise_bits(tl.load(row_keys + row).to(tl.uint32), idx)
    tl.store(out + row.to(tl.int64) * V + idx, bits.to(tl.int64), mask=idx < V)


def draw_noise_bits(row_keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] int64: the hash bits the draw kernel's noise comes from (for checks against
    noise.hash_bits)."""
    out = torch.empty((row_keys.shape[0], vocab_size), dtype=torch.int64,
                      device=row_keys.device)
    if out.numel():
        _noise_bits_kernel[(row_keys.shape[0], triton.cdiv(vocab_size, 1024))](
            row_keys, out, vocab_size, BLOCK=1024)
    return out


def draw_with_logprobs(scores: torch.Tensor, logits: torch.Tensor, temperatures: torch.Tensor,
                       cutoffs: torch.Tensor | None, greedy_mask: torch.Tensor,
                       row_keys: torch.Tensor,
                       mask: TokenMask | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of scores [B, V] (rows contiguous; the adjusted logits, or `logits` itself):
    the Gumbel-max draw from softmax(scores / T) over the tokens with scores / T >= cutoffs
    (argmax for greedy rows) and allowed by `mask`, and log_softmax(logits) at it.
    temperatures [B] or [B, 1], cutoffs [B] float32 (-inf or None: none), greedy_mask [B]
    bool, row_keys [B] int64 (noise.row_key). The mask's automaton states move by the tokens
    (mask.moved). Cut-offs are the caller's: with a mask, computed over the masked scores.
    Returns (ids [B] int64, logprobs [B] float32)."""
    b, v = scores.shape
    if scores.stride(1) != 1 or logits.stride(1) != 1 or logits.shape != scores.shape:
        raise ValueError("draw_with_logprobs needs scores and logits of one shape, unit stride")
    device = scores.device
    ids = torch.empty(b, dtype=torch.int64, device=device)
    logprobs = torch.empty(b, dtype=torch.float32, device=device)
    if b == 0:
        return ids, logprobs
    chunks = triton.cdiv(v, CHUNK)
    # Three [B, chunks] partials in one buffer, each starting 16-byte aligned (so that the
    # kernels' pointer arguments align the same way at every batch size: one compile).
    per_part = triton.cdiv(b * chunks, 4) * 4
    parts = torch.empty((3, per_part), dtype=torch.float32, device=device)
    part_idx = torch.empty((b, chunks), dtype=torch.int32, device=device)
    words = mask.words if mask is not None else None
    auto = mask.automaton if mask is not None else None
    if words is not None:
        assert words.shape[0] == b and words.stride(1) == 1 and words.dtype == torch.int32
    # (absent sources: any tensor as a stand-in pointer, never read)
    w = words if words is not None else ids
    table, next_state = (auto.allowed, auto.next_state) if auto is not None else (ids, ids)
    states, slots = (auto.states, auto.slots) if auto is not None else (ids, ids)
    _draw_chunk_kernel[(b, chunks)](
        scores, scores.stride(0), logits, logits.stride(0), temperatures.reshape(b),
        temperatures if cutoffs is None else cutoffs, int(cutoffs is not None), greedy_mask,
        row_keys, parts[0], parts[1], parts[2], part_idx, v, chunks,
        w, w.stride(0), table, table.stride(0), states, slots, BLOCK=BLOCK, ITERS=ITERS,
        SAME=scores is logits, WORDS=words is not None, TABLE=auto is not None,
        num_warps=WARPS)
    _draw_combine_kernel[(b,)](parts[0], parts[1], parts[2], part_idx, logits,
                               logits.stride(0), ids, logprobs, chunks, next_state,
                               next_state.stride(0), next_state.shape[-1], states, slots,
                               BLOCK_C=max(16, triton.next_power_of_2(chunks)),
                               MOVE=auto is not None, num_warps=1)
    if auto is not None:
        mask.moved = True
    return ids, logprobs
