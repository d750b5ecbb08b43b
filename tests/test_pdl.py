"""Programmatic dependent launch (utils/pdl.py): when it is on, and that a captured
chain of the decode step's kernels gives the same bits with and without it (a kernel reading
its predecessor's output before that output is complete would show up as a mismatch)."""

from __future__ import annotations

import pytest
import torch

from radixlm.utils import pdl


def test_off_on_cpu_and_by_knob(monkeypatch):
    assert not pdl.pdl_enabled(torch.device("cpu"))
    assert pdl.pdl_kwargs(torch.device("cpu"), 1) == {}
    monkeypatch.setenv("RADIXLM_DISABLE_PDL", "1")
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
    assert pdl.pdl_kwargs(torch.device("cuda", 0), 1) == {}


def test_only_small_batches(monkeypatch):
    """Where PDL is available, only launches of at most DEFAULT_MAX_ROWS rows (or
    RADIXLM_PDL_MAX_ROWS) take it: large decode batches measured slower with it."""
    monkeypatch.setattr(pdl, "pdl_enabled", lambda device: True)
    dev = torch.device("cuda", 0)
    on = {"PDL": True, "launch_pdl": True}
    assert pdl.pdl_kwargs(dev, 1) == on
    assert pdl.pdl_kwargs(dev, pdl.DEFAULT_MAX_ROWS) == on
    assert pdl.pdl_kwargs(dev, pdl.DEFAULT_MAX_ROWS + 1) == {}
    monkeypatch.setenv("RADIXLM_PDL_MAX_ROWS", "64")
    assert pdl.pdl_kwargs(dev, 64) == on and pdl.pdl_kwargs(dev, 65) == {}


def _layer_chain(x, res, w_norm, w_qkv, w_o, w_up, positions, cos, sin, k_buf, v_buf, locs,
                 kv_indptr, kv_indices, n_splits, max_splits, buffers, hq, hk, d):
    """Four layers of a batch-1 decode step's kernels, each consuming the one before:
    add + RMSNorm, GEMV (qkv), rotary, KV store, split-KV attention (+ its reduction),
    GEMV (o), add + RMSNorm, SiLU-and-mul."""
    from radixlm.layers.attention.kernels.decode_attention import decode_attention
    from radixlm.layers.attention.kernels.store_kv import store_kv
    from radixlm.layers.kernels.activation_kernels import silu_and_mul
    from radixlm.layers.kernels.gemv_kernels import gemv, gemv_tiles
    from radixlm.layers.kernels.norm_kernels import rms_norm
    from radixlm.layers.kernels.rotary_kernels import rotary_embedding_

    hidden = x.shape[-1]
    for _ in range(4):
        h, res = rms_norm(x, w_norm, 1e-6, res)
        qkv = gemv(h, w_qkv, None, gemv_tiles(1, w_qkv.shape[0], hidden))
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
        q, k = rotary_embedding_(positions, q, k, cos, sin, d)
        store_kv(k.view(1, hk, d), v.view(1, hk, d), k_buf, v_buf, locs)
        out = torch.empty(1, hq, d, dtype=x.dtype, device=x.device)
        decode_attention(q.view(1, hq, d), k_buf, v_buf, out, kv_indptr, kv_indices, n_splits,
                         max_splits, d ** -0.5, buffers)
        o = gemv(out.view(1, hq * d), w_o, None, gemv_tiles(1, hidden, hq * d))
        h, res = rms_norm(o, w_norm, 1e-6, res)
        x = silu_and_mul(h @ w_up.t())
    return x, res


def _same_bits_with_and_without_pdl(monkeypatch, build, names):
    """build() -> (run, refill): run() launches a chain of kernels and returns its output
    tensors, refill(generator) writes fresh inputs. The chain is captured in a CUDA graph
    with PDL off, then on, and replayed 20 times on the same inputs: every output must be
    finite and bit-identical across the two."""
    dev = torch.device("cuda")
    if not pdl.pdl_enabled(dev):
        pytest.skip("PDL needs compute capability 9.0+ and a Triton with launch_pdl")
    outs = {}
    for mode in ("off", "on"):
        if mode == "off":
            monkeypatch.setenv("RADIXLM_DISABLE_PDL", "1")
        else:
            monkeypatch.delenv("RADIXLM_DISABLE_PDL")
        run, refill = build()
        run()                                   # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = run()
        results = []
        for step in range(20):
            refill(torch.Generator(device=dev).manual_seed(100 + step))
            graph.replay()
            results.append(tuple(t.clone() for t in got))
        torch.cuda.synchronize()
        outs[mode] = results
    for step, (a, b) in enumerate(zip(outs["off"], outs["on"])):
        for name, u, w in zip(names, a, b):
            assert u.isfinite().all(), (step, name)
            assert torch.equal(u, w), f"replay {step}: {name} differs with PDL"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_captured_chain_same_bits_with_and_without_pdl(monkeypatch):
    from radixlm.layers.attention.kernels.decode_attention import (alloc_decode_buffers,
                                                                   per_request_kv_splits)
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    hidden, hq, hk, d, ctx = 2048, 16, 4, 128, 700
    w_norm = torch.rand(hidden, device=dev, dtype=dt, generator=g) + 0.5
    w_qkv = torch.randn((hq + 2 * hk) * d, hidden, device=dev, dtype=dt, generator=g) * 0.03
    w_o = torch.randn(hidden, hq * d, device=dev, dtype=dt, generator=g) * 0.03
    w_up = torch.randn(2 * hidden, hidden, device=dev, dtype=dt, generator=g) * 0.03
    cos = torch.randn(ctx + 1, d, device=dev, dtype=torch.float32, generator=g)
    sin = torch.randn(ctx + 1, d, device=dev, dtype=torch.float32, generator=g)
    positions = torch.tensor([ctx - 1], device=dev)
    locs = torch.tensor([ctx], device=dev, dtype=torch.int64)
    kv_indptr = torch.tensor([0, ctx], dtype=torch.int32, device=dev)
    kv_indices = torch.arange(1, ctx + 1, dtype=torch.int32, device=dev)
    max_splits = 8
    n_splits = per_request_kv_splits(torch.tensor([ctx], device=dev), max_splits)
    buffers = alloc_decode_buffers(1, hq, d, max_splits, dev)
    x = torch.empty(1, hidden, device=dev, dtype=dt)
    res = torch.empty_like(x)

    def build():
        k_buf = torch.zeros(ctx + 2, hk, d, device=dev, dtype=dt)
        v_buf = torch.zeros_like(k_buf)
        args = (w_norm, w_qkv, w_o, w_up, positions, cos, sin, k_buf, v_buf, locs, kv_indptr,
                kv_indices, n_splits, max_splits, buffers, hq, hk, d)

        def run():
            return (*_layer_chain(x, res, *args), k_buf[ctx])

        def refill(gen):
            for t in (x, res, k_buf, v_buf):
                t.copy_(torch.randn(t.shape, device=dev, dtype=dt, generator=gen))
        return run, refill

    _same_bits_with_and_without_pdl(monkeypatch, build, ("output", "residual", "stored k"))


def _moe_chain(x, res, w_norm, w_router, w13, w2, top_k):
    """Four MoE blocks of a batch-1 decode step, each consuming the one before: router GEMV,
    routing, the two per-pair GEMVs (the expert ids decide which weights they read), the
    pair sum, add + RMSNorm."""
    from radixlm.layers.kernels.gemv_kernels import gemv, router_tiles
    from radixlm.layers.kernels.norm_kernels import rms_norm
    from radixlm.layers.moe.experts import fused_experts
    from radixlm.layers.moe.topk import RoutingConfig, select_experts

    routing = RoutingConfig(top_k, renormalize=True)
    h, res = rms_norm(x, w_norm, 1e-6, res)
    for _ in range(4):
        logits = gemv(h, w_router, None, router_tiles(h, w_router))
        weights, ids = select_experts(logits, routing)
        y = fused_experts(h, w13, w2, weights, ids, pair_gemv=True)
        h, res = rms_norm(y, w_norm, 1e-6, res)
    return h, res


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_captured_moe_chain_same_bits_with_and_without_pdl(monkeypatch):
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    hidden, experts, inter, top_k = 2048, 64, 512, 4
    w_norm = torch.rand(hidden, device=dev, dtype=dt, generator=g) + 0.5
    w_router = torch.randn(experts, hidden, device=dev, dtype=dt, generator=g) * 0.05
    w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dt, generator=g) * 0.03
    w2 = torch.randn(experts, hidden, inter, device=dev, dtype=dt, generator=g) * 0.03
    x = torch.empty(1, hidden, device=dev, dtype=dt)
    res = torch.empty_like(x)

    def build():
        def refill(gen):
            for t in (x, res):
                t.copy_(torch.randn(t.shape, device=dev, dtype=dt, generator=gen))
        return lambda: _moe_chain(x, res, w_norm, w_router, w13, w2, top_k), refill

    _same_bits_with_and_without_pdl(monkeypatch, build, ("output", "residual"))
