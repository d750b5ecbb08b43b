"""Each row's sampling cut-off (top-k, then top-p, then min-p) without sorting the vocabulary.

The sampler keeps, per row, the tokens whose scaled logit s = x / T is >= a cut-off: the value
at the last kept position of the row sorted in descending order, after top-k and then top-p on
the distribution renormalised over the top-k survivors, raised to max(s) + log(min_p) where
min-p applies (sampler.py: `filter_logits`, `_top_k_top_p_threshold`). Its PyTorch code sorts
every row when a request uses top-p without top-k: 2.2 ms a step at batch 64 over Qwen3's
151,936 tokens on an H200, 7.4 ms at batch 256.

The same cut-off is a search over values. Dividing by T (rounded to nearest) keeps the order of
the logits, so the search runs over x and the cut-off is the found x divided by T. With S(u)
the sum of exp((x - max) / T) over the tokens whose logit is strictly above u:
  * top-k's cut-off tk is the k-th largest logit: the largest u with at least k tokens >= u;
  * a value u is kept by top-p iff S(u) < top_p * Z, Z the softmax denominator over the top-k
    positions (S(tk) + (k - #tokens above tk) * exp((tk - max) / T), so ties at the k-th
    position count as a sort's positions do); top-p's cut-off up is the smallest such u;
  * the row's cut-off is max(tk / T, up / T, max / T + log(min_p)).
Each search runs over the logits' values in their ordered-integer form ("keys": 2**16 of them
for bf16 / fp16 logits and float32 ones that hold bf16 values, as a bf16 model's, 2**32 for
other float32 ones): a pass tests 16 pivots at once and narrows the bracket 16-fold, so 4
passes (8 for float32) find the exact value. The caller vouches for `bf16_values`: float32
logits with other low bits would be compared by their top 16 bits (ties within a bf16 step).

Every pass is one launch over (rows x chunks of CHUNK values): a program first folds the
previous pass's per-chunk results of its row (a [chunks, 16] tile) into the narrowed bracket,
then evaluates the new pivots over its chunk. Unlike one program a row (tried first: as slow as
the sort, `results/issue12/topp_threshold_tried/`), the GPU is full. Launches: a statistics
pass (the row's max and softmax denominator), 4 (8) for top-k plus one for its denominator, 4
(8) for top-p, and a final fold; a batch runs only the searches some row needs.

Equal to the sort in exact arithmetic; the sums run in another order, so a token whose mass
before it is within float32 rounding of top_p can fall on the other side. Rows using no filter
get -inf. NaN logits are not supported (as in the sort). Capturable in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 8192       # values a program covers, at most (fewer for small batches: `_chunk`)
MIN_CHUNK = 2048
BLOCK = 256        # values a program loads at once
PIVOTS = 16        # values a pass tests: 16-fold narrowing
SEARCH_WARPS = 8
_LOG2E = tl.constexpr(1.4426950408889634)


def key_bits(dtype: torch.dtype, bf16_values: bool = False) -> int:
    """Bits of the keys a search runs over: 16 for 2-byte logits and for float32 logits that
    hold bf16 values (`bf16_values`: a bf16 model's), 32 for other float32 ones."""
    if dtype in (torch.bfloat16, torch.float16) or (dtype == torch.float32 and bf16_values):
        return 16
    if dtype == torch.float32:
        return 32
    raise ValueError(f"sampling cut-offs take bf16, fp16 or float32 logits, not {dtype}")


@triton.jit
def _keys(x, valid, WIDE: tl.constexpr, LOW: tl.constexpr):
    """Logits -> int32 keys with the order of the values: the float's bits with the magnitude
    bits of negative values flipped (float32: -0.0 taken as +0.0; 16-bit: -0.0 one below
    +0.0). 16-bit keys of float32 logits are those of their top 16 bits, their bf16 bits when
    they hold bf16 values. Lanes past the row get LOW, below every token's (the smallest key a
    float can have is -inf's, above it)."""
    if WIDE:
        bits = (x + 0.0).to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    else:
        if x.dtype == tl.float32:
            bits = x.to(tl.int32, bitcast=True) >> 16
        else:
            bits = x.to(tl.int16, bitcast=True).to(tl.int32)
        key = bits ^ ((bits >> 15) & 0x7FFF)
    return tl.where(valid, key, LOW)


@triton.jit
def _value(key, X, WIDE: tl.constexpr):
    """The logit (as float32) whose key this is (`_keys`' inverse; key an int64)."""
    k32 = key.to(tl.int32)
    if WIDE:
        value = (k32 ^ ((k32 >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    else:
        bits = (k32 ^ ((k32 >> 15) & 0x7FFF)).to(tl.int16)
        if X.dtype.element_ty == tl.float16:
            value = bits.to(tl.float16, bitcast=True).to(tl.float32)
        else:
            value = bits.to(tl.bfloat16, bitcast=True).to(tl.float32)
    return value


@triton.jit
def _pivots(lo, hi, PIVOTS: tl.constexpr):
    """PIVOTS ascending int64 keys from lo, splitting [lo, hi) evenly (lo itself first)."""
    return lo + tl.arange(0, PIVOTS).to(tl.int64) * tl.cdiv(hi - lo, PIVOTS)


@triton.jit
def _load(X, stride, row, idx, V):
    valid = idx < V
    return tl.load(X + row.to(tl.int64) * stride + idx, mask=valid, other=float("-inf")), valid


# Scratch, two tensors a call (B rows, C chunks, P pivots; `tl.num_programs(0)` is B in every
# kernel here):
#   float32 `ws`: the chunks' (max, sum of exp) [2, B, C]; top-k's per-chunk (sum of exp, count)
#                 above tk [B, C, 2]; the passes' per-chunk results [2 parities, B, C, P]
#   int64 `iws`:  the brackets (lo, hi) [2 parities, B, 2]; tk's key [B]


@triton.jit
def _zpart(ws, C):
    return ws + 2 * tl.num_programs(0) * C


@triton.jit
def _parts(ws, C, parity, PIVOTS: tl.constexpr):
    return ws + (4 + parity * PIVOTS) * tl.num_programs(0) * C


@triton.jit
def _brackets(iws, parity):
    return iws + parity * 2 * tl.num_programs(0)


@triton.jit
def _topk_keys(iws):
    return iws + 4 * tl.num_programs(0)


@triton.jit
def _row_stats(ws, row, C, BLOCK_C: tl.constexpr):
    """The row's (max logit, sum of exp((x - max) / T)) from its chunks'; max 0 for a row of
    -inf only (no NaN downstream)."""
    c = tl.arange(0, BLOCK_C)
    c_m = tl.load(ws + row * C + c, mask=c < C, other=float("-inf"))
    c_s = tl.load(ws + (tl.num_programs(0) + row) * C + c, mask=c < C, other=0.0)
    m = tl.max(c_m, 0)
    # (chunk sums are relative to their own max; the scale 1/T is applied by the caller's c)
    return tl.where(m == float("-inf"), 0.0, m), c_m, c_s


@triton.jit
def _row_z(ws, row, C, c2, BLOCK_C: tl.constexpr):
    m, c_m, c_s = _row_stats(ws, row, C, BLOCK_C)
    return m, tl.sum(tl.where(c_m == float("-inf"), 0.0, c_s * tl.exp2((c_m - m) * c2)), 0)


@triton.jit
def _next_bracket(ws, iws, row, C, parity, goal, PIVOTS: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    """The bracket [lo, hi) after the pass that wrote `parity`: its pivots where the row's
    summed per-chunk results reach `goal` hold the predicate (true at lo, false at hi)."""
    state = _brackets(iws, parity)
    lo = tl.load(state + row * 2)
    hi = tl.load(state + row * 2 + 1)
    c = tl.arange(0, BLOCK_C)[:, None]
    j = tl.arange(0, PIVOTS)[None, :]
    tile = tl.load(_parts(ws, C, parity, PIVOTS) + (row * C + c) * PIVOTS + j, mask=c < C,
                   other=0.0)
    piv = _pivots(lo, hi, PIVOTS)
    ok = tl.sum(tile, 0) >= goal
    inside = piv < hi
    new_lo = tl.max(tl.where(ok & inside, piv, lo), 0)
    new_hi = tl.min(tl.where(~ok & inside, piv, hi), 0)
    return new_lo, new_hi


@triton.jit
def _top_p_goal(X, ws, iws, row, k, p, c2, V, C, WIDE: tl.constexpr, BLOCK_C: tl.constexpr):
    """(top_p * Z, max): Z over the top-k positions where top-k applies, else the row's.
    c2 = log2(e) / T."""
    m, z = _row_z(ws, row, C, c2, BLOCK_C)
    if k < V:
        c = tl.arange(0, BLOCK_C)
        zpart = _zpart(ws, C) + (row * C + c) * 2
        above = tl.sum(tl.load(zpart, mask=c < C, other=0.0), 0)
        n_above = tl.sum(tl.load(zpart + 1, mask=c < C, other=0.0), 0)
        tk = _value(tl.load(_topk_keys(iws) + row), X, WIDE)
        z = above + (k.to(tl.float32) - n_above) * tl.exp2((tk - m) * c2)
    return p * z, m


# Chunk sizes, chunk counts and flags are run-time arguments, not specialised, and so is the
# alignment of the per-row parameters (views into SamplingBatchInfo's stacked tensors, aligned
# or not depending on the batch size): one compiled kernel serves every batch size, and
# `Sampler.warm_up` compiles them at start-up.
@triton.jit(do_not_specialize=["C", "chunk_len"], do_not_specialize_on_alignment=["temps"])
def _stats_kernel(X, stride, temps, ws, V, C, chunk_len, BLOCK: tl.constexpr):
    """Each chunk's (max logit, sum of exp((x - that max) / T))."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    c2 = _LOG2E / tl.load(temps + row)
    lane_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, chunk_len, BLOCK):
        x, _ = _load(X, stride, row, chunk * chunk_len + start + tl.arange(0, BLOCK), V)
        x = x.to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        # An unchanged maximum scales by exactly 1, a -inf value adds exactly 0 (no NaN).
        scale = tl.where(new_max == lane_max, 1.0, tl.exp2((lane_max - new_max) * c2))
        term = tl.where(x == float("-inf"), 0.0, tl.exp2((x - new_max) * c2))
        lane_sum = lane_sum * scale + term
        lane_max = new_max
    c_max = tl.max(lane_max, 0)
    weight = tl.where(lane_max == float("-inf"), 0.0, tl.exp2((lane_max - c_max) * c2))
    tl.store(ws + row * C + chunk, c_max)
    tl.store(ws + (tl.num_programs(0) + row) * C + chunk, tl.sum(lane_sum * weight, 0))


@triton.jit(do_not_specialize=["C", "chunk_len", "src", "first"],
            do_not_specialize_on_alignment=["temps", "top_ks", "top_ps"])
def _search_kernel(X, stride, temps, top_ks, top_ps, ws, iws, V, C, chunk_len, src, first,
                   MASS: tl.constexpr, WIDE: tl.constexpr, LOW: tl.constexpr,
                   HIGH: tl.constexpr, BLOCK: tl.constexpr, PIVOTS: tl.constexpr,
                   BLOCK_C: tl.constexpr):
    """One pass of the top-k (MASS false: count of keys >= pivot) or top-p (MASS: sum of
    exp((x - max) / T) over keys > pivot) search; reads the results of parity `src`, writes
    1 - src."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    k = tl.load(top_ks + row).to(tl.int32)
    p = tl.load(top_ps + row)
    c2 = _LOG2E / tl.load(temps + row)
    if MASS:
        active = p < 1.0
    else:
        active = k < V
    if active:
        if MASS:
            goal, m = _top_p_goal(X, ws, iws, row, k, p, c2, V, C, WIDE, BLOCK_C)
        else:
            goal = k.to(tl.float32)
            m = 0.0
        lo = tl.full((), LOW, dtype=tl.int64)
        hi = tl.full((), HIGH, dtype=tl.int64)
        if first == 0:
            lo, hi = _next_bracket(ws, iws, row, C, src, goal, PIVOTS, BLOCK_C)
        if chunk == 0:
            state = _brackets(iws, 1 - src)
            tl.store(state + row * 2, lo)
            tl.store(state + row * 2 + 1, hi)
        piv = tl.minimum(_pivots(lo, hi, PIVOTS), HIGH - 1).to(tl.int32)[:, None]
        # [pivots, values]: values along the threads, each thread all pivots of its values
        # (the other way round, a value's work is spread over 16 threads and spills).
        acc = tl.zeros([PIVOTS, BLOCK], dtype=tl.float32)
        for start in range(0, chunk_len, BLOCK):
            x, valid = _load(X, stride, row, chunk * chunk_len + start + tl.arange(0, BLOCK), V)
            key = _keys(x, valid, WIDE, LOW)[None, :]
            if MASS:
                e = tl.exp2((x.to(tl.float32) - m) * c2)[None, :]   # 0 at -inf
                acc += tl.where(key > piv, e, 0.0)
            else:
                acc += (key >= piv).to(tl.float32)
        j = tl.arange(0, PIVOTS)
        out = _parts(ws, C, 1 - src, PIVOTS) + (row * C + chunk) * PIVOTS
        tl.store(out + j, tl.sum(acc, 1))


@triton.jit(do_not_specialize=["C", "chunk_len", "src", "top_p"],
            do_not_specialize_on_alignment=["temps", "top_ks", "top_ps"])
def _topk_mass_kernel(X, stride, temps, top_ks, top_ps, ws, iws, V, C, chunk_len, src, top_p,
                      WIDE: tl.constexpr, LOW: tl.constexpr, BLOCK: tl.constexpr,
                      PIVOTS: tl.constexpr, BLOCK_C: tl.constexpr):
    """The top-k search's last narrowing (tk), then, for rows that go on to top-p, each chunk's
    (sum of exp((x - max) / T), count) over the logits above tk."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    k = tl.load(top_ks + row).to(tl.int32)
    if k < V:
        tk, _hi = _next_bracket(ws, iws, row, C, src, k.to(tl.float32), PIVOTS, BLOCK_C)
        if chunk == 0:
            tl.store(_topk_keys(iws) + row, tk)
        if top_p != 0:
            if tl.load(top_ps + row) < 1.0:
                m, _cm, _cs = _row_stats(ws, row, C, BLOCK_C)
                c2 = _LOG2E / tl.load(temps + row)
                above = tl.zeros([BLOCK], dtype=tl.float32)
                n_above = tl.zeros([BLOCK], dtype=tl.float32)
                for start in range(0, chunk_len, BLOCK):
                    x, valid = _load(X, stride, row,
                                     chunk * chunk_len + start + tl.arange(0, BLOCK), V)
                    gt = _keys(x, valid, WIDE, LOW) > tk.to(tl.int32)
                    above += tl.where(gt, tl.exp2((x.to(tl.float32) - m) * c2), 0.0)
                    n_above += gt.to(tl.float32)
                zpart = _zpart(ws, C) + (row * C + chunk) * 2
                tl.store(zpart, tl.sum(above, 0))
                tl.store(zpart + 1, tl.sum(n_above, 0))


@triton.jit(do_not_specialize=["C", "src", "top_k", "top_p", "min_p"],
            do_not_specialize_on_alignment=["temps", "top_ks", "top_ps", "log_min_ps"])
def _finish_kernel(X, temps, top_ks, top_ps, log_min_ps, ws, iws, out, V, C, src, top_k,
                   top_p, min_p, WIDE: tl.constexpr, LOW: tl.constexpr, HIGH: tl.constexpr,
                   PIVOTS: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    k = tl.load(top_ks + row).to(tl.int32)
    t = tl.load(temps + row)
    key = tl.full((), LOW, dtype=tl.int64)      # LOW: no cut-off
    if top_k != 0:
        if k < V:
            key = tl.load(_topk_keys(iws) + row)
    if top_p != 0:
        p = tl.load(top_ps + row)
        if p < 1.0:
            goal, _m = _top_p_goal(X, ws, iws, row, k, p, _LOG2E / t, V, C, WIDE, BLOCK_C)
            _lo, hi = _next_bracket(ws, iws, row, C, src, goal, PIVOTS, BLOCK_C)
            key = tl.maximum(key, tl.minimum(hi, HIGH - 1))
    # The search's logit / T, rounded as the sampler's division (the same order as x).
    cut = tl.where(key == LOW, float("-inf"), tl.math.div_rn(_value(key, X, WIDE), t))
    if min_p != 0:
        m, _cm, _cs = _row_stats(ws, row, C, BLOCK_C)
        cut = tl.maximum(cut, tl.math.div_rn(m, t) + tl.load(log_min_ps + row))
    tl.store(out + row, cut)


def _chunk(b: int, v: int) -> int:
    """Values a program covers: CHUNK (fewer programs, each with more work: fastest at batch
    64 over 151,936 tokens on an H200) unless that leaves fewer than ~1,000 programs."""
    chunk = CHUNK
    while chunk > MIN_CHUNK and b * triton.cdiv(v, chunk) < 1024:
        chunk //= 2
    return chunk


def sampling_cutoffs(x: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor,
                     top_p_limits: torch.Tensor, log_min_ps: torch.Tensor, *, top_k: bool,
                     top_p: bool, min_p: bool, bf16_values: bool = False) -> torch.Tensor:
    """Per row of logits x [B, V] (rows contiguous; bf16, fp16 or float32): the smallest kept
    value of x / T after top-k (top_ks [B], V where off), top-p (top_p_limits [B] float32,
    >= 1 where off) and min-p (log_min_ps [B], -inf where off); -inf for rows with none.
    temperatures [B] or [B, 1]. The flags say which filters any row uses (the searches no row
    needs are skipped). bf16_values: float32 x holds bf16 values (every one: the search runs
    over their 16-bit keys, 4 passes instead of 8). [B] float32."""
    b, v = x.shape
    if x.stride(1) != 1:
        raise ValueError("sampling_cutoffs needs rows with unit stride")
    bits = key_bits(x.dtype, bf16_values)
    device = x.device
    out = torch.empty(b, dtype=torch.float32, device=device)
    if b == 0:
        return out
    chunk = _chunk(b, v)
    chunks = triton.cdiv(v, chunk)
    ws = torch.empty((4 + 2 * PIVOTS) * b * chunks, dtype=torch.float32, device=device)
    iws = torch.empty(5 * b, dtype=torch.int64, device=device)
    temps = temperatures.reshape(b)
    grid = (b, chunks)
    keys = dict(WIDE=bits == 32, LOW=-(1 << (bits - 1)))
    # BLOCK_C covers the most chunks a row can have (not this batch's count: one compile)
    most_chunks = triton.cdiv(v, min(chunk, MIN_CHUNK))
    sizes = dict(PIVOTS=PIVOTS, BLOCK_C=max(16, triton.next_power_of_2(most_chunks)))
    rows = (x, x.stride(0), temps, top_ks, top_p_limits, ws, iws, v, chunks, chunk)
    if top_p or min_p:
        _stats_kernel[grid](x, x.stride(0), temps, ws, v, chunks, chunk, BLOCK=BLOCK,
                            num_warps=4)
    last = 1        # the parity the latest pass wrote

    def search(mass: bool) -> None:
        nonlocal last
        for step in range(bits // 4):       # 16 pivots: 4 bits of the key a pass
            _search_kernel[grid](*rows, last, int(step == 0), MASS=mass, HIGH=1 << (bits - 1),
                                 BLOCK=BLOCK, num_warps=SEARCH_WARPS, **keys, **sizes)
            last = 1 - last

    if top_k:
        search(mass=False)
        _topk_mass_kernel[grid](*rows, last, int(top_p), BLOCK=BLOCK, num_warps=4, **keys,
                                **sizes)
    if top_p:
        search(mass=True)
    _finish_kernel[(b,)](x, temps, top_ks, top_p_limits, log_min_ps, ws, iws, out, v, chunks,
                         last, int(top_k), int(top_p), int(min_p), HIGH=1 << (bits - 1),
                         num_warps=1, **keys, **sizes)
    return out
