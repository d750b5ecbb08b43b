"""CPU checks of the tensor-parallel pieces that only run on GPUs: which all-reduce path a
message takes (every rank must agree, so only size and world size may decide), the TP
benchmark's roofline bytes and its full-batch decode window, and how a node's TP ranks see
their GPUs."""

from __future__ import annotations

import pytest
import torch

from radixlm.bench.tp import _tokens_at, decode_bytes_per_rank
from radixlm.distributed.custom_all_reduce import (SymmMemAllReduce, agreed_symm_mem_all_reduce,
                                                   one_shot_limit)


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA (path() reads only dtype, size and is_cuda)."""

    @property
    def is_cuda(self) -> bool:
        return True


def _paths(world: int, one: int, two: int) -> SymmMemAllReduce:
    ar = object.__new__(SymmMemAllReduce)   # no symmetric buffer: path() needs none
    ar.world_size, ar.one_shot_bytes, ar.two_shot_bytes = world, one, two
    return ar


def _msg(nbytes: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(nbytes // torch.empty((), dtype=dtype).element_size(),
                       dtype=dtype).as_subclass(_FakeCuda)


def test_all_reduce_path_by_size():
    ar = _paths(4, 256 * 1024, 8 * 1024 * 1024)
    assert ar.path(_msg(8 * 1024)) == "one_shot"            # decode, batch 1
    assert ar.path(_msg(256 * 1024)) == "one_shot"
    assert ar.path(_msg(1024 * 1024)) == "two_shot"          # decode, batch 64 of a 70B
    assert ar.path(_msg(16 * 1024 * 1024)) == "nccl"         # prefill
    assert ar.path(_msg(8 * 1024 + 8)) == "nccl"             # not whole 16-byte vectors
    assert ar.path(_msg(256 * 1024 + 32)) == "nccl"          # slices not whole vectors
    assert ar.path(_msg(8 * 1024, torch.float32)) == "one_shot"
    assert ar.path(_msg(8 * 1024, torch.float16)) == "nccl"     # PyTorch's kernels: bf16, fp32
    assert ar.path(_msg(8 * 1024, torch.int32)) == "nccl"
    assert ar.path(torch.empty(4096, dtype=torch.bfloat16)) == "nccl"   # a CPU tensor
    assert _paths(4, 0, 0).path(_msg(8 * 1024)) == "nccl"    # both turned off


def test_limits_follow_the_environment(monkeypatch):
    assert one_shot_limit(2) > one_shot_limit(8)   # one-shot reads world_size x the message
    monkeypatch.setenv("RADIXLM_ONE_SHOT_MAX_BYTES", "4096")
    assert one_shot_limit(2) == 4096


def test_roofline_bytes_of_llama_8b():
    config = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 128256}
    weights = decode_bytes_per_rank(config, 1, 0, 0)
    assert weights / 2 == pytest.approx(8.03e9 - 4096 * 128256, rel=0.01)   # no embedding
    # Weights shard evenly; 8 KV heads over 16 ranks are replicated (one a rank).
    assert decode_bytes_per_rank(config, 2, 0, 0) == pytest.approx(weights / 2, rel=0.01)
    kv_token = decode_bytes_per_rank(config, 16, 1, 1) - decode_bytes_per_rank(config, 16, 0, 0)
    assert kv_token == 32 * 2 * 1 * 128 * 2


def test_tokens_at_reads_the_last_chunk_before():
    seen = [(1.0, 1), (2.0, 3), (3.0, 4)]
    assert [_tokens_at(seen, t) for t in (0.5, 1.0, 2.5, 9.0)] == [0, 1, 3, 4]


def test_tp_ranks_see_their_nodes_gpus(monkeypatch):
    from radixlm.utils.gpus import node_env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert node_env(1, 2)["CUDA_VISIBLE_DEVICES"] == "5,6"
    with pytest.raises(ValueError, match="--base-gpu-id"):
        node_env(2, 4)


class _Group:
    group_name = "fake"


def test_a_rank_that_cannot_allocate_makes_every_rank_agree_on_nccl(monkeypatch):
    """Each step that can fail on some ranks only is followed by the agreement collective, and
    nothing collective (the rendezvous, the probes) runs after a failed one."""
    asked = []

    def agree(ok: bool) -> bool:
        asked.append(ok)
        return ok

    def no_rendezvous(self):
        raise AssertionError("the rendezvous is collective: not after a failed allocation")

    monkeypatch.setattr(SymmMemAllReduce, "rendezvous", no_rendezvous)
    # On the CPU the allocation fails, as it would on a rank without symmetric memory.
    assert agreed_symm_mem_all_reduce(_Group(), 2, torch.device("cpu"), agree) is None
    assert asked == [True, False]
    asked.clear()
    monkeypatch.setenv("RADIXLM_ONE_SHOT_MAX_BYTES", "0")
    monkeypatch.setenv("RADIXLM_TWO_SHOT_MAX_BYTES", "0")
    assert agreed_symm_mem_all_reduce(_Group(), 2, torch.device("cpu"), agree) is None
    assert asked == [False]                     # both paths off: nothing to allocate


def test_fused_norm_agreement_mirrors_the_all_reduce_paths(monkeypatch):
    """The fused all-reduce + RMSNorm is agreed like the symmetric paths: a failed allocation
    on any rank (here: the CPU) leaves every rank on the two-kernel path, and the off switch
    is asked first."""
    pytest.importorskip("triton")
    from radixlm.distributed.fused_all_reduce_norm import agreed_fused_all_reduce_norm
    monkeypatch.delenv("RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM", raising=False)
    monkeypatch.delenv("RADIXLM_DISABLE_FUSED_OPS", raising=False)
    asked = []

    def agree(ok: bool) -> bool:
        asked.append(ok)
        return ok

    assert agreed_fused_all_reduce_norm(_Group(), 0, 2, torch.device("cpu"), 1 << 16,
                                        agree) is None
    assert asked == [True, False]
    asked.clear()
    for off in ("RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM", "RADIXLM_DISABLE_FUSED_OPS"):
        asked.clear()
        monkeypatch.setenv(off, "1")
        assert agreed_fused_all_reduce_norm(_Group(), 0, 2, torch.device("cpu"), 1 << 16,
                                            agree) is None
        assert asked == [False]                 # nothing allocated, nothing collective
        monkeypatch.delenv(off)
    assert agreed_fused_all_reduce_norm(_Group(), 0, 32, torch.device("cpu"), 1 << 16,
                                        agree) is None
    assert asked[-1] is False                   # more ranks than flag slots

