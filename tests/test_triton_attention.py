"""The Triton attention backend against the torch_native reference, on random pools and batches.

Two tiers:
  * `gpu` tests: realistic shapes (long prompts, 32k-token decode, mixed batches), every dtype,
    GQA ratio and head dim; skipped without CUDA.
  * `test_interpreter_small_cases`: a handful of tiny shapes run by the Triton CPU interpreter in
    a child process. TRITON_INTERPRET is read when `@triton.jit` decorates a kernel, i.e. when
    the kernels module is imported, so it has to be set before that import; a child process keeps
    it from leaking into the rest of the test session. Run the child by hand for the error table:
        TRITON_INTERPRET=1 python tests/test_triton_attention.py

The reference runs in fp32 on the same (already rounded) inputs, so the reported error is the
kernels' own rounding, not the reference's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import run_file_under_interpreter, run_interpreter_cases, sync_checked_backend
from radixlm.layers.attention.torch_native import TorchNativeAttnBackend
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool
from radixlm.core.forward_batch import ForwardBatch, ForwardMode

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
LAYER_ID = 1  # not 0, so a backend that ignores layer_id reads the wrong buffers


@dataclass
class FakeLayer:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float

    @property
    def v_head_dim(self) -> int:
        return self.head_dim


@dataclass
class Case:
    prefix_lens: list[int]
    extend_lens: list[int]     # decode: all 1
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    decode: bool = False
    kv_dtype: torch.dtype | None = None   # the pool's dtype when it differs from the model's

    def __str__(self) -> str:
        kind = "decode" if self.decode else "extend"
        kv = f" kv={str(self.kv_dtype)[6:]}" if self.kv_dtype else ""
        return (f"{kind} hq={self.num_heads} hk={self.num_kv_heads} d={self.head_dim} "
                f"{str(self.dtype)[6:]}{kv} prefix={_short(self.prefix_lens)} "
                f"extend={_short(self.extend_lens)}")


def _short(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 6 else f"[{len(xs)} reqs, max {max(xs)}]"


def decode_case(seq_lens: list[int], hq: int, hk: int, d: int, dtype: torch.dtype,
                kv_dtype: torch.dtype | None = None) -> Case:
    return Case([s - 1 for s in seq_lens], [1] * len(seq_lens), hq, hk, d, dtype, decode=True,
                kv_dtype=kv_dtype)


def _forward_batch(case: Case, dev: torch.device, rows: torch.Tensor,
                   out_loc: torch.Tensor) -> ForwardBatch:
    seq_lens = [p + e for p, e in zip(case.prefix_lens, case.extend_lens)]
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(case.prefix_lens,
                                                                 case.extend_lens)])
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE if case.decode else ForwardMode.EXTEND,
        batch_size=len(seq_lens),
        input_ids=torch.zeros(len(positions), dtype=torch.int64, device=dev),
        positions=positions.to(dev), out_cache_loc=out_loc.to(dev),
        req_pool_indices=rows.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev), seq_lens_cpu=seq_lens,
        extend_prefix_lens_cpu=list(case.prefix_lens), extend_seq_lens_cpu=list(case.extend_lens))


def run_case(case: Case, device: str, seed: int = 0, backend_cls: type | None = None,
             **backend_kwargs) -> float:
    """Run `case` through TritonAttnBackend (or `backend_cls`) and, in fp32, through
    TorchNativeAttnBackend; assert the new K/V landed in the pool and the outputs agree; return
    the max abs error."""
    from radixlm.layers.attention.triton_backend import TritonAttnBackend

    g = torch.Generator().manual_seed(seed)
    hq, hk, d, dt = case.num_heads, case.num_kv_heads, case.head_dim, case.dtype
    kv_dt = case.kv_dtype or dt
    bs = len(case.prefix_lens)
    seq_lens = [p + e for p, e in zip(case.prefix_lens, case.extend_lens)]
    total, t = sum(seq_lens), sum(case.extend_lens)
    num_slots = total + 1 + 37  # slot 0 is padding; spare slots hold garbage nobody may read

    # Scattered, non-monotonic slots and table rows: the kernels must follow req_to_token.
    slots = (torch.randperm(num_slots - 1, generator=g)[:total] + 1).split(seq_lens)
    rows = torch.randperm(bs + 3, generator=g)[:bs]
    table = ReqToTokenPool(bs + 3, max(seq_lens) + 8, device)
    for r, s in zip(rows.tolist(), slots):
        table.write(r, 0, s.to(device))
    out_loc = torch.cat([s[p:] for s, p in zip(slots, case.prefix_lens)])

    pool = KVPool(num_slots, 2, hk, d, kv_dt, device)
    for buf in pool.k_buffers + pool.v_buffers:
        buf.copy_(torch.randn(buf.shape, generator=g).to(kv_dt))
    ref_pool = KVPool(num_slots, 2, hk, d, torch.float32, device)
    for dst, src in zip(ref_pool.k_buffers + ref_pool.v_buffers, pool.k_buffers + pool.v_buffers):
        dst.copy_(src)
    # Inputs exactly representable in both dtypes: storing them in the pool loses nothing, so
    # the reference (which reads every key back from the pool) sees the same numbers.
    q = torch.randn(t, hq * d, generator=g).to(dt).to(device)
    k = torch.randn(t, hk * d, generator=g).to(kv_dt).to(dt).to(device)
    v = torch.randn(t, hk * d, generator=g).to(kv_dt).to(dt).to(device)
    layer = FakeLayer(LAYER_ID, hq, hk, d, scaling=d ** -0.5)

    backend = (backend_cls or TritonAttnBackend)(pool, table, **backend_kwargs)
    fb = _forward_batch(case, pool.device, rows, out_loc)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, layer, fb)

    ref_backend = TorchNativeAttnBackend(ref_pool, table)
    ref_fb = fb
    ref_backend.init_forward_metadata(ref_fb)
    # The math kernel: exact fp32 on GPU too (the fused SDPA kernels may use TF32 for fp32).
    with sdpa_kernel([SDPBackend.MATH]):
        ref = ref_backend.forward(q.float(), k.float(), v.float(), layer, ref_fb)

    loc = out_loc.to(device)
    assert torch.equal(pool.k_buffers[LAYER_ID][loc], k.view(-1, hk, d).to(kv_dt))
    assert torch.equal(pool.v_buffers[LAYER_ID][loc], v.view(-1, hk, d).to(kv_dt))
    assert out.shape == (t, hq * d) and out.dtype == dt
    err = (out.float() - ref).abs().max().item()
    assert err <= TOL[dt], f"{case}: max abs error {err:.3g} > {TOL[dt]:g}"
    return err


def run_split_case(seq_lens: list[int], splits: list[int], max_kv_splits: int, hq: int, hk: int,
                   d: int, dtype: torch.dtype, device: str, block_n: int, seed: int = 0) -> float:
    """The decode kernels with a forced per-request split count (incl. more splits than tiles,
    so some splits are empty) against a dense softmax over the gathered keys."""
    from radixlm.layers.attention.kernels import (alloc_decode_buffers, build_kv_indices,
                                                  decode_attention)

    g = torch.Generator().manual_seed(seed)
    bs, total = len(seq_lens), sum(seq_lens)
    slots = torch.randperm(total + 5, generator=g)[:total].to(torch.int32)
    table = torch.zeros(bs, max(seq_lens) + 3, dtype=torch.int32)
    for i, s in enumerate(slots.split(seq_lens)):
        table[i, :len(s)] = s
    kb = torch.randn(total + 5, hk, d, generator=g).to(dtype)
    vb = torch.randn(total + 5, hk, d, generator=g).to(dtype)
    q = torch.randn(bs, hq, d, generator=g).to(dtype)
    lens = torch.tensor(seq_lens)
    kv_indptr, kv_indices = build_kv_indices(table.to(device), torch.arange(bs).to(device),
                                             lens.to(device), total)
    buffers = alloc_decode_buffers(bs, hq, d, max_kv_splits, device)
    # NaN-filled: every row must be written (an empty request's too: zeros).
    out = torch.full((bs, hq, d), float("nan"), dtype=dtype, device=device)
    decode_attention(q.to(device), kb.to(device), vb.to(device), out, kv_indptr, kv_indices,
                     torch.tensor(splits, dtype=torch.int32, device=device), max_kv_splits,
                     d ** -0.5, buffers, block_n=block_n)
    # (checked here: the error below takes Python's max, which drops NaN)
    assert not out.isnan().any(), "a row of the output was not written"
    assert torch.equal(kv_indices.cpu(), slots.long().int())
    err = 0.0
    for i, s in enumerate(slots.split(seq_lens)):
        kk = kb[s.long()].float().repeat_interleave(hq // hk, dim=1)      # [S, Hq, D]
        vv = vb[s.long()].float().repeat_interleave(hq // hk, dim=1)
        w = torch.einsum("hd,shd->hs", q[i].float(), kk).mul(d ** -0.5).softmax(-1)
        ref = torch.einsum("hs,shd->hd", w, vv)
        err = max(err, (out[i].cpu().float() - ref).abs().max().item())
    assert err <= TOL[dtype], f"split decode {seq_lens} {splits}: max abs error {err:.3g}"
    return err


def run_tree_case(prefix_len: int, parents: list[int], hq: int, hk: int, d: int,
                  dtype: torch.dtype, device: str, block_n: int, splits: int,
                  native: bool = False, seed: int = 0) -> float:
    """The rows verifying a tree of drafts (ForwardBatch.tree_start / tree_mask): node j sits
    at KV position prefix_len + j and must see the prefix and its ancestors only. The decode
    kernel (or, `native`, the reference backend's mask) against a dense softmax over exactly
    those keys; with small tiles and several splits whole tiles and splits are masked."""
    from radixlm.speculative.ngram import DraftTree

    g = torch.Generator().manual_seed(seed)
    tree = DraftTree([0] * len(parents), parents)
    n = len(parents) + 1
    bits = tree.ancestor_bits()
    total = prefix_len + n
    slots = (torch.randperm(total + 7, generator=g)[:total] + 1).to(torch.int32)
    kb = torch.randn(total + 8, hk, d, generator=g).to(dtype)
    vb = torch.randn(total + 8, hk, d, generator=g).to(dtype)
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    seq_lens = [prefix_len + j + 1 for j in range(n)]
    tree_start = torch.full((n,), prefix_len, dtype=torch.int64)
    tree_mask = torch.tensor(bits, dtype=torch.int64)
    if native:
        pool = KVPool(total + 8, 1, hk, d, dtype, device)
        pool.k_buffers[0].copy_(kb)
        pool.v_buffers[0].copy_(vb)
        table = ReqToTokenPool(2, total + 4, device)
        table.write(1, 0, slots.to(device))
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=n, input_ids=torch.zeros(n).long(),
            positions=torch.tensor(seq_lens) - 1, out_cache_loc=torch.zeros(n).long(),
            req_pool_indices=torch.ones(n, dtype=torch.int64), seq_lens=torch.tensor(seq_lens),
            seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=[s - 1 for s in seq_lens],
            extend_seq_lens_cpu=[1] * n, tree_start=tree_start, tree_mask=tree_mask)
        backend = TorchNativeAttnBackend(pool, table)
        backend.init_forward_metadata(fb)
        layer = FakeLayer(0, hq, hk, d, scaling=d ** -0.5)
        # (the store writes K/V of every row to the padding slot 0, which no row reads)
        out = backend.forward(q.view(n, -1), torch.zeros(n, hk * d, dtype=dtype),
                              torch.zeros(n, hk * d, dtype=dtype), layer, fb).view(n, hq, d)
    else:
        from radixlm.layers.attention.kernels import (alloc_decode_buffers, build_kv_indices,
                                                      decode_attention)
        table = torch.zeros(n, total + 3, dtype=torch.int32)
        table[:, :total] = slots
        kv_indptr, kv_indices = build_kv_indices(
            table.to(device), torch.arange(n).to(device), torch.tensor(seq_lens).to(device),
            sum(seq_lens))
        buffers = alloc_decode_buffers(n, hq, d, splits, device)
        out = torch.full((n, hq, d), float("nan"), dtype=dtype, device=device)
        decode_attention(q.to(device), kb.to(device), vb.to(device), out, kv_indptr,
                         kv_indices, torch.full((n,), splits, dtype=torch.int32, device=device),
                         splits, d ** -0.5, buffers, block_n=block_n,
                         tree_start=tree_start.to(device), tree_mask=tree_mask.to(device))
    assert not out.isnan().any(), "a row of the output was not written"
    err = 0.0
    for j in range(n):
        seen = list(range(prefix_len)) + [prefix_len + i for i in range(n) if bits[j] >> i & 1]
        s = slots[seen].long()
        kk = kb[s].float().repeat_interleave(hq // hk, dim=1)
        vv = vb[s].float().repeat_interleave(hq // hk, dim=1)
        w = torch.einsum("hd,shd->hs", q[j].float(), kk).mul(d ** -0.5).softmax(-1)
        ref = torch.einsum("hs,shd->hd", w, vv)
        err = max(err, (out[j].cpu().float() - ref).abs().max().item())
    assert err <= TOL[dtype], f"tree decode {parents}: max abs error {err:.3g}"
    return err


# A tree of 40 nodes: a main chain with side branches, so rows see a few scattered nodes.
TREE_PARENTS = [0, 0, 1, 2, 2, 3, 1] + list(range(7, 40))
WIDE_PARENTS = [0] * 40 + [40]
INTERPRETER_TREE_CASES = [
    # prefix, parents, hq, hk, d, dtype, block_n, splits
    (5, TREE_PARENTS, 4, 2, 64, torch.float32, 16, 4),
    (0, [0, 0, 0, 1], 2, 1, 32, torch.float16, 16, 2),
    (40, TREE_PARENTS[:12], 6, 2, 64, torch.float32, 16, 3),
    (40, TREE_PARENTS[:12], 6, 2, 64, torch.float32, 16, 1),     # stage 1 writes the output
    # 40 siblings, then a child of the last: its row sees nodes 0, 40 and 41 only, so the
    # split over positions 16..31 holds no key it sees.
    (0, WIDE_PARENTS, 2, 2, 32, torch.float32, 16, 4),
]


# ---------------------------------------------------------------------- interpreter (CPU) tier

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Tiny tiles (16) so a few dozen tokens already cross tile, block and split boundaries.
# bf16 appears only as the pool's dtype here: the interpreter's tl.dot multiplies bf16 operands
# as their raw uint16 bits (triton 3.9 interpreter.py create_dot converts only fp8), so bf16
# *compute* is covered by the GPU tier alone.
INTERPRETER_CASES: list[tuple[Case, dict]] = [
    (Case([0, 5, 20], [7, 1, 19], 4, 1, 64, F32), dict(extend_block_m=16, extend_block_n=16)),
    (Case([3, 0], [10, 40], 6, 2, 64, F16), dict(extend_block_m=32, extend_block_n=16)),
    # The new tokens' tiles through TMA descriptors (on a GPU: Hopper, by default), with a
    # prefix, a request ending mid query block and the last one ending mid-tile, past T.
    (Case([3, 0, 21], [16, 48, 7], 4, 2, 64, F16),
     dict(extend_block_m=32, extend_block_n=16, extend_tma=True)),
    # No cached prefix anywhere (an empty prefix list), gathered and through TMA.
    (Case([0, 0], [33, 8], 4, 2, 64, F16), dict(extend_block_m=16, extend_block_n=16)),
    (Case([0, 0], [32, 9], 4, 2, 64, F16),
     dict(extend_block_m=16, extend_block_n=16, extend_tma=True)),
    (Case([33], [9], 2, 2, 128, F32, kv_dtype=BF16), dict(extend_block_m=16, extend_block_n=16)),
    (decode_case([1, 17, 50, 33], 8, 2, 64, F32), dict(decode_block_n=16)),
    (decode_case([1, 64, 65], 6, 2, 128, F16), dict(decode_block_n=16)),
    (decode_case([3, 20], 2, 2, 24, F32, kv_dtype=BF16), dict(decode_block_n=16)),
    (decode_case([9, 30], 4, 4, 24, F16), dict(decode_block_n=16)),
    # Default tiles and the backend's own split choice (4 "SMs" on CPU -> 2 splits for 300).
    (Case([70, 0], [150, 3], 12, 4, 64, F16), {}),
    (decode_case([1, 300], 4, 2, 128, F16), {}),
]
INTERPRETER_SPLIT_CASES = [
    # seq_lens, per-request splits, max splits, hq, hk, d, dtype
    ([1, 5, 40, 100], [3, 2, 4, 7], 8, 8, 2, 64, F32),
    # An empty request (CUDA-graph padding: zeros), with and without stage 2 (one split for
    # the whole batch: stage 1 writes the output).
    ([0, 5, 40, 100], [1, 2, 4, 7], 8, 8, 2, 64, F32),
    ([0, 5, 40], [1, 1, 1], 1, 4, 2, 64, F16),
    ([33, 70], [2, 5], 5, 3, 1, 64, F16),
]


def run_isolation_case(lengths: list[int], tma: bool, device: str = "cpu") -> float:
    """One request's non-finite values never reach another's output: request 1's V rows are
    inf, request 0's output stays finite and equal to a run without them. Gathered tiles
    zero the rows past a request; TMA tiles do not, so the host picks TMA only where request 0
    ends on a key-tile boundary (`tma_safe_lens`), and a forced TMA elsewhere is refused."""
    from radixlm.layers.attention.kernels.extend_attention import extend_attention

    g = torch.Generator().manual_seed(1)
    hq, hk, d, t = 4, 2, 64, sum(lengths)
    q, k, v = (torch.randn(t, h, d, generator=g).to(F16).to(device) for h in (hq, hk, hk))
    qo = torch.tensor([0, lengths[0], t], dtype=torch.int32, device=device)
    empty = torch.zeros(3, dtype=torch.int32, device=device)
    pool = torch.zeros(1, hk, d, dtype=F16, device=device)

    def run(values: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(t, hq, d, dtype=F16, device=device)
        extend_attention(q, k, values, out, pool, pool, qo, empty, empty[:1], max(lengths),
                         d ** -0.5, block_m=16, block_n=16, tma=tma, extend_lens=lengths)
        return out[:lengths[0]]

    clean = run(v)
    poisoned = v.clone()
    poisoned[lengths[0]:] = float("inf")
    got = run(poisoned)
    assert got.isfinite().all(), f"request 1's inf reached request 0 (lengths {lengths})"
    assert torch.equal(got, clean)
    if tma and lengths[0] % 16:
        raise AssertionError("a forced TMA call with an unsafe layout was not refused")
    return 0.0


def _refuses_unsafe_tma() -> float:
    try:
        run_isolation_case([23, 9], tma=True)
    except AssertionError as e:
        assert "ends inside a key tile" in str(e), e
        return 0.0
    raise AssertionError("tma=True with request 0 ending mid-tile ran")


def _interpreter_cases():
    yield "isolation, gathered, request 0 ends mid-tile", \
        lambda: run_isolation_case([23, 9], tma=False)
    yield "isolation, TMA, request 0 ends on a tile", lambda: run_isolation_case([32, 9], tma=True)
    yield "forced TMA refused where request 0 ends mid-tile", _refuses_unsafe_tma
    for case, kwargs in INTERPRETER_CASES:
        yield str(case), lambda case=case, kwargs=kwargs: run_case(case, "cpu", **kwargs)
    for lens, splits, max_s, hq, hk, d, dt in INTERPRETER_SPLIT_CASES:
        desc = f"split-decode lens={lens} splits={splits} hq={hq} hk={hk} d={d} {str(dt)[6:]}"
        yield desc, lambda a=(lens, splits, max_s, hq, hk, d, dt): run_split_case(
            *a, "cpu", block_n=16)
    for prefix, parents, hq, hk, d, dt, block_n, splits in INTERPRETER_TREE_CASES:
        desc = f"tree-decode prefix={prefix} nodes={len(parents) + 1} splits={splits}"
        yield desc, lambda a=(prefix, parents, hq, hk, d, dt, "cpu", block_n, splits): \
            run_tree_case(*a)


@pytest.mark.parametrize("prefix, parents", [(5, TREE_PARENTS), (0, [0, 0, 0, 1]),
                                             (40, TREE_PARENTS[:12]), (0, WIDE_PARENTS)])
def test_native_backend_masks_draft_trees(prefix, parents):
    """The reference backend's tree mask (CPU, no Triton) against the dense softmax."""
    run_tree_case(prefix, parents, 4, 2, 32, torch.float32, "cpu", 16, 1, native=True)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check under Triton's interpreter; on a GPU the gpu tests run the "
                           "real kernels (older Triton interpreters also differ)")
def test_interpreter_small_cases():
    pytest.importorskip("triton")
    run_file_under_interpreter(__file__)


def test_split_heuristic():
    pytest.importorskip("triton")
    from radixlm.layers.attention.kernels.decode_attention import (MAX_KV_SPLITS,
                                                                    MIN_TOKENS_PER_SPLIT,
                                                                    choose_max_kv_splits,
                                                                    per_request_kv_splits)
    from radixlm.layers.attention.kernels.mla_attention import MLA_MIN_TOKENS_PER_SPLIT
    assert MIN_TOKENS_PER_SPLIT == 64 and MLA_MIN_TOKENS_PER_SPLIT == 32
    # One long request on an H100 (132 SMs): split until ~2 waves of programs.
    assert choose_max_kv_splits(1, 8, 32768, 132) == 33
    # A big batch fills the GPU by itself; short contexts are never split below 64 tokens.
    assert choose_max_kv_splits(64, 8, 2048, 132) == 1
    assert choose_max_kv_splits(1, 8, 300, 132) == 5
    assert choose_max_kv_splits(1, 1, 10 ** 6, 132) == MAX_KV_SPLITS
    got = per_request_kv_splits(torch.tensor([1, 64, 65, 5000]), 8).tolist()
    assert got == [1, 1, 2, 8]
    # MLA's latent pool splits at 32 tokens: a 1k context at batch 1 gets 32 splits, not 16.
    assert choose_max_kv_splits(1, 1, 1024, 132, MLA_MIN_TOKENS_PER_SPLIT) == 32
    assert choose_max_kv_splits(1, 1, 1024, 132) == 16
    got = per_request_kv_splits(torch.tensor([1, 32, 33, 1000]), 64,
                                MLA_MIN_TOKENS_PER_SPLIT).tolist()
    assert got == [1, 1, 2, 32]


# ---------------------------------------------------------------------- GPU tier

GQA = [(8, 8), (12, 4), (32, 8)]   # ratios 1, 3, 4
DTYPES = [F16, BF16, F32]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("hq,hk", GQA)
def test_gpu_extend_mixed(hq, hk, head_dim, dtype):
    # Prefixes 0 / short / tile-unaligned; extends of 1 (decode-like rows in an extend batch),
    # unaligned, and a long prompt crossing many 128-row blocks.
    case = Case([0, 17, 1000, 513, 0], [1, 300, 129, 2048, 777], hq, hk, head_dim, dtype)
    print(f"{run_case(case, 'cuda'):.2e}  {case}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_gpu_long_prefill(dtype):
    case = Case([0], [8192], 32, 8, 128, dtype)
    print(f"{run_case(case, 'cuda'):.2e}  {case}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("hq,hk", GQA)
def test_gpu_decode_mixed(hq, hk, head_dim, dtype):
    g = torch.Generator().manual_seed(hq * head_dim)
    lens = [1, 2, 63, 64, 65, 257, 4097] + torch.randint(1, 3000, (25,), generator=g).tolist()
    case = decode_case(lens, hq, hk, head_dim, dtype)
    print(f"{run_case(case, 'cuda'):.2e}  {case}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_gpu_decode_draft_trees(dtype):
    for prefix, parents, splits, block_n in [(5, TREE_PARENTS, 4, 32), (300, TREE_PARENTS, 8, 32),
                                             (0, [0, 0, 0, 1], 1, 32), (0, WIDE_PARENTS, 4, 16)]:
        run_tree_case(prefix, parents, 8, 2, 128, dtype, "cuda", block_n, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("seq_lens", [[32768], [1, 32768], [5000] * 4], ids=str)
def test_gpu_decode_long_context_splits(seq_lens):
    case = decode_case(seq_lens, 32, 8, 128, F16)
    print(f"{run_case(case, 'cuda'):.2e}  {case}")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [80, 96, 256])
def test_gpu_other_head_dims(head_dim):
    run_case(Case([0, 100], [300, 70], 16, 4, head_dim, F16), "cuda")
    run_case(decode_case([1, 700, 3000], 16, 4, head_dim, F16), "cuda")


@pytest.mark.gpu
def test_gpu_forced_splits():
    run_split_case([1, 5, 40, 100, 3000], [3, 2, 4, 7, 64], 64, 32, 8, 128, F16, "cuda",
                   block_n=64)


@pytest.mark.gpu
def test_gpu_decode_has_no_host_sync():
    """forward_decode (store + both kernels) must not wait on the GPU."""
    calls: list = []
    Probe = sync_checked_backend(calls)
    run_case(decode_case([1, 300, 5000], 32, 8, 128, F16), "cuda", backend_cls=Probe)
    assert calls == [1]


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
