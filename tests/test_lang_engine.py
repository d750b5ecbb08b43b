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
