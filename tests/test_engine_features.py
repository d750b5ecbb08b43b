"""Engine behaviour on the bundled model: prefix reuse, memory pressure and retraction, abort,
sampling controls, logprobs, n > 1, streaming, and bad input."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from helpers import assert_pool_empty, hf_greedy

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    from radixlm.entrypoints.engine import Engine
    e = Engine(device="cpu", log_level="warning", max_total_tokens=8192)
    yield e
    e.shutdown()


# ---------------------------------------------------------------------- prefix cache

def test_get_server_info_as_sglang(engine):
    """SGLang's Engine.get_server_info: the HTTP endpoint's body, from the Engine."""
    info = engine.get_server_info()
    assert info["device"] == "cpu" and info["max_total_tokens"] == 8192
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] > 0
    assert info["served_model_name"] == "SmolLM2-135M-Instruct" and info["version"]


def test_shared_prefix_is_reused_with_same_output(engine, make_engine):
    system = ("You are a careful assistant. Answer briefly and precisely, and never make up "
              "facts that you do not know. ")
    engine.generate(system + "Question one: what is a cat?", {"max_new_tokens": 4, **GREEDY})
    second = engine.generate(system + "Question two: what is a dog?",
                             {"max_new_tokens": 16, **GREEDY})
    assert second["meta_info"]["cached_tokens"] > 10
    cold = make_engine(disable_radix_cache=True, max_total_tokens=2048)
    ref = cold.generate(system + "Question two: what is a dog?", {"max_new_tokens": 16, **GREEDY})
    assert ref["meta_info"]["cached_tokens"] == 0
    assert second["output_ids"] == ref["output_ids"]
    assert_pool_empty(engine)


def test_max_new_tokens_zero_fills_the_cache(engine):
    prompt = "Zero new tokens only warms the prefix cache for the next request, said the manual."
    out = engine.generate(prompt, {"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["text"] == ""
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    again = engine.generate(prompt, {"max_new_tokens": 1, **GREEDY})
    assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1


# ---------------------------------------------------------------------- memory pressure

def test_memory_pressure_retracts_and_still_matches(make_engine, hf_model, tokenizer):
    prompts = [f"Story {i}: the {w} walked into the" for i, w in
               enumerate(["fox", "king", "robot", "sailor", "child", "painter", "dragon", "cook"])]
    new = 24
    # 8 requests x (~12 prompt + 24 new) tokens > 200 slots: they can't all decode at once.
    engine = make_engine(max_total_tokens=200, schedule_conservativeness=0.05)
    outs = engine.generate(prompts, {"max_new_tokens": new, **GREEDY})
    stats = engine.get_stats()
    assert stats.num_retractions > 0, "the pool was sized to force retraction"
    for p, o in zip(prompts, outs):
        assert o["output_ids"] == hf_greedy(hf_model, tokenizer(p).input_ids, new)
    assert_pool_empty(engine)
    assert engine.flush_cache()
    stats = engine.get_stats()
    assert stats.available_kv_tokens == stats.max_total_num_tokens


def test_a_budget_past_the_pool_is_clamped_to_it(make_engine, hf_model, tokenizer):
    """A request whose prompt fits the pool but whose max_new_tokens does not ends with
    "length" at what the pool holds, its output kept (as SGLang clamps it), not an error after
    generating into a full pool."""
    engine = make_engine(max_total_tokens=128)
    capacity = engine.get_stats().max_total_num_tokens - 1     # (page size 1)
    prompt = "Count: one, two, three,"
    out = engine.generate(prompt, {"max_new_tokens": 400, "ignore_eos": True, **GREEDY})
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "length", meta["finish_reason"]
    assert meta["completion_tokens"] == capacity - meta["prompt_tokens"]
    assert out["output_ids"][:16] == hf_greedy(hf_model, tokenizer(prompt).input_ids, 16)
    assert_pool_empty(engine)
    # A prompt the pool cannot hold fails the whole batch before anything streams
    with pytest.raises(ValueError, match="KV cache holds"):
        next(iter(engine.generate(["Hi", "word " * 200], {"max_new_tokens": 2}, stream=True)))
    assert_pool_empty(engine)
    assert engine.generate("Hi", {"max_new_tokens": 2, **GREEDY})["meta_info"][
        "completion_tokens"] == 2


# ---------------------------------------------------------------------- abort

def test_abort_waiting_prefilling_and_decoding_requests(make_engine):
    # A tiny prefill chunk keeps a long prompt in prefill for many steps.
    engine = make_engine(max_total_tokens=2048, chunked_prefill_size=8, max_running_requests=2)
    long_prompt = "word " * 300
    results: dict[str, dict] = {}

    def run(name, prompt, n):
        results[name] = engine.generate(prompt, {"max_new_tokens": n, **GREEDY}, rid=name)

    threads = [threading.Thread(target=run, args=("decoding", "Count to a hundred:", 400)),
               threading.Thread(target=run, args=("prefilling", long_prompt, 4)),
               threading.Thread(target=run, args=("waiting", "Never runs", 4))]
    for t in threads:
        t.start()
        time.sleep(0.3)
    time.sleep(1.0)
    for rid in ("waiting", "prefilling", "decoding"):
        engine.abort_request(rid)
    for t in threads:
        t.join(timeout=60)
    for name in ("waiting", "prefilling", "decoding"):
        assert results[name]["meta_info"]["finish_reason"]["type"] == "abort", name
    assert len(results["decoding"]["output_ids"]) < 400
    assert_pool_empty(engine)
    # and the engine keeps serving
    assert engine.generate("Hi", {"max_new_tokens": 2, **GREEDY})["meta_info"][
        "completion_tokens"] == 2


def test_stream_consumer_going_away_aborts(engine):
    stream = engine.generate("Tell me a very long story.", {"max_new_tokens": 500, **GREEDY},
                             stream=True)
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    stream.close()
    deadline = time.time() + 30
    while time.time() < deadline and engine.get_stats().num_running_reqs:
        time.sleep(0.1)
    assert_pool_empty(engine)


# ---------------------------------------------------------------------- sampling

def test_seeded_sampling_is_reproducible(engine):
    params = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.95, "sampling_seed": 1234}
    a = engine.generate("Invent a name for a planet:", params)
    b = engine.generate("Invent a name for a planet:", params)
    assert a["output_ids"] == b["output_ids"]
    # batched with other requests, in a different position: still the same tokens
    batch = engine.generate(["Other prompt", "Invent a name for a planet:"],
                            [{"max_new_tokens": 16, "temperature": 1.0}, params])
    assert batch[1]["output_ids"] == a["output_ids"]
    seeds = {tuple(engine.generate("Invent a name for a planet:",
                                   {**params, "sampling_seed": s})["output_ids"]) for s in range(4)}
    assert len(seeds) > 1


def test_top_k_one_equals_greedy(engine):
    greedy = engine.generate("The moon is", {"max_new_tokens": 12, **GREEDY})
    topk1 = engine.generate("The moon is", {"max_new_tokens": 12, "temperature": 1.0,
                                            "top_k": 1, "ignore_eos": True})
    assert greedy["output_ids"] == topk1["output_ids"]


def test_stop_string_ends_text_before_it(engine):
    free = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 12, **GREEDY})
    assert " 6" in free["text"]
    out = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 12, "temperature": 0, "stop": [" 6"]})
    assert out["text"] == free["text"][:free["text"].index(" 6")]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 6"}
    kept = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 12, "temperature": 0,
                                           "stop": [" 6"], "no_stop_trim": True})
    assert kept["text"].endswith(" 6")


def test_stop_token_ids_and_min_new_tokens(engine):
    free = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 8, **GREEDY})
    comma = free["output_ids"][1]
    out = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 8, "temperature": 0,
                                           "stop_token_ids": [comma]})
    assert out["output_ids"] == free["output_ids"][:2]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": comma}
    assert not out["text"].endswith(",")  # the matched stop token's text is trimmed
    longer = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 8, "temperature": 0,
                                              "stop_token_ids": [comma], "min_new_tokens": 4})
    assert len(longer["output_ids"]) >= 4


def test_a_stop_on_the_last_allowed_token_is_a_stop(engine):
    """A stop string, stop token or EOS that the last token max_new_tokens allows completes
    ends the request as a stop (trimmed, matched named), not as length."""
    free = engine.generate("1, 2, 3, 4,", {"max_new_tokens": 8, **GREEDY})
    text = free["text"][:free["text"].index(" 6") + 2]
    k = next(i for i in range(1, 9)
             if engine.tokenizer.decode(free["output_ids"][:i]).endswith(" 6"))
    assert engine.tokenizer.decode(free["output_ids"][:k]) == text
    out = engine.generate("1, 2, 3, 4,", {"max_new_tokens": k, "temperature": 0,
                                           "stop": [" 6"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 6"}
    assert out["text"] == text[:-2]
    last = free["output_ids"][k - 1]
    out = engine.generate("1, 2, 3, 4,", {"max_new_tokens": k, "temperature": 0,
                                           "stop_token_ids": [last]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": last}
    chat = engine.apply_chat_template([{"role": "user", "content": "Say hi."}])
    ended = engine.generate(chat, {"max_new_tokens": 64, "temperature": 0})
    assert ended["meta_info"]["finish_reason"]["type"] == "stop"
    same = engine.generate(chat, {"max_new_tokens": len(ended["output_ids"]),
                                  "temperature": 0})
    assert same["meta_info"]["finish_reason"] == ended["meta_info"]["finish_reason"]
    assert same["text"] == ended["text"]


def test_eos_stops_unless_ignored(engine):
    chat = engine.apply_chat_template([{"role": "user", "content": "Say hi."}])
    out = engine.generate(chat, {"max_new_tokens": 64, "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["output_ids"][-1] in engine.ready.eos_token_ids
    assert "<|im_end|>" not in out["text"]
    n = len(out["output_ids"])
    ignored = engine.generate(chat, {"max_new_tokens": n + 3, **GREEDY})
    assert len(ignored["output_ids"]) == n + 3


def test_n_samples_share_the_prompt(engine):
    outs = engine.generate("Name a fruit:", {"max_new_tokens": 8, "temperature": 1.0, "n": 3,
                                             "sampling_seed": 7})
    assert len(outs) == 3
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)


# ---------------------------------------------------------------------- logprobs

def test_logprobs_match_hf(engine, hf_model, tokenizer):
    prompt = "The quick brown fox jumps over the lazy"
    out = engine.generate(prompt, {"max_new_tokens": 6, **GREEDY}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True)
    meta = out["meta_info"]
    ids = tokenizer(prompt).input_ids + out["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
    inp = meta["input_token_logprobs"]
    assert len(inp) == len(tokenizer(prompt).input_ids)
    assert inp[0][0] is None and inp[0][1] == ids[0]
    for pos, (lp, tid, text) in enumerate(inp[1:], start=1):
        assert tid == ids[pos] and abs(lp - float(ref[pos - 1, tid])) < 1e-3
        assert text == tokenizer.decode([tid])
    n_prompt = len(inp)
    for k, (lp, tid, _) in enumerate(meta["output_token_logprobs"]):
        assert tid == out["output_ids"][k]
        assert abs(lp - float(ref[n_prompt - 1 + k, tid])) < 1e-3
    for k, top in enumerate(meta["output_top_logprobs"]):
        assert len(top) == 3
        assert top[0][1] == out["output_ids"][k]  # greedy picks the best
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"][1]) == 3


def test_token_ids_logprob_match_hf(engine, hf_model, tokenizer):
    """SGLang's token_ids_logprob: at every prompt position (from logprob_start_len) and every
    output position, the logprobs of the asked ids, in the order asked, as HF computes them."""
    prompt = "The quick brown fox jumps over the"
    asked = [tokenizer(" lazy").input_ids[-1], 13, 0, 500]
    out = engine.generate(prompt, {"max_new_tokens": 5, **GREEDY}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=2, token_ids_logprob=asked)
    meta = out["meta_info"]
    prompt_ids = tokenizer(prompt).input_ids
    ids = prompt_ids + out["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
    inp = meta["input_token_ids_logprobs"]
    assert len(inp) == len(prompt_ids) and inp[0] is None
    for pos, entries in enumerate(inp[1:], start=1):
        assert [t for _, t, _ in entries] == asked
        assert [lp for lp, _, _ in entries] == pytest.approx(
            [float(ref[pos - 1, t]) for t in asked], abs=1e-3)
    outs = meta["output_token_ids_logprobs"]
    assert len(outs) == len(out["output_ids"])
    for k, entries in enumerate(outs):
        assert [t for _, t, _ in entries] == asked
        assert [lp for lp, _, _ in entries] == pytest.approx(
            [float(ref[len(prompt_ids) - 1 + k, t]) for t in asked], abs=1e-3)
        # The same numbers as the top logprobs where the two lists meet.
        for lp, t, _ in meta["output_top_logprobs"][k]:
            if t in asked:
                assert entries[asked.index(t)][0] == pytest.approx(lp, abs=1e-5)
    # One list per prompt in a batch; out-of-vocabulary and non-integer ids are refused.
    two = engine.generate([prompt, "Hello"], {"max_new_tokens": 2, **GREEDY},
                          return_logprob=True, token_ids_logprob=[[13], [0, 1]])
    assert [[t for _, t, _ in e] for e in two[1]["meta_info"]["output_token_ids_logprobs"]] \
        == [[0, 1], [0, 1]]
    for bad in ([10**9], [1.5], ["a"], [[1], [2]]):
        with pytest.raises(ValueError, match="token_ids_logprob"):
            engine.generate(prompt, {"max_new_tokens": 1}, return_logprob=True,
                            token_ids_logprob=bad)


def test_logprob_start_len_and_default(engine, tokenizer):
    prompt = "Counting sheep: one, two, three, four, five"
    n = len(tokenizer(prompt).input_ids)
    out = engine.generate(prompt, {"max_new_tokens": 2, **GREEDY}, return_logprob=True,
                          logprob_start_len=3)
    assert len(out["meta_info"]["input_token_logprobs"]) == n - 3
    assert all(lp is not None for lp, _, _ in out["meta_info"]["input_token_logprobs"])
    default = engine.generate(prompt, {"max_new_tokens": 2, **GREEDY}, return_logprob=True)
    assert len(default["meta_info"]["input_token_logprobs"]) == 1
    assert len(default["meta_info"]["output_token_logprobs"]) == 2


def test_sglang_generate_arguments(engine, tokenizer):
    """SGLang's generate() keywords: taken when unset (None / False), refused when set; a
    typo is a TypeError; a logprob_start_len at or past the prompt's end is refused."""
    params = {"max_new_tokens": 2, **GREEDY}
    out = engine.generate("Hi", params, image_data=None, lora_path=None,
                          return_hidden_states=False, custom_logit_processor=None,
                          data_parallel_rank=None, token_ids_logprob=None, lora_id=None)
    assert out["meta_info"]["completion_tokens"] == 2
    with pytest.raises(ValueError, match="image_data"):
        engine.generate("Hi", params, image_data="cat.png")
    with pytest.raises(TypeError, match="return_logprobs"):
        engine.generate("Hi", params, return_logprobs=True)
    n = len(tokenizer("Hello there").input_ids)
    with pytest.raises(ValueError, match="logprob_start_len"):
        engine.generate("Hello there", params, return_logprob=True, logprob_start_len=n)
    last = engine.generate("Hello there", params, return_logprob=True, logprob_start_len=n - 1)
    assert len(last["meta_info"]["input_token_logprobs"]) == 1


def test_engine_takes_server_args_and_refuses_dp(smollm_dir):
    from radixlm import Engine, ServerArgs
    with pytest.raises(ValueError, match="dp-size"):
        Engine(device="cpu", dp_size=2)
    with pytest.raises(TypeError, match="not both"):
        Engine(server_args=ServerArgs(device="cpu"), max_total_tokens=1024)
    engine = Engine(server_args=ServerArgs(device="cpu", max_total_tokens=2048,
                                           log_level="warning"))
    try:
        assert engine.server_args.max_total_tokens == 2048
        assert engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    finally:
        engine.shutdown()


def test_streaming_is_cumulative(engine):
    chunks = list(engine.generate("Colours of the rainbow:", {"max_new_tokens": 10, **GREEDY},
                                  stream=True))
    full = engine.generate("Colours of the rainbow:", {"max_new_tokens": 10, **GREEDY})
    assert len(chunks) >= 2
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"])
    assert chunks[-1]["text"] == full["text"]
    assert chunks[-1]["output_ids"] == full["output_ids"]


def test_async_generate(engine):
    async def main():
        one = await engine.async_generate("Hello", {"max_new_tokens": 3, **GREEDY})
        parts = [c async for c in await engine.async_generate(
            "Hello", {"max_new_tokens": 3, **GREEDY}, stream=True)]
        return one, parts

    one, parts = asyncio.run(main())
    assert parts[-1]["output_ids"] == one["output_ids"] and len(one["output_ids"]) == 3


# ---------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs, field", [
    ({"prompt": ""}, "empty"),
    ({"prompt": "x " * 9000}, "context length"),
    ({"sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"sampling_params": {"temperature": -0.5}}, "temperature"),
    ({"sampling_params": {"top_p": 0}}, "top_p"),
    ({"sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"sampling_params": {"top_k": 0}}, "top_k"),
    ({"sampling_params": {"top_k": -2}}, "top_k"),
    ({"sampling_params": {"n": 0}}, "n must be"),
    ({"sampling_params": {"stop_token_ids": [10**9]}}, "stop_token_ids"),
    ({"sampling_params": {"max_new_tokens": "ten"}}, "max_new_tokens"),
    ({"input_ids": [1, -5]}, "input_ids"),
])
def test_bad_input_raises_value_error(engine, kwargs, field):
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", None if "input_ids" in kwargs else "Hello")
    with pytest.raises(ValueError, match=field):
        engine.generate(prompt, kwargs.pop("sampling_params", {"max_new_tokens": 1}), **kwargs)
    # and it keeps serving
    assert engine.generate("Hi", {"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1


def test_a_batch_whose_later_prompt_is_bad_fails_as_a_whole(engine):
    """Each prompt of a batch goes to the scheduler as soon as it passes its checks (the GPU
    starts on a big batch's first prompts meanwhile). A later prompt that fails aborts those
    already sent: the request raises, nothing keeps running or holds KV, serving goes on."""
    good = [[100 + i, 200, 300, 400] * 8 for i in range(3)]
    for bad, field in (([1, 10**9], "outside the vocabulary"), ([1, True], "input_ids"),
                       ([], "empty")):
        with pytest.raises(ValueError, match=field):
            engine.generate(None, {"max_new_tokens": 3000, **GREEDY}, input_ids=good + [bad])
        deadline = time.time() + 30       # (3,000 tokens each would take minutes on the CPU)
        while time.time() < deadline:
            stats = engine.get_stats()
            if not (stats.num_running_reqs or stats.num_waiting_reqs):
                break
            time.sleep(0.05)
        assert_pool_empty(engine)
    same = [{"max_new_tokens": 2, **GREEDY}] * 2
    with pytest.raises(ValueError, match="repeats a `rid`"):
        engine.generate(None, same, input_ids=good[:2], rid=["r1", "r1"])
    out = engine.generate(None, same, input_ids=good[:2], rid=["r1", "r2"])
    assert [o["meta_info"]["completion_tokens"] for o in out] == [2, 2]
    # One string rid for a batch names its prompts rid_0, rid_1, ... (as SGLang), not dropped.
    out = engine.generate(None, same, input_ids=good[:2], rid="batch")
    assert [o["meta_info"]["id"] for o in out] == ["batch_0", "batch_1"]
    for kwargs in ({"stream": "yes"}, {"return_logprob": "no"}, {"return_logprob": [True, 1]},
                   {"return_text_in_logprobs": 1}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            engine.generate(None, same, input_ids=good[:2], **kwargs)
    # The 400 comes once the prompts sent before the bad one have ended: the same batch sent
    # again at once, with the same rids, gets its own outputs, not the aborted ones' (the
    # scheduler is kept busy by a long request meanwhile, so aborts take a step to land).
    busy_out: list = []
    busy = threading.Thread(target=lambda: busy_out.append(engine.generate(
        "Count to a thousand:", {"max_new_tokens": 300, **GREEDY}, rid="busy")))
    busy.start()
    rids = [f"q{i}" for i in range(3)]
    for _ in range(3):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.generate(None, {"max_new_tokens": 16, **GREEDY}, input_ids=good + [[1, 10**9]],
                            rid=rids + ["q3"])
        out = engine.generate(None, {"max_new_tokens": 16, **GREEDY}, input_ids=good, rid=rids)
        assert [o["meta_info"]["finish_reason"]["type"] for o in out] == ["length"] * 3
        assert [len(o["output_ids"]) for o in out] == [16] * 3
    engine.abort_request("busy")          # (its 300 tokens would take most of a minute here)
    busy.join(timeout=120)
    assert busy_out and busy_out[0]["meta_info"]["finish_reason"]["type"] in ("abort", "length")
    assert_pool_empty(engine)


def test_generate_after_shutdown_raises(make_engine):
    from radixlm.managers.tokenizer_manager import EngineDeadError
    e = make_engine(max_total_tokens=512)
    e.shutdown()
    with pytest.raises(EngineDeadError, match="shut down"):
        e.generate("Hi", {"max_new_tokens": 1})
    with pytest.raises(EngineDeadError, match="shut down"):
        e.abort_request("any")
