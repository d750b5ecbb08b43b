"""The fused all-reduce + residual add + RMSNorm kernel (distributed/fused_all_reduce_norm.py)
and the decoder layers that leave their all-reduces to it.

  * `test_interpreter_cases`: the kernel's protocol and arithmetic under Triton's CPU
    interpreter, in a child process, with 2 and 4 "ranks" in one process: each rank's buffer is
    a CPU tensor whose address the others read, and each call runs as its two phases (every rank
    sends, then every rank receives: the interpreter runs programs one after another, so a rank
    waiting for a peer in one launch would wait forever). Calls repeat with changing shapes, so
    both alternating buffers and several rows a program are used. float32 (the interpreter
    truncates to bf16 instead of rounding); and one rank running a call ahead of another. By
    hand:
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


def _run_ahead_case() -> float:
    """Rank 0 sends call c + 1 before rank 1 has received call c (it may: its call c ended),
    which writes the other buffer: rank 1 still receives call c's sum."""
    from radixlm.distributed import fused_all_reduce_norm as F
    ranks = _ranks(2, 64 * 1024)
    gen = torch.Generator().manual_seed(7)
    calls = [([torch.randn(3, 128, generator=gen) for _ in range(2)],
              torch.randn(3, 128, generator=gen)) for _ in range(3)]
    weight = torch.rand(128, generator=gen)
    r0, r1 = ranks
    got: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    r0(calls[0][0][0], calls[0][1], weight, 1e-6, phases=F.SEND)
    r1(calls[0][0][1], calls[0][1], weight, 1e-6, phases=F.SEND)
    for c in range(len(calls)):
        got[0, c] = r0(calls[c][0][0], calls[c][1], weight, 1e-6, phases=F.RECEIVE)
        if c + 1 < len(calls):   # rank 0 runs ahead
            r0(calls[c + 1][0][0], calls[c + 1][1], weight, 1e-6, phases=F.SEND)
        got[1, c] = r1(calls[c][0][1], calls[c][1], weight, 1e-6, phases=F.RECEIVE)
        if c + 1 < len(calls):
            r1(calls[c + 1][0][1], calls[c + 1][1], weight, 1e-6, phases=F.SEND)
    for c, (xs, residual) in enumerate(calls):
        want_res = xs[0] + xs[1] + residual
        for r in range(2):
            assert torch.equal(got[r, c][1], want_res), f"call {c} rank {r}"
    return 0.0


def _interpreter_cases():
    # max_bytes 64 KB: up to 64 rows of 256 floats, two rows a program (32 programs).
    shapes = [(1, 256), (3, 200), (64, 256), (2, 256), (33, 100), (1, 256)]
    return [(f"world {w}: {len(shapes)} calls", _calls_case(w, shapes, 64 * 1024))
            for w in (2, 3, 4)] + [("world 2: rank 0 a call ahead", _run_ahead_case)]


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check under Triton's interpreter; on GPUs the TP tests run it")
def test_interpreter_cases():
    pytest.importorskip("triton")
    run_file_under_interpreter(__file__)


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA (handles() reads only metadata)."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_handles_only_decode_sized_cuda_rows():
    """The fused path takes contiguous 2-D CUDA rows of one dtype within its byte limit;
    anything else goes the all-reduce-then-norm way (the same decision on every rank: it reads
    shapes and dtypes only)."""
    pytest.importorskip("triton")
    from radixlm.distributed.fused_all_reduce_norm import MAX_HIDDEN, FusedAllReduceRMSNorm
    f = FusedAllReduceRMSNorm("test", 2, 0, torch.device("cpu"), 4096)

    def fake(*shape, dtype=torch.float32):
        return torch.zeros(*shape, dtype=dtype).as_subclass(_FakeCuda)

    w = torch.ones(256)
    assert f.handles(fake(4, 256), fake(4, 256), w)                 # 4 KB: at the limit
    assert not f.handles(torch.zeros(4, 256), torch.zeros(4, 256), w)   # not CUDA
    assert not f.handles(fake(5, 256), fake(5, 256), w)             # over the byte limit
    assert not f.handles(fake(0, 256), fake(0, 256), w)             # no rows
    assert not f.handles(fake(2, 2, 256), fake(2, 2, 256), w)       # not 2-D
    assert not f.handles(fake(4, 256), fake(4, 256, dtype=torch.bfloat16), w)
    assert not f.handles(fake(256, 4).t(), fake(4, 256), w)         # not contiguous
    assert not f.handles(fake(4, 256), fake(4, 256), torch.ones(128))
    wide = FusedAllReduceRMSNorm("test", 2, 0, torch.device("cpu"), 1 << 20)
    assert wide.handles(fake(1, MAX_HIDDEN), fake(1, MAX_HIDDEN), torch.ones(MAX_HIDDEN))
    assert not wide.handles(fake(1, MAX_HIDDEN * 2), fake(1, MAX_HIDDEN * 2),
                            torch.ones(MAX_HIDDEN * 2))      # a row too wide for registers


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
