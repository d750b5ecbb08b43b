"""The engine's greedy output on the real bundled model equals HF transformers' token for token,
for 8 prompts of different lengths generated together as one continuous batch, under every
memory layout: radix cache on and off, chunked prefill, page sizes 1 and 16."""

from __future__ import annotations

import pytest

from helpers import assert_pool_empty, hf_greedy

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woman who kept bees. Every morning she",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Translate to French: I like apples.",
    "A list of three colours: red,",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def expected(hf_model, tokenizer):
    return [hf_greedy(hf_model, tokenizer(p).input_ids, NEW_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("engine_args", [
    {},
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 16},       # (page size 1, the default)
    {"page_size": 16},
    {"page_size": 16, "chunked_prefill_size": 16, "disable_radix_cache": True},
], ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_greedy_matches_hf(make_engine, expected, engine_args):
    engine = make_engine(max_total_tokens=4096, **engine_args)
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    outs = engine.generate(PROMPTS, params)
    for prompt, out, want in zip(PROMPTS, outs, expected):
        assert out["output_ids"] == want, f"mismatch for {prompt!r}"
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert out["meta_info"]["completion_tokens"] == NEW_TOKENS
    # The same prompts again: with the radix cache they are served from it, same tokens.
    again = engine.generate(PROMPTS, params)
    assert [o["output_ids"] for o in again] == expected
    ps = engine_args.get("page_size", 1)
    for o in again:
        prompt_len = o["meta_info"]["prompt_tokens"]
        # All but the last prompt token (which must be recomputed for logits), page aligned.
        want_cached = 0 if engine_args.get("disable_radix_cache") else (prompt_len - 1) // ps * ps
        assert o["meta_info"]["cached_tokens"] == want_cached
    assert_pool_empty(engine)
