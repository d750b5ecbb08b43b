"""The batch-1 Triton GEMV (layers/kernels/gemv_kernels.py) against an fp32 F.linear, and when the
linear layers take it.

  * `test_interpreter_cases`: small shapes (K not a multiple of the tile, N not a multiple of the
    rows a program takes, with and without a bias) under Triton's CPU interpreter in a child
    process. By hand: TRITON_INTERPRET=1 python tests/test_gemv.py
  * CPU: the dispatch rule (one row, 1,024 <= N < 8,192, 1,024 <= K <= 8,192, or an 8B-sized
    MLP's gate_up or down, bf16/fp16) and the
    layers never taking the kernel off CUDA.
  * `gpu`: the served shapes against F.linear, inside a CUDA graph, and a linear layer at batch 1
    taking the kernel unless RADIXLM_DISABLE_GEMV=1.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import run_file_under_interpreter, run_interpreter_cases

BF16, F16 = torch.bfloat16, torch.float16


def _check(n: int, k: int, dtype: torch.dtype, device: str, bias: bool, tiles=None) -> float:
    """Max error of the kernel against an fp32 product of the same rounded inputs, asserted
    within about one ulp of the output (the only rounding the kernel does)."""
    from radixlm.layers.kernels.gemv_kernels import GemvTiles, gemv, gemv_tiles
    gen = torch.Generator().manual_seed(n * 7 + k)
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=gen).to(device=device, dtype=dtype) if bias else None
    tiles = tiles or gemv_tiles(1, n, k) or GemvTiles(8, 1024)
    y = gemv(x, w, b, tiles)
    assert y.shape == (1, n) and y.dtype == dtype
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    err = (y.float() - ref).abs().max().item()
    ulp = torch.finfo(dtype).eps * ref.abs().max().item()
    assert err <= ulp, f"N={n} K={k} {dtype} {tiles}: error {err:.3g} > {ulp:.3g}"
    return err


def _check_gated(i: int, k: int, dtype: torch.dtype, device: str, tiles=None) -> None:
    """The gated kernel (silu(gate) * up stored by the GEMV) against the two steps it
    replaces: an fp32 product rounded to the dtype, then silu_and_mul's rounding. Within one
    ulp of the output (the kernel's K sums may round differently in their last fp32 bits)."""
    from radixlm.layers.kernels.gemv_kernels import gated_supports, gemv
    gen = torch.Generator().manual_seed(i * 5 + k)
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=dtype)
    w = (torch.randn(2 * i, k, generator=gen) * k ** -0.5).to(device=device, dtype=dtype)
    tiles = tiles or gated_supports(x, w)
    y = gemv(x, w, None, tiles, gated=True)
    assert y.shape == (1, i) and y.dtype == dtype
    gate_up = F.linear(x.float(), w.float()).to(dtype).float()
    gate, up = gate_up[:, :i], gate_up[:, i:]
    ref = (F.silu(gate).to(dtype).float() * up).to(dtype).float()
    err = (y.float() - ref).abs()
    ulp = torch.finfo(dtype).eps * (ref.abs() + gate.abs() * up.abs() + 1e-3)
    assert (err <= 2 * ulp).all(), f"I={i} K={k} {dtype} {tiles}: error {err.max():.3g}"


def _check_fp32_router(n: int, k: int, device: str) -> None:
    """A float32 router (DeepSeek's) on 16-bit x: float32 logits equal to F.linear on x cast
    to float32, up to the summation order."""
    from radixlm.layers.kernels.gemv_kernels import gemv, router_tiles
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=BF16)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device)
    tiles = router_tiles(x, w)
    assert tiles is not None
    y = gemv(x, w, None, tiles)
    assert y.dtype == torch.float32 and y.shape == (1, n)
    ref = F.linear(x.float(), w)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def _interpreter_cases():
    from radixlm.layers.kernels.gemv_kernels import GemvTiles
    cases = [("fp32 router N=64 K=1024", lambda: _check_fp32_router(64, 1024, "cpu"))]
    for i, k, tiles in [(20, 1024, GemvTiles(4, 256)), (9, 600, GemvTiles(2, 256))]:
        cases.append((f"gated I={i} K={k} {tiles}",
                      lambda i=i, k=k, t=tiles: _check_gated(i, k, BF16, "cpu", t)))
    for n, k, bias, tiles in [(40, 1024, False, GemvTiles(8, 256)),
                              (37, 600, True, GemvTiles(8, 256)),     # K and N tails
                              (9, 1100, True, GemvTiles(2, 1024)),    # one K tile + tail
                              (64, 2048, False, GemvTiles(4, 512)),
                              (3, 64, False, GemvTiles(4, 128))]:     # fewer rows than a tile
        for dtype in (BF16, F16):
            cases.append((f"N={n} K={k} bias={bias} {tiles} {dtype}",
                          lambda n=n, k=k, d=dtype, b=bias, t=tiles: _check(n, k, d, "cpu", b, t)))
    return cases


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the gpu tests run the kernel")
def test_interpreter_cases():
    pytest.importorskip("triton")
    run_file_under_interpreter(__file__)


def test_dispatch_rule():
    pytest.importorskip("triton")
    from radixlm.layers.kernels.gemv_kernels import gemv_tiles, supports
    for n, k in [(3072, 4096), (28672, 4096), (14336, 4096), (16384, 2048), (4096, 14336)]:
        assert gemv_tiles(1, n, k) is not None, (n, k)
    for m, n, k in [(2, 3072, 4096), (1, 8192, 2048), (1, 128256, 4096), (1, 512, 4096),
                    (1, 4096, 576), (1, 28672, 8192), (1, 8192, 14336), (2, 28672, 4096),
                    (1, 576, 2048), (1, 576, 1536)]:      # narrow layers: `latent_tiles` only
        assert gemv_tiles(m, n, k) is None, (m, n, k)
    w = torch.empty(3072, 4096, dtype=BF16)
    assert supports(torch.empty(1, 4096, dtype=BF16), w) is not None
    assert supports(torch.empty(1, 1, 4096, dtype=BF16), w) is not None
    assert supports(torch.empty(1, 4096, dtype=torch.float32), w.float()) is None
    assert supports(torch.empty(1, 4096, dtype=F16), w) is None            # mixed dtypes
    assert supports(torch.empty(1, 4096, dtype=BF16), w.t().contiguous().t()) is None
    assert supports(torch.empty(2, 4096, dtype=BF16), w) is None


def test_cpu_layers_use_f_linear(monkeypatch):
    """Off CUDA the layer is F.linear: the kernel module is never asked."""
    from radixlm.layers import linear
    from radixlm.layers.kernels import gemv_kernels
    monkeypatch.setattr(gemv_kernels, "gemv", lambda *a: pytest.fail("gemv called on the CPU"))
    layer = linear.RowParallelLinear(1024, 2048).to(BF16)
    layer.weight.data.normal_()
    x = torch.randn(1, 1024, dtype=BF16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))


# ---------------------------------------------------------------------------------- GPU

SERVED = [(1536, 4096), (2560, 8192), (3072, 4096), (4096, 1024), (4096, 3584), (4096, 14336),
          (6144, 4096), (7168, 4096), (2048, 2048), (1280, 8192), (14336, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
@pytest.mark.parametrize("n,k", SERVED)
def test_gpu_served_shapes(n, k, dtype):
    _check(n, k, dtype, "cuda", bias=False)
    _check(n, k, dtype, "cuda", bias=True)


@pytest.mark.gpu
@pytest.mark.parametrize("i,k", [(14336, 4096), (7168, 4096), (8192, 2048), (3072, 1024),
                                 (1536, 4096)])
def test_gpu_gated_served_shapes(i, k):
    _check_gated(i, k, BF16, "cuda")


def test_gated_rule():
    pytest.importorskip("triton")
    from radixlm.layers.kernels.gemv_kernels import gated_supports, gemv_tiles
    x = torch.empty(1, 4096, dtype=BF16)
    tiles = gated_supports(x, torch.empty(28672, 4096, dtype=BF16))
    assert tiles is not None and tiles.block_n == max(2, gemv_tiles(1, 28672, 4096).block_n // 2)
    assert gated_supports(x, torch.empty(3, 4096, dtype=BF16)) is None        # odd rows
    assert gated_supports(x, torch.empty(128256, 4096, dtype=BF16)) is None   # not taken
    assert gated_supports(torch.empty(2, 4096, dtype=BF16),
                          torch.empty(28672, 4096, dtype=BF16)) is None       # two rows


@pytest.mark.gpu
def test_gpu_mlp_takes_gated_gemv_at_batch_1(monkeypatch):
    """A gate_up layer's silu_and_mul at batch 1 is one gated GEMV; with the GEMV off, or two
    rows, the product and the activation kernel; the results agree."""
    from radixlm.layers import linear
    from radixlm.layers.activation import silu_and_mul
    from radixlm.layers.kernels import gemv_kernels
    calls = []
    real = gemv_kernels.gemv
    monkeypatch.setattr(gemv_kernels, "gemv",
                        lambda *a, **kw: calls.append(kw.get("gated", False)) or real(*a, **kw))
    with torch.device("cuda"):
        layer = linear.MergedColumnParallelLinear(4096, [7168, 7168]).to(BF16)
    layer.weight.data.normal_(std=4096 ** -0.5)
    x = torch.randn(1, 4096, device="cuda", dtype=BF16)
    y = layer.silu_and_mul(x)
    assert calls == [True] and y.shape == (1, 7168)
    monkeypatch.setenv("RADIXLM_DISABLE_GEMV", "1")
    unfused = layer.silu_and_mul(x)
    assert calls == [True]
    assert torch.equal(unfused, silu_and_mul(F.linear(x, layer.weight)))
    assert (y.float() - unfused.float()).abs().max().item() <= 0.02 * unfused.abs().max().item()
    monkeypatch.delenv("RADIXLM_DISABLE_GEMV")
    two = layer.silu_and_mul(torch.randn(2, 4096, device="cuda", dtype=BF16))
    assert two.shape == (2, 7168) and calls == [True]


@pytest.mark.gpu
def test_gpu_odd_shapes():
    from radixlm.layers.kernels.gemv_kernels import GemvTiles
    _check(1031, 1100, BF16, "cuda", bias=True, tiles=GemvTiles(8, 1024))
    _check(5, 4096, BF16, "cuda", bias=False, tiles=GemvTiles(8, 1024))


def test_router_rule():
    pytest.importorskip("triton")
    from radixlm.layers.kernels.gemv_kernels import router_tiles
    one = torch.empty(1, 2048, dtype=BF16)
    assert router_tiles(one, torch.empty(128, 2048, dtype=BF16)) is not None
    assert router_tiles(torch.empty(1, 4096, dtype=BF16), torch.empty(8, 4096, dtype=BF16))
    assert router_tiles(one, torch.empty(1, 2048, dtype=BF16)) is None       # a shared gate
    assert router_tiles(one, torch.empty(64, 2048)) is not None             # an fp32 router
    assert router_tiles(one.float(), torch.empty(64, 2048)) is None         # an fp32 model
    assert router_tiles(torch.empty(2, 2048, dtype=BF16),
                        torch.empty(128, 2048, dtype=BF16)) is None          # two rows


def test_latent_rule():
    """MLA's latent projection (576 rows) takes the GEMV only when the model asks for it."""
    pytest.importorskip("triton")
    from radixlm.layers.kernels.gemv_kernels import latent_tiles
    one = torch.empty(1, 2048, dtype=BF16)
    assert latent_tiles(one, torch.empty(576, 2048, dtype=BF16)) is not None
    assert latent_tiles(torch.empty(2, 2048, dtype=BF16), torch.empty(576, 2048, dtype=BF16)) \
        is None
    assert latent_tiles(one, torch.empty(576, 2048, dtype=torch.float8_e4m3fn)) is None
    assert latent_tiles(one, torch.empty(1024, 2048, dtype=BF16)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 5120, 7168])      # DeepSeek-V2-Lite, V2, V3
def test_gpu_latent_shapes(k):
    from radixlm.layers.kernels.gemv_kernels import latent_tiles
    tiles = latent_tiles(torch.empty(1, k, dtype=BF16), torch.empty(576, k, dtype=BF16))
    assert tiles is not None
    _check(576, k, BF16, "cuda", bias=False, tiles=tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(128, 2048), (64, 2048), (8, 4096), (160, 5120)])
def test_gpu_router_shapes(n, k):
    from radixlm.layers.kernels.gemv_kernels import router_tiles
    x = torch.empty(1, k, dtype=BF16)
    tiles = router_tiles(x, torch.empty(n, k, dtype=BF16))
    assert tiles is not None
    _check(n, k, BF16, "cuda", bias=False, tiles=tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(64, 2048), (256, 7168)])     # DeepSeek-V2-Lite's, V3's
def test_gpu_fp32_router(n, k):
    _check_fp32_router(n, k, "cuda")


@pytest.mark.gpu
def test_gpu_cuda_graph():
    from radixlm.layers.kernels.gemv_kernels import gemv, gemv_tiles
    x = torch.randn(1, 4096, device="cuda", dtype=BF16)
    w = torch.randn(3072, 4096, device="cuda", dtype=BF16) * 4096 ** -0.5
    tiles = gemv_tiles(1, 3072, 4096)
    y = gemv(x, w, None, tiles)     # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(x, w, None, tiles)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    ref = F.linear(x.float(), w.float())
    assert (y.float() - ref).abs().max().item() <= torch.finfo(BF16).eps * ref.abs().max().item()


@pytest.mark.gpu
def test_gpu_layer_takes_gemv_at_batch_1(monkeypatch):
    from radixlm.layers import linear
    from radixlm.layers.kernels import gemv_kernels
    calls = []
    real = gemv_kernels.gemv
    monkeypatch.setattr(gemv_kernels, "gemv", lambda *a: calls.append(1) or real(*a))
    with torch.device("cuda"):
        layer = linear.RowParallelLinear(4096, 3072).to(BF16)
    layer.weight.data.normal_(std=4096 ** -0.5)
    x = torch.randn(1, 4096, device="cuda", dtype=BF16)
    y = layer(x)
    assert calls == [1]
    monkeypatch.setenv("RADIXLM_DISABLE_GEMV", "1")
    assert torch.equal(layer(x), F.linear(x, layer.weight)) and calls == [1]
    ref = F.linear(x.float(), layer.weight.float())
    assert (y.float() - ref).abs().max().item() <= torch.finfo(BF16).eps * ref.abs().max().item()
    layer(torch.randn(2, 4096, device="cuda", dtype=BF16))     # two rows: cuBLAS
    assert calls == [1]


@pytest.mark.gpu
def test_gpu_model_logits_gemv_on_vs_off(tmp_path, monkeypatch):
    """A bf16 Llama whose every linear layer takes the kernel at batch 1 (hidden 1,024; gate_up
    the gated kernel): the logits of a prefill and four batch-1 decode steps with the kernel
    equal cuBLAS's within bf16 tolerance."""
    import transformers

    from radixlm.layers.kernels import gemv_kernels
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from test_fused_ops import _forward_steps

    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=2, vocab_size=1000,
                                   max_position_embeddings=256,
                                   architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    runner, _ = create_runner_and_kv(RunnerConfig(model_path=str(tmp_path), device="cuda",
                                                  dtype="bfloat16", max_total_tokens=1024))
    g = torch.Generator().manual_seed(1)
    prompt = [torch.randint(0, 1000, (37,), generator=g).tolist()]
    decode = [torch.randint(0, 1000, (1,), generator=g).tolist() for _ in range(4)]
    calls = []
    real = gemv_kernels.gemv
    monkeypatch.setattr(gemv_kernels, "gemv",
                        lambda *a, **kw: calls.append(kw.get("gated", False)) or real(*a, **kw))
    monkeypatch.delenv("RADIXLM_DISABLE_GEMV", raising=False)
    on = _forward_steps(runner, prompt, decode)
    assert len(calls) == 4 * 2 * 4, "4 decode steps x 2 layers x 4 linear layers"
    assert sum(calls) == 4 * 2, "gate_up with SiLU-and-mul: one gated GEMV a layer"
    monkeypatch.setenv("RADIXLM_DISABLE_GEMV", "1")
    off = _forward_steps(runner, prompt, decode)
    assert len(calls) == 4 * 2 * 4
    for i, (a, b) in enumerate(zip(on, off)):
        scale = b.abs().max().item()
        err = (a - b).abs().max().item()
        assert err <= 0.03 * scale + 1e-3, f"step {i}: error {err:.3g} vs max |logit| {scale:.3g}"


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
