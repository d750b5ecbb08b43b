"""MoE and MLA models through the whole engine on the CPU: greedy tokens equal HF transformers'
for a batch of prompts with chunked prefill and page sizes 1 and 16, again from the radix cache
(the MLA latent pool serves cached prefixes), under the overlap scheduler, and with a regex
constraint; no KV slot is left held."""

from __future__ import annotations

import re

import pytest
import torch

from helpers import assert_pool_empty, hf_greedy, tiny_checkpoint

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "The capital of France is a city that", "1, 2, 3, 4,"]
NEW_TOKENS = 10
ARCHS = ["mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v2", "deepseek-v3"]


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory, tokenizer):
    import transformers
    path = tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = [hf_greedy(hf, tokenizer(p).input_ids, NEW_TOKENS) for p in PROMPTS]
    assert len({tuple(w) for w in want}) > 1, "a degenerate model: every prompt says the same"
    return path, want


@pytest.mark.parametrize("flags", [{"chunked_prefill_size": 8},
                                   {"page_size": 16, "chunked_prefill_size": 8}],
                         ids=["page1", "page16"])
def test_greedy_matches_hf_with_chunks_and_cache(make_engine, smollm_dir, model, flags):
    path, want = model
    engine = make_engine(model_path=path, tokenizer_path=smollm_dir, max_total_tokens=2048,
                         **flags)
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    assert [o["output_ids"] for o in engine.generate(PROMPTS, params)] == want
    again = engine.generate(PROMPTS, params)
    assert [o["output_ids"] for o in again] == want
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in again if
               o["meta_info"]["prompt_tokens"] > flags.get("page_size", 1))
    assert_pool_empty(engine)


def test_overlap_and_regex(make_engine, smollm_dir, model, monkeypatch):
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    path, want = model
    engine = make_engine(model_path=path, tokenizer_path=smollm_dir, max_total_tokens=2048)
    greedy = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    assert [o["output_ids"] for o in engine.generate(PROMPTS, greedy)] == want
    out = engine.generate(PROMPTS[0], {"max_new_tokens": 16, "temperature": 0,
                                       "regex": r"(yes|no)[a-z]{2,5}\."})
    assert re.fullmatch(r"(yes|no)[a-z]{2,5}\.", out["text"]), out["text"]
    assert_pool_empty(engine)


def test_hierarchical_cache_with_mla_is_refused(make_engine, smollm_dir, tmp_path):
    path = tiny_checkpoint(tmp_path / "dsv2", "deepseek-v2")
    with pytest.raises(ValueError, match="--enable-hierarchical-cache: not supported yet for MLA"):
        make_engine(model_path=path, tokenizer_path=smollm_dir, max_total_tokens=512,
                    enable_hierarchical_cache=True)
