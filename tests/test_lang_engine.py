"""The frontend language on an in-process Engine (no server): roles, gen, select, run_batch,
and the error after the engine is shut down."""

from __future__ import annotations

import pytest

import radixlm as rl


def test_engine_backend(make_engine):
    engine = make_engine(max_total_tokens=4096)

    @rl.function
    def prog(s, question):
        s += rl.user(question)
        s += rl.assistant(rl.gen("a", max_tokens=4) + rl.select("end", choices=[".", "!"]))

    state = prog.run(question="What is the capital of France?", backend=engine, temperature=0)
    messages = state.messages()
    assert state.text() == engine.apply_chat_template(messages, add_generation_prompt=False)
    # The gen is what the engine itself generates from the chat template's prompt.
    prompt = engine.apply_chat_template(messages[:1])
    direct = engine.generate(prompt, {"max_new_tokens": 4, "temperature": 0})
    assert state["a"] == direct["text"]
    scores = state.get_meta_info("end")["scores"]
    assert state["end"] == [".", "!"][scores.index(max(scores))]

    states = prog.run_batch([{"question": q} for q in ("Hi?", "Why?", "Who?")], backend=engine,
                            temperature=0)
    assert all(s.error() is None and s["end"] in (".", "!") for s in states)

    engine.shutdown()
    with pytest.raises(rl.BackendUnavailableError, match="shut down"):
        prog.run(question="Still there?", backend=engine)


def test_engine_select_meta_info_unconditional_and_stream_meta(make_engine):
    """On the real model: select's meta_info has SGLang's logprob keys;
    unconditional_likelihood_normalized scores each choice's tokens also without the prompt
    (the first one: None, counted as 0); a streamed gen's pieces come with their meta_info;
    flush_cache takes SGLang's empty_cache."""
    from radixlm.lang import unconditional_likelihood_normalized

    engine = make_engine(max_total_tokens=4096)

    @rl.function
    def pick(s, method):
        s += "The capital of France is" + rl.select(
            "city", choices=[" Paris", " the city of Lyon"], choices_method=method)

    state = pick.run(method=unconditional_likelihood_normalized, backend=engine)
    meta = state.get_meta_info("city")
    for key in ("normalized_prompt_logprobs", "input_token_logprobs", "output_token_logprobs",
                "unconditional_token_logprobs", "normalized_unconditional_prompt_logprobs"):
        assert len(meta[key]) == 2, key
    for cond, uncond, ids, score in zip(meta["input_token_logprobs"],
                                        meta["unconditional_token_logprobs"],
                                        meta["choice_token_ids"],
                                        meta["normalized_unconditional_prompt_logprobs"]):
        assert [e[1] for e in uncond] == ids == [e[1] for e in cond]
        assert uncond[0][0] is None and all(e[0] is not None for e in uncond[1:])
        diffs = [c[0] - (u[0] or 0.0) for c, u in zip(cond, uncond)]
        assert score == pytest.approx(sum(diffs) / len(diffs))
    best = max(range(2), key=lambda i: meta["normalized_unconditional_prompt_logprobs"][i])
    assert state["city"] == [" Paris", " the city of Lyon"][best]

    @rl.function
    def story(s):
        s += "Once upon a time" + rl.gen("a", max_tokens=4, ignore_eos=True)

    state = story.run(backend=engine, stream=True, temperature=0)
    pairs = list(state.text_iter("a", return_meta_data=True))
    assert "".join(p for p, _ in pairs) == state["a"]
    counts = [m["completion_tokens"] for _, m in pairs]
    assert counts == sorted(counts) and counts[-1] <= 4
    assert rl.flush_cache(backend=engine, empty_cache=False) is None
