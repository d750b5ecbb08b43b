"""In-batch prefix sharing: requests that arrive together and share an uncached prompt prefix
compute it once. The first is prefilled; the others wait one step and take the prefix from the
radix cache (scheduler/prefill.py, SHARED_PREFIX_TOKENS)."""

from __future__ import annotations

from helpers import assert_pool_empty

SYSTEM = ("You are a careful assistant. Answer in one short sentence, and never use more words "
          "than needed. Be polite, be exact, and do not repeat the question back. ") * 2
QUESTIONS = ["What is the capital of France?", "Name a prime number.", "Why is the sky blue?",
             "What colour is grass?"]


def test_requests_sent_together_share_their_prefix(make_engine, tokenizer):
    prompts = [SYSTEM + q for q in QUESTIONS]
    shared = len(tokenizer(SYSTEM).input_ids)
    assert shared > 40
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    engine = make_engine(max_total_tokens=4096)
    outs = engine.generate(prompts, params)
    cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
    assert cached[0] == 0                              # the one that computed the prefix
    assert all(c >= shared - 2 for c in cached[1:])     # the rest read it from the cache
    assert_pool_empty(engine)
    plain = make_engine(max_total_tokens=4096, disable_radix_cache=True)
    assert [o["output_ids"] for o in plain.generate(prompts, params)] == \
        [o["output_ids"] for o in outs]
