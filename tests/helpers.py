"""Helpers shared by the engine tests."""

from __future__ import annotations

import torch


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy tokens from HF transformers with its own KV cache, never stopping at EOS."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        toks = []
        for _ in range(n):
            t = int(out.logits[0, -1].argmax())
            toks.append(t)
            out = model(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
    return toks


def assert_pool_empty(engine) -> None:
    """After every request ended: nothing is held by requests or locked in the tree."""
    stats = engine.get_stats()
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
    assert stats.protected_kv_tokens == 0
    assert stats.available_kv_tokens + stats.evictable_kv_tokens == stats.max_total_num_tokens
