"""FP8 experts (issues 16, 17): MoE models served with FP8 routed experts.

* the loader: per-tensor, per-channel and block-scaled expert tensors (written by the test-side
  packers of tests/quant_formats.py) land in the stacked FP8 parameters, whole and as
  tensor-parallel shards, standing for exactly the weights they were written from;
* whole models: tiny Qwen3-MoE / DeepSeek-V2 / DeepSeek-V3 FP8 checkpoints (experts, attention,
  MLA projections, shared experts quantized; DeepSeek's kv_b_proj widened at load) give HF
  transformers' logits on the weights the checkpoint stands for, at prefill and decode;
  `--quantization fp8` on a full-precision MoE checkpoint keeps the experts in FP8;
* the grouped-GEMM kernel with FP8 weights (channel and block scales) against the per-expert
  loop on the dequantized weights: under the Triton interpreter here, real shapes on the GPU.

By hand, the interpreter cases: TRITON_INTERPRET=1 python tests/test_moe_fp8.py
"""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import run_cpu_interpreter_cases, run_interpreter_cases
from quant_formats import QUANT_CONFIGS, checkpoint_tensors, write_quantized_checkpoint
from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.moe.build import build_experts
from radixlm.layers.moe.experts import (Fp8ExpertScales, experts_reference, fused_experts,
                                        takes_fp8_inputs)
from radixlm.layers.moe.pair_gemv import use_pair_gemv
from radixlm.layers.moe.fp8_experts import quantize_experts
from radixlm.layers.moe.topk import RoutingConfig, select_experts
from radixlm.layers.quantization import resolve_quant_spec

FORMATS = ["fp8-tensor", "fp8-channel", "fp8-block"]
# Block formats with rows != columns, so that a loader swapping the two cannot pass.
BLOCKS = {"fp8-block": (16, 16), "fp8-block-16x32": (16, 32), "fp8-block-32x16": (32, 16)}


def _spec(fmt: str):
    if fmt in BLOCKS:
        bn, bk = BLOCKS[fmt]
        return resolve_quant_spec(None, {**QUANT_CONFIGS["fp8-block"],
                                         "weight_block_size": [bn, bk]})
    return resolve_quant_spec(None, QUANT_CONFIGS[fmt])


def _tensors(fmt: str, w: torch.Tensor):
    """(checkpoint tensors of fmt for w, the weight they stand for)."""
    from quant_formats import fp8_tensors
    if fmt in BLOCKS:
        return fp8_tensors(w, "block", BLOCKS[fmt])
    return checkpoint_tensors(fmt, w, 32)


# ---------------------------------------------------------------------- the loader

@pytest.mark.parametrize("fmt", FORMATS[:2] + list(BLOCKS))
@pytest.mark.parametrize("rank, size", [(0, 1), (0, 2), (1, 2)])
def test_expert_tensors_load_whole_and_sharded(fmt, rank, size):
    experts, hidden, inter = 3, 80, 64      # 64 / 2 ranks = one or two blocks each; 80: a
    #                                         partial last block of hidden
    torch.manual_seed(rank + 10 * size)
    moe = build_experts(experts, hidden, inter, TPGroup(rank=rank, size=size), _spec(fmt))
    params = dict(moe.named_parameters())
    want13, want2 = [], []
    mine = slice(rank * inter // size, (rank + 1) * inter // size)
    for e in range(experts):
        parts = []
        for part, shape in ((0, (inter, hidden)), (1, (inter, hidden)), (None, (hidden, inter))):
            tensors, ref = _tensors(fmt, torch.randn(shape))
            for kind, t in tensors.items():
                name = {"weight": "w13_weight", "weight_scale": "w13_weight_scale",
                        "weight_scale_inv": "w13_weight_scale"}[kind]
                if part is None:
                    name = name.replace("w13", "w2")
                moe.weight_loader(params[name], t, (e, part))
            parts.append(ref)
        want13.append(torch.cat([parts[0][mine], parts[1][mine]]))
        want2.append(parts[2][:, mine])
    assert moe.missing_weights() == []
    moe.process_weights_after_loading()
    assert moe.w13_weight.dtype == moe.w2_weight.dtype == torch.float8_e4m3fn
    s = moe.fp8_scales()
    for e in range(experts):
        torch.testing.assert_close(s.dequantize(moe.w13_weight[e], s.w13[e], torch.float32),
                                   want13[e], atol=0, rtol=0)
        torch.testing.assert_close(s.dequantize(moe.w2_weight[e], s.w2[e], torch.float32),
                                   want2[e], atol=0, rtol=0)


def test_missing_expert_scales_are_named():
    moe = build_experts(2, 32, 16, TPGroup(rank=0, size=1), _spec("fp8-block"))
    tensors, _ = checkpoint_tensors("fp8-block", torch.randn(16, 32), 32)
    moe.weight_loader(moe.w13_weight, tensors["weight"], (1, 0))
    missing = moe.missing_weights()
    assert "1.gate_proj scale" in missing and "1.gate_proj" not in missing
    assert "0.down_proj" in missing


def test_scale_blocks_split_by_a_shard_are_refused():
    # 48 intermediate rows over 2 ranks: 24 rows each, not whole 16-row blocks.
    with pytest.raises(ValueError, match="--tp-size 2: moe_intermediate_size 48"):
        build_experts(2, 32, 48, TPGroup(rank=0, size=2), _spec("fp8-block"))
    # One rank: the gate and up halves must each be whole blocks of rows.
    with pytest.raises(ValueError, match="--model-path: moe_intermediate_size 48"):
        build_experts(2, 32, 48, TPGroup(rank=0, size=1), _spec("fp8-block-32x16"))
    # A K tail in a partial block is fine with one rank.
    build_experts(2, 32, 48, TPGroup(rank=0, size=1), _spec("fp8-block-16x32"))


def test_scale_blocks_that_are_not_powers_of_two_are_refused():
    """Every kernel steps through K in tiles that divide a scale block: a 24-wide block would
    be read with the wrong scales, so it is refused for both checkpoint formats."""
    ct = QUANT_CONFIGS["fp8-channel"]
    group = dict(ct["config_groups"]["group_0"])
    group["weights"] = {**group["weights"], "strategy": "block", "block_structure": [16, 24]}
    with pytest.raises(ValueError, match="--quantization: compressed-tensors block_structure"):
        resolve_quant_spec(None, {**ct, "config_groups": {"group_0": group}})
    with pytest.raises(ValueError, match="--quantization: FP8 weight_block_size"):
        resolve_quant_spec(None, {**QUANT_CONFIGS["fp8-block"], "weight_block_size": [16, 24]})


# ---------------------------------------------------------------------- whole models vs HF

def _moe_configs():
    import transformers

    from test_models_vs_hf import TINY
    mla = dict(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
               kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
               n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
               max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
    return {
        "qwen3-moe": lambda: transformers.Qwen3MoeConfig(
            **TINY, head_dim=32, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=3, norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"]),
        "deepseek-v2": lambda: transformers.DeepseekV2Config(
            **mla, q_lora_rank=None, n_routed_experts=8, topk_method="group_limited_greedy",
            n_group=4, topk_group=2, routed_scaling_factor=1.5,
            architectures=["DeepseekV2ForCausalLM"]),
        "deepseek-v3": lambda: transformers.DeepseekV3Config(
            **mla, q_lora_rank=32, n_routed_experts=8, n_group=4, topk_group=2,
            norm_topk_prob=True, routed_scaling_factor=2.5,
            architectures=["DeepseekV3ForCausalLM"]),
    }


def _hf_model(arch: str):
    import transformers
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(_moe_configs()[arch](),
                                                       dtype=torch.float32).eval()
    with torch.no_grad():     # larger than the default init, so that routing choices matter
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
    return hf


def _hf_checkpoint_quantized(arch: str, fmt: str, tmp_path):
    """Write a tiny `arch` as a `fmt` checkpoint in tmp_path/fp8 and return HF's model on the
    weights it stands for. HF keeps experts fused in memory and per expert on disk, so the
    per-expert tensors are taken from a saved copy and the reference loaded back from disk."""
    import json

    import transformers
    from safetensors.torch import load_file, save_file

    _hf_model(arch).save_pretrained(tmp_path / "full")
    state = load_file(tmp_path / "full" / "model.safetensors")
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    reference = write_quantized_checkpoint(state, config, tmp_path / "fp8", fmt)
    save_file(reference, tmp_path / "full" / "model.safetensors", metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "full",
                                                             dtype=torch.float32).eval()


def _check_against_hf(tmp_path, arch: str, fmt: str, device: str, tol: float) -> None:
    """Prefill of three prompts, then three decode steps: our logits against HF's on the
    weights the FP8 checkpoint stands for."""
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from radixlm.sampling.params import SamplingParams
    from radixlm.scheduler.request import Req
    from test_models_vs_hf import _decode, _extend, _hf_logits

    hf = _hf_checkpoint_quantized(arch, fmt, tmp_path)
    runner, kv = create_runner_and_kv(RunnerConfig(
        model_path=str(tmp_path / "fp8"), device=device, dtype="float32",
        max_total_tokens=512, disable_cuda_graph=True))
    experts = runner.model.layers[1].mlp.experts
    assert experts.w13_weight.dtype == torch.float8_e4m3fn, "the experts must stay FP8"
    if arch.startswith("deepseek"):
        attn = runner.model.layers[1].self_attn
        assert attn.kv_a_proj_with_mqa.weight.dtype == torch.float8_e4m3fn
        assert attn.kv_b_proj.weight.dtype == torch.float32     # widened once, for the bmm's
    g = torch.Generator().manual_seed(1)
    reqs = [Req(f"r{i}", torch.randint(0, 97, (n,), generator=g).tolist(), SamplingParams(),
                seed=0) for i, n in enumerate((5, 17, 1))]
    logits = _extend(runner, kv, reqs)
    for _ in range(3):
        for r, row in zip(reqs, logits.float().cpu()):
            torch.testing.assert_close(row, _hf_logits(hf, r.fill_ids)[-1], atol=tol, rtol=tol)
            r.output_ids.append(int(row.argmax()))
        logits = _decode(runner, kv, reqs)


@pytest.mark.parametrize("arch, fmt", [("qwen3-moe", "fp8-block"), ("qwen3-moe", "fp8-tensor"),
                                       ("deepseek-v2", "fp8-channel"),
                                       ("deepseek-v3", "fp8-block")])
def test_fp8_moe_checkpoints_match_hf_on_their_weights(tmp_path, arch, fmt):
    _check_against_hf(tmp_path, arch, fmt, "cpu", 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3-moe", "deepseek-v3"])
def test_gpu_fp8_moe_checkpoints_match_hf(tmp_path, monkeypatch, arch):
    """The Triton paths on the GPU in fp32: the grouped GEMM, the per-pair GEMVs, the FP8
    linear kernels (block scales: weight-only), MLA, against HF to 1e-3. FP8 inputs (W8A8, the
    default from 4 rows per expert) are off here: they are checked per layer against a loop
    that quantizes its inputs alike (test_gpu_fp8_experts_match_the_loop)."""
    monkeypatch.setenv("RADIXLM_DISABLE_MOE_FP8_ACTIVATIONS", "1")
    _check_against_hf(tmp_path, arch, "fp8-block", "cuda", 1e-3)


@pytest.mark.parametrize("arch", ["qwen3-moe", "deepseek-v3"])
def test_online_fp8_quantizes_moe_experts_per_row(tmp_path, arch):
    """--quantization fp8 on a full-precision MoE checkpoint: experts (and the other linear
    layers) become FP8 with one scale per output row, computed exactly as the test-side
    packer does; kv_b_proj and the router stay full precision. HF on those weights agrees."""
    import json

    import transformers
    from safetensors.torch import load_file, save_file

    from quant_formats import fp8_tensors
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from radixlm.sampling.params import SamplingParams
    from radixlm.scheduler.request import Req
    from test_models_vs_hf import _extend, _hf_logits

    _hf_model(arch).save_pretrained(tmp_path / "full")
    state = load_file(tmp_path / "full" / "model.safetensors")
    reference = {name: (fp8_tensors(w, "channel")[1]
                        if name.endswith(("proj.weight", "proj_with_mqa.weight"))
                        and "kv_b_proj" not in name else w)
                 for name, w in state.items()}
    (tmp_path / "ref").mkdir()
    save_file(reference, tmp_path / "ref" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "ref" / "config.json").write_text(
        json.dumps(json.loads((tmp_path / "full" / "config.json").read_text())))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ref",
                                                           dtype=torch.float32).eval()
    runner, kv = create_runner_and_kv(RunnerConfig(model_path=str(tmp_path / "full"),
                                                   device="cpu", max_total_tokens=512,
                                                   quantization="fp8"))
    experts = runner.model.layers[1].mlp.experts
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == torch.float8_e4m3fn
    assert runner.model.layers[1].mlp.gate.weight.dtype == torch.float32    # the router
    ids = torch.randint(0, 97, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    got = _extend(runner, kv, [Req("a", ids, SamplingParams(), seed=0)])[0]
    torch.testing.assert_close(got, _hf_logits(hf, ids)[-1], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------- the kernel

@pytest.mark.parametrize("block", [None, (16, 32)])
def test_quantize_experts_matches_the_checkpoint_writer(block):
    """The stacks the benchmarks and online quantization make are what the test-side writer
    makes of each expert (values and scales exactly; 40 rows: a partial last block)."""
    from quant_formats import fp8_tensors
    w = torch.randn(3, 40, 64)
    q, scale = quantize_experts(w, block)
    for e in range(3):
        want, _ = fp8_tensors(w[e], "channel" if block is None else "block", block or (1, 1))
        assert torch.equal(q[e].float(), want["weight"].float())
        got_scale = scale[e] if block else scale[e][:, None]
        torch.testing.assert_close(got_scale, want.get("weight_scale_inv",
                                                       want.get("weight_scale")),
                                   atol=0, rtol=0)


def _kernel_case(tokens: int, experts: int, top_k: int, hidden: int, inter: int,
                 block: tuple[int, int] | None, dtype: torch.dtype, device: str,
                 pair_gemv: bool | None = None, fp8_activations: bool | None = None) -> float:
    """`fp8_activations`: the W8A8 grouped GEMMs (inputs quantized per 128-input group), which
    are checked against the full-precision-activation reference within FP8 input rounding."""
    g = torch.Generator(device=device).manual_seed(tokens + experts)
    x = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    w13, s13 = quantize_experts(torch.randn(experts, 2 * inter, hidden, generator=g,
                                            device=device) / hidden ** 0.5, block)
    w2, s2 = quantize_experts(torch.randn(experts, hidden, inter, generator=g, device=device)
                              / inter ** 0.5, block)
    scales = Fp8ExpertScales(s13, s2, block)
    w, ids = select_experts(torch.randn(tokens, experts, generator=g, device=device),
                            RoutingConfig(top_k, renormalize=True))
    add = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    out = fused_experts(x, w13, w2, w, ids, add=add, force_triton=True, scales=scales,
                        pair_gemv=pair_gemv, fp8_activations=fp8_activations)
    if fp8_activations is None:     # what the layer picks by itself at this size
        fp8_activations = not pair_gemv and takes_fp8_inputs(tokens * top_k, experts) and (
            pair_gemv is False or not use_pair_gemv(tokens, tokens * top_k, experts, inter,
                                                    True))
    if fp8_activations:
        ref = _w8a8_reference(x, w13, w2, w, ids, scales) + add.float()
    else:
        ref = experts_reference(x.float(), w13, w2, w, ids, scales) + add.float()
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    if fp8_activations:       # the kernel rounds gate_up and its output to `dtype` as well
        tol = 1e-4 if dtype == torch.float32 else 4e-2
    assert err <= tol, f"max error {err:.3g} of max |ref|"
    return err


def _interpreter_cases():
    # fp32 and fp16 activations: the interpreter's tl.dot mishandles bf16 (see test_moe.py).
    for tokens, experts, top_k, hidden, inter, block in [
            (1, 4, 2, 32, 16, None), (5, 4, 2, 48, 32, (16, 16)), (19, 8, 3, 64, 32, (16, 32)),
            (40, 3, 1, 40, 16, None)]:
        for dtype in (torch.float32, torch.float16):
            # The grouped GEMMs, then the per-pair GEMVs: at the two larger shapes (57 and
            # 40 pairs, most of this file's interpreter time) in fp16 only.
            for gemv in (False, True) if tokens < 19 or dtype == torch.float16 else (False,):
                desc = (f"T={tokens} E={experts} k={top_k} H={hidden} I={inter} "
                        f"block={block} {str(dtype)[6:]} {'pair gemv' if gemv else 'grouped'}")
                yield desc, lambda a=(tokens, experts, top_k, hidden, inter, block, dtype), \
                    g=gemv: _kernel_case(*a, "cpu", pair_gemv=g, fp8_activations=False)
    # FP8 inputs (W8A8), channel and block scales; 128 pairs on 2 experts take the large
    # prefill tile (64+ rows per expert).
    for tokens, experts, top_k in ((24, 3, 2), (128, 2, 1)):
        for block in (None, (16, 32)):
            for dtype in (torch.float32, torch.float16):
                yield (f"W8A8 T={tokens} E={experts} k={top_k} H=256 I=160 block={block} "
                       f"{str(dtype)[6:]}"), (
                    lambda a=(tokens, experts, top_k, 256, 160, block, dtype): _kernel_case(
                        *a, "cpu", pair_gemv=False, fp8_activations=True))
    # The per-pair GEMV with K tiles wider than a scale block (one sum per block inside a
    # tile), and a K that is not a multiple of the tile.
    from radixlm.layers.moe import pair_gemv as pg
    # The wide kernel: scales folded into x, per K block (K tiles wider than a block with K
    # = 80 and 48 not multiples of them; narrower ones), per row; strips of 32 rows over
    # N = 80 (a tail, and a last block of scale rows cut short); and strips wider than a
    # block of scale rows, which go to the earlier kernel.
    for block, tiles in (((16, 16), pg.PairGemvTiles(16, 64)),
                         ((16, 32), pg.PairGemvTiles(8, 128)),
                         ((16, 16), pg.PairGemvTiles(4, 64, wide=True)),
                         ((16, 32), pg.PairGemvTiles(8, 16, wide=True)),
                         (None, pg.PairGemvTiles(2, 32, wide=True)),
                         ((32, 16), pg.PairGemvTiles(32, 64, wide=True)),
                         ((16, 16), pg.PairGemvTiles(32, 64, wide=True))):
        yield f"pair gemv tiles {tiles} block={block}", lambda b=block, t=tiles: (
            _kernel_case_tiles(3, 4, 2, 80, 48, b, t))


def _fp8_rows(a: torch.Tensor, group: int = 128) -> torch.Tensor:
    """What a row quantized to FP8 per `group` inputs stands for. The package's quantizer:
    the Triton interpreter's fp32 -> fp8 conversion drops the carry when a value rounds up
    into the next binade (124.3 -> 64), so the kernel and this reference must share it; the
    quantizer itself is checked against torch on the GPU
    (test_gpu_per_token_group_quantization_round_trips)."""
    from radixlm.layers.quantization.fp8_kernels import (dequantize_per_token_group,
                                                         quantize_per_token_group)
    q, s = quantize_per_token_group(a.contiguous(), group)
    return dequantize_per_token_group(q, s, group, torch.float32)


def _w8a8_reference(x, w13, w2, topk_weights, topk_ids, scales) -> torch.Tensor:
    """The per-expert loop with each GEMM's input quantized as the W8A8 kernels do: x per
    token, SiLU-and-mul's output (rounded to x's dtype) per pair."""
    import torch.nn.functional as F
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    xq = _fp8_rows(x)
    inter = w2.shape[2]
    for e in range(w13.shape[0]):
        tokens, slots = (topk_ids == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        up = scales.dequantize(w13[e], scales.w13[e], torch.float32)
        down = scales.dequantize(w2[e], scales.w2[e], torch.float32)
        gu = (xq[tokens] @ up.t()).to(x.dtype).float()
        act = (F.silu(gu[:, :inter]) * gu[:, inter:]).to(x.dtype)
        y = _fp8_rows(act) @ down.t() * topk_weights[tokens, slots].float()[:, None]
        out.index_add_(0, tokens, y)
    return out


def _kernel_case_tiles(tokens, experts, top_k, hidden, inter, block, tiles) -> float:
    """The per-pair GEMVs alone with given tiles against the dequantized weights: gate_up,
    then the down projection (SiLU-and-mul of its [gate | up] input, pair weights)."""
    import torch.nn.functional as F

    from radixlm.layers.moe.pair_gemv import pair_gemv
    g = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, hidden, generator=g)
    w13, s13 = quantize_experts(torch.randn(experts, 2 * inter, hidden, generator=g), block)
    w2, s2 = quantize_experts(torch.randn(experts, hidden, inter, generator=g), block)
    ids = torch.randint(0, experts, (tokens * top_k,), generator=g, dtype=torch.int32)
    pair_w = torch.rand(tokens * top_k, generator=g)
    scales = Fp8ExpertScales(s13, s2, block)
    gate_up = torch.empty(tokens * top_k, 2 * inter)
    pair_gemv(x, w13, gate_up, ids, top_k, b_scale=s13, scale_block=block, tiles=tiles)
    down = torch.empty(tokens * top_k, hidden)
    pair_gemv(gate_up, w2, down, ids, 1, gated=True, pair_weights=pair_w, b_scale=s2,
              scale_block=block, tiles=tiles)
    want_up = torch.stack([F.linear(x[p // top_k], scales.dequantize(w13[e], s13[e],
                                                                      torch.float32))
                           for p, e in enumerate(ids.tolist())])
    act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    want_down = torch.stack([F.linear(act[p], scales.dequantize(w2[e], s2[e], torch.float32))
                             for p, e in enumerate(ids.tolist())]) * pair_w[:, None]
    err = 0.0
    for got, want in ((gate_up, want_up), (down, want_down)):
        err = max(err, ((got - want).abs().max() / want.abs().max()).item())
    assert err <= 1e-5, err
    return err


def test_interpreter_small_cases():
    run_cpu_interpreter_cases(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 8, 2048, 768), (64, 6, 2048, 1408)],
                         ids=["qwen3-30b-a3b", "deepseek-v2-lite"])
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["channel", "block"])
@pytest.mark.parametrize("tokens", [1, 7, 64, 512, 1024])
def test_gpu_fp8_experts_match_the_loop(shape, block, tokens):
    """1024 tokens: 64+ rows per expert on both shapes, the large W8A8 tile."""
    experts, top_k, hidden, inter = shape
    _kernel_case(tokens, experts, top_k, hidden, inter, block, torch.bfloat16, "cuda")
    if tokens >= 64:      # FP8 activations (prefill-sized batches), forced
        _kernel_case(tokens, experts, top_k, hidden, inter, block, torch.bfloat16, "cuda",
                     pair_gemv=False, fp8_activations=True)


@pytest.mark.gpu
def test_gpu_per_token_group_quantization_round_trips():
    from radixlm.layers.quantization.fp8_kernels import (dequantize_per_token_group,
                                                         quantize_per_token_group)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, 300, device="cuda", generator=g).to(torch.bfloat16) * 3
    q, s = quantize_per_token_group(x, 128)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (37, 3)
    back = dequantize_per_token_group(q, s, 128, torch.float32)
    groups = torch.nn.functional.pad(x.float(), (0, 84)).view(37, 3, 128)
    torch.testing.assert_close(s, groups.abs().amax(2) / 448.0, atol=0, rtol=1e-6)
    # Half a step of e4m3: 1/16 of the value for normal numbers, half the subnormal spacing
    # (2^-9 of the scale) below 2^-6.
    step = s.repeat_interleave(128, dim=1)[:, :300]
    assert ((back - x.float()).abs() <= x.float().abs() / 16 + step * 2 ** -10 + 1e-9).all()


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
