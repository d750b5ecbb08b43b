"""On a GPU, the engine's fast paths (CUDA graphs for decode, the overlap scheduler, fused small
ops) give the same greedy tokens as the plain paths, on the bundled model and on a random-weight
model. float32 with TF32 off, so the only differences are summation orders (graph batches are
padded to a captured size, which can change cuBLAS's kernel choice)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from helpers import assert_pool_empty

pytestmark = pytest.mark.gpu

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woman who kept bees. Every morning she",
    "A list of three colours: red,",
    "Q: What is the boiling point of water at sea level?\nA:",
]
# Different lengths so requests leave the batch (and the graph batch size changes) mid-run.
LENGTHS = [40, 7, 33, 19, 26]


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory, smollm_dir):
    """A small Llama with std-0.02 random weights (clear argmax margins, unlike the dummy
    loader's near-uniform logits) and the bundled tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("random_llama")
    LlamaForCausalLM(config).save_pretrained(path)
    for name in os.listdir(smollm_dir):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(smollm_dir, name), path)
    return str(path)


@pytest.fixture(params=["bundled", "random"])
def model_path(request, smollm_dir, random_model_dir):
    return smollm_dir if request.param == "bundled" else random_model_dir


def _generate(make_engine, model_path: str, **flags) -> list[list[int]]:
    # 5 requests -> graph sizes 8 then 4, 2, 1 as they finish (padding rows included).
    engine = make_engine(model_path=model_path, device="cuda", dtype="float32",
                         max_total_tokens=8192, cuda_graph_max_bs=16, **flags)
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in LENGTHS]
    outs = [o["output_ids"] for o in engine.generate(PROMPTS, params)]
    assert [len(o) for o in outs] == LENGTHS
    assert_pool_empty(engine)
    engine.shutdown()
    return outs


def test_gpu_graphs_and_overlap_match_plain_paths(make_engine, model_path, monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    plain = _generate(make_engine, model_path, disable_cuda_graph=True,
                      disable_overlap_schedule=True)
    fast = _generate(make_engine, model_path)
    assert fast == plain
    graphs_only = _generate(make_engine, model_path, disable_overlap_schedule=True)
    assert graphs_only == plain
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "1")
    unfused = _generate(make_engine, model_path)
    assert unfused == plain
