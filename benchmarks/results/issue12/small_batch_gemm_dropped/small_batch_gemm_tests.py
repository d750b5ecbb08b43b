"""The small-batch GEMM (layers/kernels/small_batch_gemm.py) against an fp32 F.linear, and when
the linear layers take it.

  * `test_interpreter_cases`: small shapes in fp16 (rows and columns that are not a tile's,
    split-K 1, 2 and 4, a bias, several calls on one scratch that must be left zero, the same
    bits on every call) under Triton's CPU interpreter in a child process. By hand:
    TRITON_INTERPRET=1 python tests/test_small_batch_gemm.py
  * CPU: the rule (2-64 rows, N <= 4,096, K >= 2,048 and a multiple of the split's K) and the
    layers never taking the kernel off CUDA.
  * `gpu`: served shapes against F.linear, inside a CUDA graph replayed with new inputs, the
    same bits on every call; a linear layer at 8 / 64 rows taking the kernel unless
    RADIXLM_DISABLE_GEMV=1, and 65 rows keeping cuBLAS.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import run_cpu_interpreter_cases, run_interpreter_cases

BF16, F16 = torch.bfloat16, torch.float16


def _check(m: int, n: int, k: int, dtype: torch.dtype, device: str, bias: bool,
           tiles=None, calls: int = 3) -> float:
    """`calls` products with new x on one scratch: each within about one ulp of the output of
    an fp32 product of the same rounded inputs, the scratch zero after each, and the first
    product's bits again at the end."""
    from radixlm.layers.kernels import small_batch_gemm as sbg
    gen = torch.Generator().manual_seed(m * 131 + n * 7 + k)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=gen).to(device=device, dtype=dtype) if bias else None
    tiles = tiles or sbg.small_batch_tiles(m, n, k)
    sbg.reserve_scratch_for(torch.device(device), n)
    scratch = sbg._scratch[sbg._device_key(torch.device(device))]
    worst, first = 0.0, None
    for i in range(calls):
        x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        y = sbg.small_batch_gemm(x, w, b, tiles)
        assert y.shape == (m, n) and y.dtype == dtype
        ref = F.linear(x.float(), w.float(), None if b is None else b.float())
        err = (y.float() - ref).abs().max().item()
        ulp = torch.finfo(dtype).eps * ref.abs().max().item()
        assert err <= ulp, f"M={m} N={n} K={k} {dtype} {tiles}: error {err:.3g} > {ulp:.3g}"
        assert not scratch.partials.any() and not scratch.counters.any(), "scratch left dirty"
        worst = max(worst, err)
        if first is None:
            first = (x, y)
    x, y = first
    assert torch.equal(sbg.small_batch_gemm(x, w, b, tiles), y), "not the same bits again"
    return worst


def _interpreter_cases():
    from radixlm.layers.kernels.small_batch_gemm import SmallBatchTiles
    cases = []
    for m, n, k, bias, tiles in [(3, 40, 256, False, SmallBatchTiles(16, 16, 64, 4, 4, 2)),
                                 (17, 64, 256, True, SmallBatchTiles(32, 32, 64, 2, 4, 2)),
                                 (2, 37, 128, True, SmallBatchTiles(16, 16, 64, 1, 4, 2))]:
        # fp16 only: the interpreter's tl.dot mistakes bf16 for integers (the GPU tests take bf16)
        cases.append((f"M={m} N={n} K={k} bias={bias} {tiles}",
                      lambda a=(m, n, k, F16, "cpu", bias, tiles): _check(*a)))
    return cases


def test_interpreter_cases():
    run_cpu_interpreter_cases(__file__)


def test_rule():
    pytest.importorskip("triton")
    from radixlm.layers.kernels.small_batch_gemm import small_batch_tiles
    # o and down of Qwen3-0.6B, Llama-3.2-1B and Llama-3.1-8B; Llama-3.2-1B's qkv.
    for m, n, k in [(64, 1024, 2048), (2, 1024, 3072), (32, 2048, 8192), (64, 4096, 14336),
                    (8, 4096, 4096), (64, 3072, 2048)]:
        tiles = small_batch_tiles(m, n, k)
        assert tiles is not None and tiles.block_m >= m and k % (tiles.block_k
                                                                 * tiles.split_k) == 0, (m, n, k)
        assert tiles.split_k == (4 if n <= 2048 else 2)
    for m, n, k in [(1, 1024, 2048), (65, 1024, 2048),          # rows: the GEMV / cuBLAS
                    (64, 6144, 4096), (64, 4096, 1024),          # 8B qkv, Qwen3 qkv: cuBLAS
                    (64, 28672, 4096), (64, 1024, 2176)]:        # gate_up; K not a split
        assert small_batch_tiles(m, n, k) is None, (m, n, k)


def test_layers_keep_f_linear_off_cuda(monkeypatch):
    from radixlm.layers import linear
    from radixlm.layers.kernels import takes_small_batch_gemm
    layer = linear.RowParallelLinear(2048, 1024)
    x = torch.randn(8, 2048)
    assert not takes_small_batch_gemm(x)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 8, 16, 33, 64])
@pytest.mark.parametrize("n, k", [(1024, 2048), (1024, 3072), (2048, 8192), (4096, 14336),
                                  (3072, 2048)])
def test_gpu_served_shapes(m, n, k):
    _check(m, n, k, BF16, "cuda", bias=False)


@pytest.mark.gpu
def test_gpu_bias_and_fp16():
    _check(24, 2048, 2048, F16, "cuda", bias=True)


@pytest.mark.gpu
def test_gpu_graph_replays_with_new_inputs():
    """The scratch survives a captured graph replayed 30 times with new x: each replay equals
    the eager product's bits."""
    from radixlm.layers.kernels import small_batch_gemm as sbg
    torch.manual_seed(0)
    w = (torch.randn(1024, 3072, device="cuda") / 55).to(BF16)
    sbg.reserve_scratch_for(w.device, 1024)
    tiles = sbg.small_batch_tiles(48, 1024, 3072)
    x = torch.randn(48, 3072, device="cuda", dtype=BF16)
    sbg.small_batch_gemm(x, w, None, tiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sbg.small_batch_gemm(x, w, None, tiles)
    for _ in range(30):
        x.copy_(torch.randn(48, 3072))
        graph.replay()
        assert torch.equal(out, sbg.small_batch_gemm(x, w, None, tiles))


@pytest.mark.gpu
def test_gpu_layer_takes_the_kernel(monkeypatch):
    """A loaded down_proj-shaped layer at 8 and 64 rows runs the kernel (close to F.linear);
    with RADIXLM_DISABLE_GEMV=1, and at 65 rows, F.linear."""
    from radixlm.layers import linear
    from radixlm.layers.kernels import small_batch_gemm as sbg
    calls = []
    real = sbg.small_batch_gemm
    monkeypatch.setattr(sbg, "small_batch_gemm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.device("cuda"):
        layer = linear.RowParallelLinear(3072, 1024).to(BF16)
    layer.weight.data.normal_(std=3072 ** -0.5)
    layer.process_weights_after_loading()
    for m in (8, 64):
        x = torch.randn(m, 3072, device="cuda", dtype=BF16)
        y = layer(x)
        ref = F.linear(x, layer.weight)
        assert (y.float() - ref.float()).abs().max().item() <= 0.01 * ref.abs().max().item()
    assert len(calls) == 2
    layer(torch.randn(65, 3072, device="cuda", dtype=BF16))
    monkeypatch.setenv("RADIXLM_DISABLE_GEMV", "1")
    layer(torch.randn(8, 3072, device="cuda", dtype=BF16))
    assert len(calls) == 2


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
