"""The fused all-reduce + residual add + RMSNorm kernel (distributed/fused_all_reduce_norm.py)
and the decoder layers that leave their all-reduces to it.

  * `test_interpreter_cases`: the kernel's protocol and arithmetic under Triton's CPU
    interpreter, in a child process, with 2 and 4 "ranks" in one process: each rank's buffer is
    a CPU tensor whose address the others read, and each call runs as its two phases (every rank
    sends, then every rank receives: the interpreter runs programs one after another, so a rank
    waiting for a peer in one launch would wait forever). Calls repeat with changing shapes, so
    both alternating buffers and several rows a program are used. float32 (the interpreter
    truncates to bf16 instead of rounding). By hand:
        TRITON_INTERPRET=1 python tests/test_fused_all_reduce_norm.py
  * The layers defer their all-reduces under TP (CPU): the tokens TP2 gives equal TP1's in
    tests/test_tensor_parallel.py, where the norms all-reduce first (gloo, no fused kernel).
  * On GPUs: tests/test_gpu_tensor_parallel.py (TP2 / TP4 equal TP1, the fused kernel on).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import run_file_under_interpreter, run_interpreter_cases
from radixlm.distributed.parallel_state import TPGroup


def _ranks(world: int, max_bytes: int):
    from radixlm.distributed import fused_all_reduce_norm as F
    ranks = []
    for r in range(world):
        f = F.FusedAllReduceRMSNorm("test", world, r, torch.device("cpu"), max_bytes)
        f.storage = torch.zeros(f.flags_offset + F.FLAG_BYTES, dtype=torch.uint8)
        ranks.append(f)
    peers = torch.tensor([f.storage.data_ptr() for f in ranks], dtype=torch.int64)
    for f in ranks:
        f.peers = peers
    return ranks


def _calls_case(world: int, shapes: list[tuple[int, int]], max_bytes: int):
    def case() -> float:
        from radixlm.distributed import fused_all_reduce_norm as F
        from radixlm.layers.norm import RMSNorm
        ranks = _ranks(world, max_bytes)
        gen = torch.Generator().manual_seed(world)
        worst = 0.0
        for call, (rows, cols) in enumerate(shapes):
            xs = [torch.randn(rows, cols, generator=gen) for _ in range(world)]
            residual = torch.randn(rows, cols, generator=gen)
            norm = RMSNorm(cols, 1e-6)
            norm.weight.data = torch.rand(cols, generator=gen)
            for r, f in enumerate(ranks):
                f(xs[r], residual, norm.weight, 1e-6, phases=F.SEND)
            outs = [f(xs[r], residual, norm.weight, 1e-6, phases=F.RECEIVE)
                    for r, f in enumerate(ranks)]
            total = xs[0].clone()
            for x in xs[1:]:   # rank order, as the kernel sums
                total = total + x
            want, want_res = norm._norm(total + residual), total + residual
            for r, (out, res) in enumerate(outs):
                assert torch.equal(res, want_res), f"call {call} rank {r}: residual"
                err = (out - want).abs().max().item()
                assert err <= 2e-6 * want.abs().max().item(), f"call {call} rank {r}: {err}"
                worst = max(worst, err)
                assert torch.equal(out, outs[0][0]), "ranks disagree"
            for f in ranks:   # every program's epoch counts the calls
                assert f.epochs.tolist() == [call + 1] * len(f.epochs)
        return worst
    return case


def _interpreter_cases():
    # max_bytes 64 KB: up to 64 rows of 256 floats, two rows a program (32 programs).
    shapes = [(1, 256), (3, 200), (64, 256), (2, 256), (33, 100), (1, 256)]
    return [(f"world {w}: {len(shapes)} calls", _calls_case(w, shapes, 64 * 1024))
            for w in (2, 4)]


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check under Triton's interpreter; on GPUs the TP tests run it")
def test_interpreter_cases():
    pytest.importorskip("triton")
    run_file_under_interpreter(__file__)


def test_handles_only_decode_sized_cuda_rows():
    """The fused path takes 2-D CUDA rows within its byte limit; anything else goes the
    all-reduce-then-norm way (the same decision on every rank: shapes and dtypes only)."""
    pytest.importorskip("triton")
    from radixlm.distributed.fused_all_reduce_norm import FusedAllReduceRMSNorm
    f = FusedAllReduceRMSNorm("test", 2, 0, torch.device("cpu"), 1024)
    x = torch.zeros(2, 256)
    assert not f.handles(x, x, torch.ones(256))   # not CUDA
    assert f.rows_per_program(256, 4) == 1
    assert f.rows_per_program(8, 4) == 1 and f.rows_per_program(4, 2) == 4


def test_llama_layers_leave_their_all_reduces_to_the_norms():
    """Under TP the attention's o_proj and the MLP's down_proj return partial sums, and the
    next RMSNorm of each is given the group to sum them over: the post-attention norm, the next
    layer's input norm, and the final norm after the last layer."""
    from radixlm.core.model_config import ModelConfig
    from radixlm.models.llama import LlamaForCausalLM
    hf = SimpleNamespace(
        architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, vocab_size=256,
        max_position_embeddings=128, rms_norm_eps=1e-6)
    config = ModelConfig.from_hf(hf, None)
    tp = TPGroup(rank=0, size=2)
    model = LlamaForCausalLM(config, tp)
    assert [layer.input_reduce for layer in model.layers] == [None, tp, tp]
    assert model.final_reduce == tp
    for layer in model.layers:
        assert not layer.self_attn.o_proj.reduce_results
        assert not layer.mlp.down_proj.reduce_results
        assert layer.self_attn.partial_output_group == tp
    single = LlamaForCausalLM(config)
    assert single.final_reduce is None and single.layers[0].self_attn.o_proj.reduce_results


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
