"""The fused Triton kernels (RMSNorm +/- residual, SiLU-and-mul, rotary) against the layers'
PyTorch code, which is their reference and their fallback.

Three tiers:
  * `test_interpreter_small_cases`: tiny shapes run by the Triton CPU interpreter in a child
    process (TRITON_INTERPRET is read when the kernel modules are imported, so it is set before
    that import, in a child, keeping it out of the rest of the session). CPU only, like
    tests/test_triton_attention.py. Run it by hand for the error table:
        TRITON_INTERPRET=1 python tests/test_fused_ops.py
  * `gpu` tests: realistic shapes, every dtype, strided q/k views of a fused qkv output, CUDA-graph
    capture and no host syncs; skipped without CUDA.
  * `test_gpu_tiny_model_logits`: a tiny model's logits with the fused ops equal the fallback's
    (RADIXLM_DISABLE_FUSED_OPS=1) within tolerance.

What must match exactly: the new residual (x + residual rounded to the dtype, as PyTorch) and
rotary (the same fp32 operations in the same order, no FMA contraction). RMSNorm and SiLU
differ from PyTorch only in the fp32 intermediate's last bits (summation order; rsqrt/exp
implementations), so their outputs are compared within a tolerance of about one ulp of the
dtype, and the fraction of elements that differ at all is bounded too.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from helpers import run_file_under_interpreter, run_interpreter_cases
from radixlm.core.model_config import RopeScaling
from radixlm.layers.activation import silu_and_mul as torch_silu_and_mul
from radixlm.layers.norm import RMSNorm
from radixlm.layers.rotary import RotaryEmbedding

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# Max abs error allowed relative to the reference's magnitude (~1-2 ulp of the output dtype),
# and the fraction of elements allowed to differ at all.
REL_TOL = {F32: 2e-6, F16: 2e-3, BF16: 1.6e-2}
MAX_DIFF_FRACTION = {F32: 1.0, F16: 0.02, BF16: 0.02}
# Triton's CPU interpreter (3.9, interpreter.py cast_impl) truncates fp32 -> bf16 instead of
# rounding to nearest even, so under it bf16 results are checked within two bf16 ulps per element
# (RMSNorm + residual and SiLU-and-mul round twice) instead of exactly / tightly as on the GPU.
_interpreter_bf16 = False


# ---------------------------------------------------------------------- references (the layers)

def _fallback(fn):
    """Run fn with the fused path off, whatever the device."""
    old = os.environ.get("RADIXLM_DISABLE_FUSED_OPS")
    os.environ["RADIXLM_DISABLE_FUSED_OPS"] = "1"
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["RADIXLM_DISABLE_FUSED_OPS"]
        else:
            os.environ["RADIXLM_DISABLE_FUSED_OPS"] = old


def _norm_module(n: int, dtype: torch.dtype, device, g: torch.Generator) -> RMSNorm:
    m = RMSNorm(n, eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(1 + 0.5 * torch.randn(n, generator=g))
    return m.to(device=device, dtype=dtype)


def _within_two_bf16_ulps(out: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    diff = (out.float() - ref.float()).abs()
    ulps = (diff / (ref.float().abs() * 2.0 ** -7 + 1e-30)).max().item()
    assert ulps <= 2, f"{what}: {ulps:.2f} bf16 ulps off"
    return (diff.max() / ref.float().abs().max().clamp_min(1e-6)).item()


def _close(out: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape)
    if ref.numel() == 0:
        return 0.0
    if _interpreter_bf16 and ref.dtype == BF16:
        return _within_two_bf16_ulps(out, ref, what)
    diff = (out.float() - ref.float()).abs()
    scale = ref.float().abs().max().clamp_min(1e-6)
    err = (diff.max() / scale).item()
    frac = (diff > 0).float().mean().item()
    assert err <= REL_TOL[ref.dtype], f"{what}: max error {err:.3g} of max |ref| > tolerance"
    assert frac <= MAX_DIFF_FRACTION[ref.dtype], f"{what}: {frac:.2%} of elements differ"
    return err


def _exact(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape)
    if _interpreter_bf16 and ref.dtype == BF16 and ref.numel():
        _within_two_bf16_ulps(out, ref, what)
        return
    if not torch.equal(out, ref):
        d = (out.float() - ref.float()).abs()
        raise AssertionError(f"{what}: not bitwise equal ({(d > 0).sum().item()} elements, max "
                             f"{d.max().item():.3g})")


def _qkv_views(t: int, hq: int, hk: int, d: int, dtype, device, g: torch.Generator):
    """q [T, Hq, D] and k [T, Hk, D] as strided views of one [T, (Hq + 2 Hk) D] tensor, the way
    LlamaAttention passes them."""
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(dtype).to(device)
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return qkv, q.reshape(-1, hq, d), k.reshape(-1, hk, d)


# ---------------------------------------------------------------------- one case of each op

def check_rmsnorm(t: int, n: int, dtype, device, residual: bool, layout: str = "2d",
                  seed: int = 0) -> float:
    """layout: '2d' [T, N]; 'heads' a strided [T, H, N] view (Qwen3's q/k norm, N = head dim);
    '1d' a single row."""
    from radixlm.layers.kernels.norm_kernels import rms_norm

    g = torch.Generator().manual_seed(seed)
    m = _norm_module(n, dtype, device, g)
    if layout == "heads":
        _, x, _ = _qkv_views(t, 3, 1, n, dtype, device, g)
        assert not x.is_contiguous() or t <= 1
    elif layout == "1d":
        x = (3 * torch.randn(n, generator=g)).to(dtype).to(device)
    else:
        x = (3 * torch.randn(t, n, generator=g)).to(dtype).to(device)
    r = torch.randn(x.shape, generator=g).to(dtype).to(device) if residual else None
    x_before = x.clone()
    what = f"rmsnorm{'+res' if residual else ''} {layout} T={t} N={n} {str(dtype)[6:]}"
    if residual:
        ref, ref_res = _fallback(lambda: m(x, r))
        out, out_res = rms_norm(x, m.weight, m.eps, r)
        _exact(out_res, ref_res, what + " (residual)")
    else:
        ref = _fallback(lambda: m(x))
        out = rms_norm(x, m.weight, m.eps)
    assert torch.equal(x, x_before), "inputs must not be written"
    return _close(out, ref, what)


def check_silu_and_mul(t: int, i: int, dtype, device, strided: bool = False,
                       seed: int = 0) -> float:
    from radixlm.layers.kernels.activation_kernels import silu_and_mul

    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(t, 2 * i + (5 if strided else 0), generator=g)).to(dtype).to(device)
    if strided:
        x = x[:, 3:3 + 2 * i]   # rows with a stride other than 2I
    ref = _fallback(lambda: torch_silu_and_mul(x))
    out = silu_and_mul(x)
    return _close(out, ref, f"silu_and_mul T={t} I={i} {str(dtype)[6:]}"
                            f"{' strided' if strided else ''}")


def check_rotary(t: int, hq: int, hk: int, d: int, dtype, device, views: bool = True,
                 scaling: RopeScaling | None = None, max_position: int = 4096, seed: int = 0,
                 halves_equal: bool = False) -> None:
    from radixlm.layers.kernels.rotary_kernels import rotary_embedding_

    g = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(d, max_position, 10000.0, scaling).to(device)
    positions = torch.randint(0, max_position, (t,), generator=g, dtype=torch.int64)
    if t:
        positions[0] = max_position - 1
    positions = positions.to(device)
    if views:
        qkv, q, k = _qkv_views(t, hq, hk, d, dtype, device, g)
        v_before = qkv[:, (hq + hk) * d:].clone()
    else:
        q = torch.randn(t, hq, d, generator=g).to(dtype).to(device)
        k = torch.randn(t, hk, d, generator=g).to(dtype).to(device)
    ref_q, ref_k = _fallback(lambda: rope(positions, q.clone(), k.clone()))
    out_q, out_k = rotary_embedding_(positions, q, k, rope.cos, rope.sin, d,
                                     halves_equal=halves_equal)
    what = (f"rotary T={t} hq={hq} hk={hk} d={d} {str(dtype)[6:]}"
            f"{' qkv-views' if views else ''}{' ' + scaling.rope_type if scaling else ''}")
    _exact(out_q, ref_q, what + " q")
    _exact(out_k, ref_k, what + " k")
    if t:   # in place: the returned tensors are the inputs' storage
        assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr(), what
        _exact(q, ref_q, what + " q in place")
    if views:
        _exact(qkv[:, (hq + hk) * d:], v_before, what + ": v must be untouched")


def check_qk_norm_rotary(t: int, hq: int, hk: int, d: int, dtype, device,
                         seed: int = 0) -> None:
    """Qwen3's per-head q/k RMSNorm folded into the rotary kernel, against RMSNorm's and
    rotary's PyTorch code in turn (the norm's mean may differ in its last bits: _close)."""
    from radixlm.layers.kernels.rotary_kernels import rotary_embedding_

    g = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(d, 4096, 10000.0).to(device)
    q_norm, k_norm = _norm_module(d, dtype, device, g), _norm_module(d, dtype, device, g)
    positions = torch.randint(0, 4096, (t,), generator=g, dtype=torch.int64).to(device)
    qkv, q, k = _qkv_views(t, hq, hk, d, dtype, device, g)
    v_before = qkv[:, (hq + hk) * d:].clone()
    ref_q, ref_k = _fallback(lambda: rope(positions, q.clone(), k.clone(), q_norm, k_norm))
    out_q, out_k = rotary_embedding_(positions, q, k, rope.cos, rope.sin, d, halves_equal=True,
                                     qk_norm=(q_norm.weight, k_norm.weight, q_norm.eps))
    what = f"qk-norm + rotary T={t} hq={hq} hk={hk} d={d} {str(dtype)[6:]}"
    for out, ref, name in ((out_q, ref_q, " q"), (out_k, ref_k, " k")):
        if _interpreter_bf16 and dtype == BF16:
            # The interpreter truncates both roundings (norm, then rotation), and a rotation
            # that cancels leaves a tiny element with that error: bound it by the largest.
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err <= 2 ** -6, f"{what}{name}: {err:.3g} of max |ref|"
        else:
            _close(out, ref, what + name)
    if t:
        assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr(), what
    _exact(qkv[:, (hq + hk) * d:], v_before, what + ": v must be untouched")


# ---------------------------------------------------------------------- interpreter (CPU) tier

LLAMA3 = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=256)


def _interpreter_cases():
    for dt in (F32, F16, BF16):
        name = str(dt)[6:]
        for t, n in ((0, 64), (1, 96), (7, 160), (3, 576)):
            yield f"rmsnorm T={t} N={n} {name}", lambda t=t, n=n, dt=dt: check_rmsnorm(
                t, n, dt, "cpu", residual=False)
            yield f"rmsnorm+res T={t} N={n} {name}", lambda t=t, n=n, dt=dt: check_rmsnorm(
                t, n, dt, "cpu", residual=True)
        yield f"rmsnorm heads {name}", lambda dt=dt: check_rmsnorm(5, 32, dt, "cpu", False,
                                                                     "heads")
        yield f"rmsnorm+res heads {name}", lambda dt=dt: check_rmsnorm(5, 32, dt, "cpu", True,
                                                                         "heads")
        yield f"rmsnorm 1d {name}", lambda dt=dt: check_rmsnorm(1, 48, dt, "cpu", False, "1d")
        for t, i in ((0, 48), (1, 48), (5, 1100)):
            yield f"silu_and_mul T={t} I={i} {name}", lambda t=t, i=i, dt=dt: check_silu_and_mul(
                t, i, dt, "cpu")
        yield f"silu_and_mul strided {name}", lambda dt=dt: check_silu_and_mul(3, 40, dt, "cpu",
                                                                               strided=True)
        for t, hq, hk, d in ((0, 4, 2, 64), (1, 4, 2, 64), (9, 6, 1, 32), (4, 3, 3, 96)):
            yield (f"rotary T={t} hq={hq} hk={hk} d={d} {name}",
                   lambda t=t, hq=hq, hk=hk, d=d, dt=dt: check_rotary(t, hq, hk, d, dt, "cpu"))
        for t, hq, hk, d in ((1, 4, 2, 64), (6, 3, 1, 32)):
            yield (f"qk-norm + rotary T={t} hq={hq} hk={hk} d={d} {name}",
                   lambda t=t, hq=hq, hk=hk, d=d, dt=dt: check_qk_norm_rotary(t, hq, hk, d, dt,
                                                                              "cpu"))
        yield f"rotary contiguous llama3 {name}", lambda dt=dt: check_rotary(
            5, 4, 2, 64, dt, "cpu", views=False, scaling=LLAMA3, max_position=512,
            halves_equal=True)


def interpreter_main() -> int:
    global _interpreter_bf16
    _interpreter_bf16 = True
    return run_interpreter_cases(_interpreter_cases())


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check under Triton's interpreter; on a GPU the gpu tests run the "
                           "real kernels")
def test_interpreter_small_cases():
    pytest.importorskip("triton")
    run_file_under_interpreter(__file__, unset_env=("RADIXLM_DISABLE_FUSED_OPS",))


def test_cpu_layers_never_take_the_fused_path(monkeypatch):
    """On CPU the layers run their PyTorch code whatever the knob says (and import no Triton
    kernel module)."""
    from radixlm.layers import kernels

    x = torch.randn(3, 8)
    assert not kernels.use_fused(x)
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "0")
    assert not kernels.use_fused(x)
    before = {m for m in sys.modules if m.startswith("radixlm.layers.kernels.")}
    RMSNorm(8)(x, torch.randn(3, 8))
    torch_silu_and_mul(x)
    rope = RotaryEmbedding(8, 16, 10000.0)
    rope(torch.arange(3), torch.randn(3, 2, 8), torch.randn(3, 1, 8))
    assert {m for m in sys.modules if m.startswith("radixlm.layers.kernels.")} == before


def test_disable_knob(monkeypatch):
    import radixlm.envs as envs
    monkeypatch.delenv("RADIXLM_DISABLE_FUSED_OPS", raising=False)
    assert not envs.disable_fused_ops()
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "1")
    assert envs.disable_fused_ops()


# ---------------------------------------------------------------------- GPU tier

DTYPES = [BF16, F16, F32]
TOKENS = [1, 7, 256, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2048, 4096, 576, 960, 1536, 3584])
@pytest.mark.parametrize("t", TOKENS)
def test_gpu_rmsnorm(t, n, dtype):
    check_rmsnorm(t, n, dtype, "cuda", residual=False, seed=t + n)
    check_rmsnorm(t, n, dtype, "cuda", residual=True, seed=t + n + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", [0, 1, 7, 4096])
def test_gpu_rmsnorm_head_views(t, dtype):
    for d in (64, 128):
        check_rmsnorm(t, d, dtype, "cuda", residual=False, layout="heads", seed=d)


@pytest.mark.gpu
def test_gpu_rmsnorm_edge_shapes():
    check_rmsnorm(0, 4096, BF16, "cuda", residual=True)
    check_rmsnorm(1, 4096, BF16, "cuda", residual=False, layout="1d")
    check_rmsnorm(3, 16384, BF16, "cuda", residual=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("i", [8192, 14336, 4864, 2816])
@pytest.mark.parametrize("t", [0] + TOKENS)
def test_gpu_silu_and_mul(t, i, dtype):
    check_silu_and_mul(t, i, dtype, "cuda", seed=t + i)


@pytest.mark.gpu
def test_gpu_silu_and_mul_strided():
    check_silu_and_mul(33, 1000, BF16, "cuda", strided=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hk,d", [(32, 8, 64), (32, 8, 128), (14, 2, 64), (28, 4, 128),
                                     (16, 16, 256), (12, 2, 80)])
@pytest.mark.parametrize("t", [0] + TOKENS)
def test_gpu_rotary(t, hq, hk, d, dtype):
    check_rotary(t, hq, hk, d, dtype, "cuda", views=True, seed=t + d)
    check_rotary(t, hq, hk, d, dtype, "cuda", views=False, scaling=LLAMA3, seed=t + d + 1,
                 halves_equal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hk,d", [(16, 8, 128), (32, 4, 128), (14, 2, 64)])
@pytest.mark.parametrize("t", TOKENS)
def test_gpu_qk_norm_rotary(t, hq, hk, d, dtype):
    check_qk_norm_rotary(t, hq, hk, d, dtype, "cuda", seed=t + d)


def _all_ops(x, r, gate_up, positions, q, k, norm, rope):
    out, res = norm(x, r)
    act = torch_silu_and_mul(gate_up)
    q, k = rope(positions, q, k)
    return out, res, act, q, k


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_no_host_sync():
    """All three ops in one captured graph: replays with new inputs give eager's results, and an
    eager call does not wait on the GPU."""
    from radixlm.layers import kernels
    assert kernels.use_fused(torch.empty(1, device="cuda"))
    g = torch.Generator().manual_seed(0)
    dev, dt, t = "cuda", BF16, 8
    norm = _norm_module(4096, dt, dev, g)
    rope = RotaryEmbedding(128, 4096, 500000.0).to(dev)

    def inputs():
        x = torch.randn(t, 4096, generator=g).to(dt)
        r = torch.randn(t, 4096, generator=g).to(dt)
        gu = torch.randn(t, 2 * 14336, generator=g).to(dt)
        pos = torch.randint(0, 4096, (t,), generator=g)
        qkv = torch.randn(t, 48 * 128, generator=g).to(dt)
        return x, r, gu, pos, qkv

    static = [a.to(dev) for a in inputs()]

    def run(x, r, gu, pos, qkv):
        q, k, _ = qkv.split([32 * 128, 8 * 128, 8 * 128], dim=-1)
        return _all_ops(x, r, gu, pos, q.reshape(t, 32, 128), k.reshape(t, 8, 128), norm, rope)

    # Warm-up (compiles) on a side stream, as graph runners do; then eager without host syncs.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(*[a.clone() for a in static])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(*[a.clone() for a in static])
    finally:
        torch.cuda.set_sync_debug_mode("default")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = run(*static)
    for _ in range(2):
        new = inputs()
        for dst, src in zip(static, new):
            dst.copy_(src)
        expected = run(*[a.to(dev) for a in new])
        graph.replay()
        for a, b in zip(graph_out, expected):
            _exact(a, b, "graph replay")


TINY = dict(vocab_size=256, hidden_size=192, intermediate_size=480, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, tie_word_embeddings=False)


def _tiny_configs():
    import transformers
    yield "llama3-rope", transformers.LlamaConfig(
        **TINY, architectures=["LlamaForCausalLM"],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    yield "qwen2", __import__("transformers").Qwen2Config(**TINY,
                                                          architectures=["Qwen2ForCausalLM"])
    yield "qwen3", __import__("transformers").Qwen3Config(**TINY, head_dim=64,
                                                          architectures=["Qwen3ForCausalLM"])


def _forward_steps(runner, prompts: list[list[int]], decode_tokens: list[list[int]]
                   ) -> list[torch.Tensor]:
    """Logits of every new token of one prefill of `prompts` and then one decode step per entry
    of `decode_tokens` (a token per request), driving runner.model directly with hand-built
    ForwardBatches (scheduler-independent). Every KV slot read was written by the same run."""
    from radixlm.core.forward_batch import ForwardBatch, ForwardMode

    dev = runner.device
    bs, n_dec = len(prompts), len(decode_tokens)
    rows = list(range(1, bs + 1))
    lens = [len(p) for p in prompts]
    slots, nxt = [], 1   # slot 0 is the pool's padding slot
    for n in lens:
        slots.append(torch.arange(nxt, nxt + n + n_dec))
        nxt += n + n_dec
    table = runner.attn_backend.req_to_token_pool
    for r, s in zip(rows, slots):
        table.write(r, 0, s.to(dev))

    def step(mode, ids, prefix, new):
        seq = [p + n for p, n in zip(prefix, new)]
        fb = ForwardBatch(
            forward_mode=mode, batch_size=bs,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, new)]).to(dev),
            out_cache_loc=torch.cat([s[p:p + n] for s, p, n in zip(slots, prefix, new)]).to(dev),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq, dtype=torch.int64, device=dev), seq_lens_cpu=seq,
            extend_prefix_lens_cpu=list(prefix), extend_seq_lens_cpu=list(new))
        with torch.inference_mode():
            runner.attn_backend.init_forward_metadata(fb)
            hidden = runner.model(fb.input_ids, fb.positions, fb)
            return runner.model.compute_logits(hidden).clone()

    out = [step(ForwardMode.EXTEND, [t for p in prompts for t in p], [0] * bs, lens)]
    for i, toks in enumerate(decode_tokens):
        out.append(step(ForwardMode.DECODE, toks, [n + i for n in lens], [1] * bs))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama3-rope", "qwen2", "qwen3"])
def test_gpu_tiny_model_logits(arch, tmp_path, monkeypatch):
    """Prefill and decode logits of a tiny bf16 model (Triton attention backend, fed the strided
    q/k that in-place rotary leaves), fused vs RADIXLM_DISABLE_FUSED_OPS=1."""
    import transformers

    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig

    cfg = dict(_tiny_configs())[arch]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    del hf
    runner, _ = create_runner_and_kv(RunnerConfig(model_path=str(tmp_path), device="cuda",
                                                  dtype="bfloat16", max_total_tokens=2048))
    assert runner.dtype == BF16

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 37, 1, 130)]
    decode = [torch.randint(0, 256, (len(prompts),), generator=g).tolist() for _ in range(3)]
    monkeypatch.delenv("RADIXLM_DISABLE_FUSED_OPS", raising=False)
    fused = _forward_steps(runner, prompts, decode)
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "1")
    ref = _forward_steps(runner, prompts, decode)
    for i, (a, b) in enumerate(zip(fused, ref)):
        scale = b.abs().max().item()
        err = (a - b).abs().max().item()
        agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        print(f"{arch} step {i}: max |logit| {scale:.3g}, max error {err:.3g}, "
              f"argmax agreement {agree:.1%}")
        assert err <= 0.03 * scale + 1e-3, f"step {i}: error {err:.3g} vs max |logit| {scale:.3g}"


if __name__ == "__main__":
    sys.exit(interpreter_main())
