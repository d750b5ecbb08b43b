"""The decode roofline's weight bytes: every parameter once, the input embedding table not at
all (a step reads only its looked-up rows), a table tied to the LM head once, as the head."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixlm.bench.one_batch import decode_weight_bytes
from radixlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding


class _Tiny(nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(100, 8)
        self.proj = nn.Linear(8, 8, bias=False)
        self.lm_head = ParallelLMHead(100, 8, tie_to=self.embed_tokens if tied else None)


def test_embedding_table_is_not_read_by_a_decode_step():
    size = torch.empty((), dtype=torch.float32).element_size()
    assert decode_weight_bytes(_Tiny(tied=False)) == (8 * 8 + 100 * 8) * size


def test_a_tied_table_is_read_once_as_the_lm_head():
    size = torch.empty((), dtype=torch.float32).element_size()
    assert decode_weight_bytes(_Tiny(tied=True)) == (8 * 8 + 100 * 8) * size


def _expert_and_other_bytes(runner) -> tuple[int, int, int]:
    """(bytes of one routed expert of one layer, MoE layers, every other weight a step reads)."""
    from radixlm.bench.one_batch import decode_weight_bytes
    from radixlm.layers.moe.layer import FusedMoE
    layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    expert = sum(p[0].numel() * p.element_size()
                 for p in (layers[0].w13_weight, layers[0].w2_weight))
    e = runner.model_config.num_experts
    return expert, len(layers), decode_weight_bytes(runner.model) - len(layers) * e * expert


@pytest.mark.parametrize("arch", ["qwen3-moe", "deepseek-v2"])
def test_a_moe_step_reads_only_the_experts_its_batch_routes_to(tmp_path, arch):
    """Batch 1 reads k experts a layer (not all E), and the KV cache as the pool stores it (the
    MLA latent, not K and V); a large batch reads nearly every expert."""
    from helpers import tiny_checkpoint
    from radixlm.bench.one_batch import decode_step_bytes
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    path = tiny_checkpoint(tmp_path / "m", arch)
    runner, _ = create_runner_and_kv(RunnerConfig(model_path=path, device="cpu",
                                                  max_total_tokens=256))
    mc = runner.model_config
    expert, layers, other = _expert_and_other_bytes(runner)
    weights, kv = decode_step_bytes(runner, 1, 10)
    assert abs(weights - (other + layers * mc.num_experts_per_tok * expert)) <= layers
    assert kv == 10 * runner.kv_spec.bytes_per_token(runner.kv_dtype)
    if arch == "deepseek-v2":     # one latent row a token a layer, not K and V per head
        assert runner.kv_spec.tensors_per_layer == 1
    weights_big, _ = decode_step_bytes(runner, 4096, 10)
    assert abs(weights_big - (other + layers * mc.num_experts * expert)) <= layers


def test_a_dense_step_reads_every_weight_and_k_and_v(tmp_path):
    from helpers import tiny_checkpoint
    from radixlm.bench.one_batch import decode_step_bytes, decode_weight_bytes
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    path = tiny_checkpoint(tmp_path / "m", "llama")
    runner, _ = create_runner_and_kv(RunnerConfig(model_path=path, device="cpu",
                                                  max_total_tokens=256))
    mc = runner.model_config
    weights, kv = decode_step_bytes(runner, 3, 10)
    assert weights == decode_weight_bytes(runner.model)
    assert kv == 3 * 10 * mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * 4
