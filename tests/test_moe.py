"""Mixture of experts: expert selection against HF's routers, the block alignment, and the fused
Triton grouped GEMM against the per-expert PyTorch loop.

  * routing and alignment: plain CPU tests.
  * `test_interpreter_small_cases`: the Triton kernels under the CPU interpreter in a child
    process (TRITON_INTERPRET must be set before the kernel module is imported). By hand:
        TRITON_INTERPRET=1 python tests/test_moe.py
  * `gpu` tests: real shapes (Mixtral-, Qwen3-30B-A3B- and DeepSeek-V2-Lite-sized experts) in
    bf16 at batch 1..512, and CUDA-graph capture; skipped without CUDA.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helpers import run_cpu_interpreter_cases, run_interpreter_cases
from radixlm.layers.moe.experts import experts_reference, fused_experts
from radixlm.layers.moe.topk import RoutingConfig, select_experts


def _hf_deepseek_v3_route(logits, bias, n_group, topk_group, top_k, norm, scale):
    """DeepSeek-V3's routing as transformers writes it (DeepseekV3TopkRouter.forward)."""
    import transformers
    cfg = transformers.DeepseekV3Config(n_routed_experts=logits.shape[1], hidden_size=8,
                                        num_experts_per_tok=top_k, n_group=n_group,
                                        topk_group=topk_group, norm_topk_prob=norm,
                                        routed_scaling_factor=scale)
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    router = DeepseekV3TopkRouter(cfg)
    # Feed logits through an identity projection: hidden = logits padded, weight = identity.
    e = logits.shape[1]
    router.hidden_dim = e
    router.weight = torch.nn.Parameter(torch.eye(e))
    router.e_score_correction_bias.copy_(bias)
    _, w, ids = router(logits)
    return w, ids


def _sorted_pairs(w, ids):
    order = ids.long().argsort(dim=-1)
    return w.gather(1, order), ids.long().gather(1, order)


def test_deepseek_v3_routing_matches_hf():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(33, 16, generator=g)
    bias = torch.randn(16, generator=g) * 0.1
    cfg = RoutingConfig(top_k=4, scoring="sigmoid", renormalize=True, num_groups=4,
                        topk_groups=2, group_score="top2_sum", scaling_factor=2.5)
    w, ids = select_experts(logits, cfg, bias)
    hw, hids = _hf_deepseek_v3_route(logits, bias, 4, 2, 4, True, 2.5)
    w, ids = _sorted_pairs(w, ids)
    hw, hids = _sorted_pairs(hw, hids)
    assert torch.equal(ids, hids)
    torch.testing.assert_close(w, hw)
    # Every chosen expert lies in one of the token's two allowed groups.
    assert ((ids // 4).unsqueeze(-1) == (ids // 4).unsqueeze(-2)).any(-1).all()
    assert (ids // 4).unique(dim=1).shape[1] <= 4


def test_softmax_routing_renormalises_and_groups():
    logits = torch.tensor([[4.0, 3.0, 0.0, 0.0, 2.5, 0.0], [0.0, 0.0, 5.0, 1.0, 0.0, 0.0]])
    w, ids = select_experts(logits, RoutingConfig(top_k=2, renormalize=True))
    w, ids = _sorted_pairs(w, ids)
    assert ids.tolist() == [[0, 1], [2, 3]]
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    # Grouped (DeepSeek-V2 group_limited_greedy): 3 groups of 2, one group allowed -> token 0
    # may only use experts 0 and 1 even though expert 4 beats expert 1.
    w, ids = select_experts(logits, RoutingConfig(top_k=2, num_groups=3, topk_groups=1))
    assert sorted(ids[0].tolist()) == [0, 1]
    full = logits.softmax(-1)
    torch.testing.assert_close(w, full.gather(1, ids.long()))


def test_alignment_groups_pairs_by_expert_in_whole_blocks():
    pytest.importorskip("triton")
    from radixlm.layers.moe.fused_moe_kernel import align_pairs_to_blocks
    g = torch.Generator().manual_seed(0)
    num_experts, block = 5, 4
    ids = torch.randint(0, num_experts, (13, 2), generator=g)
    ids[:, 1] = (ids[:, 0] + 1) % num_experts       # distinct experts per token
    a = align_pairs_to_blocks(ids, num_experts, block)
    n = int(a.num_padded)
    assert n % block == 0 and a.sorted_pair_ids.numel() >= n
    flat = ids.reshape(-1)
    seen = []
    for b in range(n // block):
        rows = a.sorted_pair_ids[b * block:(b + 1) * block]
        real = rows[rows < flat.numel()]
        assert (flat[real.long()] == a.block_expert[b]).all(), "a block mixes experts"
        seen += real.tolist()
    assert sorted(seen) == list(range(flat.numel())), "every pair appears exactly once"
    assert (a.sorted_pair_ids[n:] == flat.numel()).all()


def test_fused_experts_falls_back_to_the_loop_on_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 16, generator=g)
    w13 = torch.randn(4, 2 * 8, 16, generator=g)
    w2 = torch.randn(4, 16, 8, generator=g)
    w, ids = select_experts(torch.randn(7, 4, generator=g), RoutingConfig(2, renormalize=True))
    out = fused_experts(x, w13, w2, w, ids)
    # Dense reference: every expert on every token, weighted by a [T, E] routing matrix.
    route = torch.zeros(7, 4).scatter_(1, ids.long(), w)
    gate_up = torch.einsum("th,enh->ten", x, w13)
    act = torch.nn.functional.silu(gate_up[..., :8]) * gate_up[..., 8:]
    dense = torch.einsum("tei,ehi,te->th", act, w2, route)
    torch.testing.assert_close(out, dense, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the Triton kernels

def _kernel_case(tokens: int, experts: int, top_k: int, hidden: int, inter: int,
                 dtype: torch.dtype, device: str, seed: int = 0,
                 pair_gemv: bool | None = None) -> float:
    """`pair_gemv`: True / False force the per-pair GEMVs / the grouped GEMMs; None lets the
    layer choose by the number of tokens."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g, device=device)
           / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g, device=device)
          / inter ** 0.5).to(dtype)
    logits = torch.randn(tokens, experts, generator=g, device=device)
    w, ids = select_experts(logits, RoutingConfig(top_k, renormalize=True))
    add = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    out = fused_experts(x, w13, w2, w, ids, add=add, force_triton=True, pair_gemv=pair_gemv)
    ref = experts_reference(x.float(), w13.float(), w2.float(), w, ids) + add.float()
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert err <= tol, f"max error {err:.3g} of max |ref|"
    return err


def _alignment_case(tokens: int, top_k: int, experts: int, block_m: int) -> None:
    """The one-kernel alignment (decode batches) places every pair where the torch ops do."""
    from radixlm.layers.moe import fused_moe_kernel as kern
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k]
                       for _ in range(tokens)]).to(torch.int32)
    small, ref = kern._align_small(ids, experts, block_m), kern._align_torch(ids, experts,
                                                                             block_m)
    n = int(ref.num_padded)
    assert int(small.num_padded) == n
    assert torch.equal(small.sorted_pair_ids[:n], ref.sorted_pair_ids[:n])
    assert torch.equal(small.block_expert[:n // block_m], ref.block_expert[:n // block_m])


def _routing_case(tokens: int, experts: int, top_k: int, sigmoid: bool, bias: bool) -> None:
    """The one-kernel routing picks the torch ops' experts with their weights."""
    from radixlm.layers.moe.topk import select_experts_torch
    g = torch.Generator().manual_seed(experts + top_k)
    logits = torch.randn(tokens, experts, generator=g)
    b = torch.randn(experts, generator=g) * 0.1 if bias else None
    cfg = RoutingConfig(top_k, "sigmoid" if sigmoid else "softmax", renormalize=True,
                        scaling_factor=2.5 if sigmoid else 1.0)
    w, ids = _sorted_pairs(*select_experts(logits, cfg, b, force_triton=True))
    rw, rids = _sorted_pairs(*select_experts_torch(logits, cfg, b))
    assert torch.equal(ids, rids), (ids, rids)
    torch.testing.assert_close(w, rw, atol=1e-6, rtol=1e-5)


def _interpreter_cases():
    for shape in [(3, 8, 2, False, False), (5, 64, 6, False, False), (4, 128, 8, True, True),
                  (2, 60, 4, False, False)]:
        yield f"routing T={shape[0]} E={shape[1]} k={shape[2]} sigmoid={shape[3]}", (
            lambda s=shape: _routing_case(*s))
    for shape in [(1, 2, 4, 16), (7, 3, 8, 16), (64, 8, 128, 16), (500, 8, 128, 32)]:
        yield f"alignment T={shape[0]} k={shape[1]} E={shape[2]} block {shape[3]}", (
            lambda s=shape: _alignment_case(*s))
    # (1, 4, 2, 36, 18): rows that are no multiple of the wide pair GEMV's 8-row strips.
    for tokens, experts, top_k, hidden, inter in [(1, 4, 2, 32, 16), (5, 4, 2, 48, 40),
                                                  (19, 8, 3, 32, 24), (40, 3, 1, 64, 16),
                                                  (1, 4, 2, 36, 18)]:
        # Not bf16: the interpreter's tl.dot multiplies bf16 operands as their raw uint16
        # bits (triton 3.9); the GPU tests run bf16.
        for dtype in (torch.float32, torch.float16):
            # The grouped GEMMs, then the per-pair GEMVs: at the two larger shapes (57 and
            # 40 pairs) in float32 only (fp16 products cost the interpreter ~6x more there:
            # 28 s of this file's ~50; fp16 pair GEMVs are checked at the other shapes).
            for gemv in (False, True) if tokens < 19 or dtype == torch.float32 else (False,):
                desc = (f"T={tokens} E={experts} k={top_k} H={hidden} I={inter} "
                        f"{str(dtype)[6:]} {'pair gemv' if gemv else 'grouped'}")
                yield desc, lambda a=(tokens, experts, top_k, hidden, inter, dtype), g=gemv: (
                    _kernel_case(*a, "cpu", pair_gemv=g))


def test_interpreter_small_cases():
    run_cpu_interpreter_cases(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 2, 4096, 14336), (128, 8, 2048, 768),
                                   (64, 6, 2048, 1408)],
                         ids=["mixtral", "qwen3-30b-a3b", "deepseek-v2-lite"])
@pytest.mark.parametrize("tokens", [1, 7, 64, 512])
def test_gpu_fused_experts_match_the_loop(shape, tokens):
    experts, top_k, hidden, inter = shape
    if experts == 8 and tokens == 512:
        inter = 2048          # keep the fp32 reference's memory small
    _kernel_case(tokens, experts, top_k, hidden, inter, torch.bfloat16, "cuda")
    if tokens <= 7:           # both paths at decode sizes
        for gemv in (False, True):
            _kernel_case(tokens, experts, top_k, hidden, inter, torch.bfloat16, "cuda",
                         pair_gemv=gemv)


@pytest.mark.gpu
def test_gpu_fused_experts_capture_in_a_cuda_graph():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(16, 256, device=dev, dtype=dt)
    w13 = torch.randn(8, 256, 256, device=dev, dtype=dt) / 16
    w2 = torch.randn(8, 256, 128, device=dev, dtype=dt) / 12
    logits = torch.randn(16, 8, device=dev)
    cfg = RoutingConfig(2, renormalize=True)
    run = lambda: fused_experts(x, w13, w2, *select_experts(logits, cfg))  # noqa: E731
    want = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    logits.copy_(torch.randn(16, 8, device=dev))    # new routing, same graph
    x.copy_(torch.randn(16, 256, device=dev, dtype=dt))
    graph.replay()
    torch.testing.assert_close(out, run(), atol=2e-2, rtol=2e-2)
    assert not torch.equal(out, want)


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))


@pytest.mark.parametrize("cfg, experts, message", [
    (RoutingConfig(4), 2, "num_experts_per_tok 4 > 2 experts"),
    (RoutingConfig(2, num_groups=3, topk_groups=1), 8, "n_group 3 does not divide 8"),
    (RoutingConfig(2, num_groups=8, topk_groups=2, group_score="top2_sum"), 8, "two best"),
    (RoutingConfig(6, num_groups=4, topk_groups=1), 8, "fewer than num_experts_per_tok 6"),
    (RoutingConfig(1), 0, "no experts"),
])
def test_unservable_routing_is_refused_at_build(cfg, experts, message):
    with pytest.raises(ValueError, match=message):
        cfg.check(experts)


def test_a_checkpoint_missing_an_expert_is_refused(tmp_path):
    """One loaded expert tensor must not pass for the whole stacked parameter."""
    from safetensors.torch import load_file, save_file

    from helpers import tiny_checkpoint
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    path = tiny_checkpoint(tmp_path / "m", "qwen3-moe")
    tensors = load_file(f"{path}/model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, f"{path}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.3\.up_proj"):
        create_runner_and_kv(RunnerConfig(model_path=path, device="cpu", max_total_tokens=256))


def test_a_4_bit_moe_checkpoint_is_refused(tmp_path):
    """FP8 MoE checkpoints load (tests/test_moe_fp8.py); 4-bit experts are not implemented."""
    import json

    from helpers import tiny_checkpoint
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    path = tiny_checkpoint(tmp_path / "m", "deepseek-v3")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128,
                                  "zero_point": True, "version": "gemm"}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="--quantization: awq is not supported yet for mixture"):
        create_runner_and_kv(RunnerConfig(model_path=path, device="cpu", max_total_tokens=256))


def test_dense_floor_benchmarks_point_moe_models_to_bench_moe():
    from radixlm.bench.floor import check_floor_supports
    from radixlm.core.model_config import ModelConfig
    from radixlm.model_executor.weight_source import load_hf_config
    configs = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
    for name in ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"):
        mc = ModelConfig.from_hf(load_hf_config(str(configs / name)), 4096)
        with pytest.raises(SystemExit, match="radixlm bench moe --parts model"):
            check_floor_supports(mc)
    check_floor_supports(ModelConfig.from_hf(load_hf_config(str(configs / "llama-3.2-1b")),
                                             4096))
