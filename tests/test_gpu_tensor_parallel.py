"""Tensor parallelism on GPUs (NCCL, and the symmetric-memory all-reduce for small messages):
greedy tokens at TP2 / TP4 / TP8 equal TP1's on a random std-0.02 Llama in float32 with TF32
off, through CUDA graphs and the overlap scheduler (the defaults: symmetric-memory all-reduces
and the fused all-reduce + RMSNorm, asserted on) and with the custom all-reduce off, and prompt
logprobs stay close. Each size runs where the machine has that many GPUs.

The tokenizer comes from RADIXLM_TEST_TOKENIZER (a directory of tokenizer files) where set, so
this file runs on a GPU machine without the bundled GGUF; else from the bundled model."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import assert_pool_empty

pytestmark = pytest.mark.gpu

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Once upon a time, in a small village at the edge of a great forest, there lived",
           "The capital of France is a city that"]
LENGTHS = [24, 7, 31, 16]


@pytest.fixture(scope="module")
def tokenizer_dir(request) -> str:
    return os.environ.get("RADIXLM_TEST_TOKENIZER") or request.getfixturevalue("smollm_dir")


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory, tokenizer_dir) -> str:
    """8 query heads and 2 KV heads: TP4 and TP8 replicate the KV heads."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         initializer_range=0.02)
    path = tmp_path_factory.mktemp("random_llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def _run(make_engine, model: str, tokenizer: str, tp: int, **flags):
    engine = make_engine(model_path=model, tokenizer_path=tokenizer, device="cuda",
                         dtype="float32", tp_size=tp, max_total_tokens=8192,
                         cuda_graph_max_bs=8, **flags)
    # The paths under test are on (a failed start-up check would fall back silently).
    if tp > 1:
        want = (["nccl"] if flags.get("disable_custom_all_reduce")
                else ["nccl", "one_shot", "two_shot", "fused_rms_norm"])
        assert engine.ready.all_reduce_paths == want
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in LENGTHS]
    outs = engine.generate(PROMPTS, params, return_logprob=True, logprob_start_len=0)
    assert_pool_empty(engine)
    engine.shutdown()
    ids = [o["output_ids"] for o in outs]
    assert [len(i) for i in ids] == LENGTHS
    lps = [torch.tensor([lp for lp, *_ in o["meta_info"]["input_token_logprobs"][1:]])
           for o in outs]
    return ids, lps


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_gpu_tp_greedy_equals_tp1(make_engine, random_llama, tokenizer_dir, tp, monkeypatch):
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    ids1, lps1 = _run(make_engine, random_llama, tokenizer_dir, 1)
    for flags in ({}, {"disable_custom_all_reduce": True}):
        ids, lps = _run(make_engine, random_llama, tokenizer_dir, tp, **flags)
        assert ids == ids1, flags
        for a, b in zip(lps, lps1):
            assert torch.allclose(a, b, atol=1e-3, rtol=1e-3), flags
