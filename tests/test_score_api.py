"""Decoder-only scoring (SGLang's /v1/score and Engine.score) on the bundled model: the scores
equal HF transformers' next-token probabilities of the label tokens after query + item (or
item + query), raw or renormalised over the labels; token input scores as its text; bad input
is a 400 naming the field, after which the server keeps serving and holds no KV."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from helpers import assert_pool_empty, serve_app_in_thread


@pytest.fixture(scope="module")
def engine():
    from radixlm.entrypoints.engine import Engine
    # (--allow-auto-truncate on: scoring must refuse an over-long prompt all the same)
    e = Engine(device="cpu", log_level="warning", max_total_tokens=4096,
               allow_auto_truncate=True)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def url(engine):
    yield from serve_app_in_thread(engine, engine.server_args)


def _label_ids(tokenizer, words: list[str]) -> list[int]:
    return [tokenizer(w, add_special_tokens=False).input_ids[0] for w in words]


def _hf_probs(hf_model, tokenizer, text: str, labels: list[int]) -> list[float]:
    with torch.no_grad():
        logits = hf_model(torch.tensor([tokenizer(text).input_ids])).logits[0, -1]
    return torch.softmax(logits.float(), -1)[labels].tolist()


@pytest.mark.parametrize("query,items,item_first", [
    ("I pledge allegiance", ["", " to", " to the flag of"], False),
    (" is a city", ["Tokyo", "Japan"], True),
])
def test_scores_match_hf(engine, hf_model, tokenizer, query, items, item_first):
    labels = _label_ids(tokenizer, [" to", " the", " of"])
    raw = engine.score(query, items, labels, item_first=item_first)
    soft = engine.score(query, items, labels, apply_softmax=True, item_first=item_first)
    assert len(raw) == len(soft) == len(items)
    for item, got_raw, got_soft in zip(items, raw, soft):
        want = _hf_probs(hf_model, tokenizer, item + query if item_first else query + item,
                         labels)
        assert got_raw == pytest.approx(want, rel=2e-3, abs=1e-6)
        total = sum(want)
        assert got_soft == pytest.approx([p / total for p in want], rel=2e-3, abs=1e-6)
        assert math.isclose(sum(got_soft), 1.0, rel_tol=1e-9)
    assert_pool_empty(engine)


def test_token_input_scores_as_its_text(engine, tokenizer):
    labels = _label_ids(tokenizer, [" Paris", " London"])
    query = tokenizer("The capital of France is").input_ids
    by_ids = engine.score(query, [[]], labels)
    by_text = engine.score("The capital of France is", "", labels)
    assert by_ids[0] == pytest.approx(by_text[0], rel=1e-4)
    assert by_ids[0][0] > by_ids[0][1]          # (the model knows its capitals)


def test_python_callers_sequences_and_numpy_ids(engine, tokenizer):
    import numpy as np
    labels = _label_ids(tokenizer, [" Paris", " London"])
    want = engine.score("The capital of France is", [""], labels)
    assert engine.score("The capital of France is", ("",), tuple(labels)) == want
    assert engine.score("The capital of France is", [""], list(np.array(labels))) == want
    with pytest.raises(ValueError, match="items"):
        engine.score("The capital of France is", 5, labels)
    query = tokenizer("The capital of France is").input_ids
    by_list = engine.score(query, [[]], labels)
    assert engine.score(tuple(query), ((),), labels) == by_list
    assert engine.score(np.array(query), [np.array([], dtype=np.int64)], labels) == by_list
    mine = list(labels)
    engine.score(query, [[]], mine)
    assert mine == labels and all(type(t) is int for t in mine)     # (the caller's, untouched)


def test_async_score_has_sglangs_signature(engine, tokenizer):
    import asyncio
    labels = _label_ids(tokenizer, [" Paris", " London"])
    got = asyncio.run(engine.async_score("The capital of France is", ["", " not"], labels,
                                         apply_softmax=True))
    want = engine.score("The capital of France is", ["", " not"], labels, apply_softmax=True)
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-4)     # (cached prefix vs fresh: float32 sums)
    with pytest.raises(ValueError, match="label_token_ids"):
        asyncio.run(engine.async_score("x", ["y"], []))


def test_http_score(url, tokenizer):
    labels = _label_ids(tokenizer, [" yes", " no"])
    body = {"model": "m", "query": "Is the sky blue? Answer:", "items": ["", " Well,"],
            "label_token_ids": labels, "apply_softmax": True}
    r = httpx.post(url + "/v1/score", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "scoring" and out["model"] == "m"
    assert [len(s) for s in out["scores"]] == [2, 2]
    assert all(math.isclose(sum(s), 1.0, rel_tol=1e-9) for s in out["scores"])
    prompt_tokens = sum(len(tokenizer(body["query"] + i).input_ids) for i in body["items"])
    assert out["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                            "total_tokens": prompt_tokens}


@pytest.mark.parametrize("change,param", [
    ({"label_token_ids": []}, "label_token_ids"),
    ({"label_token_ids": [10 ** 9]}, "label_token_ids"),
    ({"label_token_ids": ["a"]}, "label_token_ids"),
    ({"label_token_ids": None}, "label_token_ids"),
    ({"items": []}, "items"),
    ({"items": [[1, 2]]}, "items"),          # token items with a text query
    ({"query": [1, 2], "items": ["x"]}, "items"),
    ({"query": [1, -2], "items": [[3]]}, "query"),
    ({"query": 5}, "query"),
    ({"query": "", "items": [""]}, "items"),
    ({"apply_softmax": "yes"}, "apply_softmax"),
    ({"item_first": 1}, "item_first"),
    ({"query": "word " * 9000}, "query"),      # past the context
    ({"query": "y" * 3_000_000}, "query"),     # refused by its length in characters
    ({"items": 5}, "items"),
    ({"items": True}, "items"),
    ({"items": {"a": 1}}, "items"),            # (not scored by its keys)
    ({"model": 5}, "model"),
    ({"query": [1] * 40_000, "items": [[2]] * 2000}, "query"),   # refused before any join
    ({"query": [1] * 3000, "items": [[2] * 3000]}, "items"),
    ({"items": [""] * 4097}, "items"),         # past --max-prompts-per-request
    ({"items": ["word " * 9000]}, "items"),
    ({"query": "word " * 3000, "items": ["word " * 3000]}, "items"),   # past the KV cache
])
def test_http_score_refuses_bad_input(url, engine, change, param):
    body = {"query": "Hello", "items": [" world"], "label_token_ids": [5], **change}
    r = httpx.post(url + "/v1/score", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert "truncate" not in r.json()["error"]["message"]
    ok = httpx.post(url + "/v1/score", json={"query": "Hello", "items": [" world"],
                                             "label_token_ids": [5]}, timeout=120)
    assert ok.status_code == 200
    assert_pool_empty(engine)


def test_preferred_n_does_not_reach_the_servers_own_requests(tokenizer):
    """--preferred-sampling-params '{"n": 2}' fills n for requests that leave it unset, not for
    the server's own: an n > 1 prompt's shared prefill (which asked for n again without end and
    ran the process out of memory) or scoring (one score list per item)."""
    from radixlm.entrypoints.engine import Engine
    e = Engine(device="cpu", log_level="warning", max_total_tokens=2048,
               preferred_sampling_params='{"n": 2}')
    try:
        outs = e.generate("Hello", {"max_new_tokens": 2, "temperature": 0})
        assert isinstance(outs, list) and len(outs) == 2
        labels = _label_ids(tokenizer, [" yes", " no"])
        assert len(e.score("Is it?", ["", " Maybe"], labels)) == 2
        assert_pool_empty(e)
    finally:
        e.shutdown()


def test_tokenizing_stops_once_the_client_left(tokenizer):
    """/v1/score tokenizes many text items in chunks on a thread; when the client leaves, the
    server sets `stop` and the thread ends at the next chunk instead of tokenizing the rest."""
    import threading

    from radixlm.entrypoints.scoring import ScoringCancelled, ScoringRequest

    stop = threading.Event()
    batches = []

    class LeavesAfterOneChunk:
        """The tokenizer; the client leaves while its first chunk of items is tokenized."""
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, text):
            if isinstance(text, list):
                batches.append(len(text))
                stop.set()
            return tokenizer(text)

    req = ScoringRequest("Is this good?", [f" item {i}" for i in range(1000)], [1, 2])
    req.check(tokenizer.vocab_size)
    with pytest.raises(ScoringCancelled):
        req.prompts(LeavesAfterOneChunk(), 2048, stop)
    assert len(batches) == 1 and batches[0] < 1000
    stop.clear()
    assert len(req.prompts(tokenizer, 2048, stop)) == 1000   # (not stopped: every item)
