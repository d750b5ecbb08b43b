"""The frontend language where it follows SGLang's observable behaviour, on scripted backends
(no model): streamed (piece, meta_info) pairs, run_batch re-raising the program's own errors,
join's gather rule, flush_cache / get_server_info without a backend, select's meta_info and
unconditional_likelihood_normalized."""

from __future__ import annotations

import pytest

import radixlm as rl
from radixlm.lang.backends.base import StreamChunk

from lang_scripted import ScriptedBackend


class MetaStream(ScriptedBackend):
    """Streams its reply a character a chunk, each with the meta_info so far (as the native
    API does: cumulative counts), the final one with no new text."""

    def generate_stream(self, ctx, args):
        text = self.generate(ctx, args).text
        for i, ch in enumerate(text):
            yield StreamChunk(ch, {"completion_tokens": i + 1})
        yield StreamChunk("", {"completion_tokens": len(text), "finish_reason": "stop"})


def test_text_iter_return_meta_data():
    """SGLang's `text_async_iter(var_name, return_meta_data=True)`: (piece, meta_info) pairs
    of the variable's pieces; without var_name the flag changes nothing (plain text)."""
    import asyncio

    @rl.function
    def prog(s):
        s += "Q:" + rl.gen("a") + "."

    state = prog.run(backend=MetaStream(reply="xy"), stream=True)

    async def collect(**kw):
        return [p async for p in state.text_async_iter(**kw)]

    state.sync()      # (read after the run: each piece with the gen's latest meta_info)
    final = {"completion_tokens": 2, "finish_reason": "stop"}
    assert asyncio.run(collect(var_name="a", return_meta_data=True)) == \
        [("x", final), ("y", final)]
    assert list(state.text_iter("a", return_meta_data=True))[1] == ("y", final)
    assert asyncio.run(collect(return_meta_data=True)) == ["Q:", "x", "y", "."]
    assert list(state.text_iter("a")) == ["x", "y"]
    # A backend that sends meta_info only with its last (empty) chunk: that one.
    state = prog.run(backend=ScriptedBackend(reply="z"), stream=True)
    state.sync()
    assert list(state.text_iter("a", return_meta_data=True)) == [("z", {"done": True})]
    # Not streamed: the text, as SGLang (which yields the variable's value there).
    state = prog.run(backend=MetaStream(reply="xy"))
    assert list(state.text_iter("a", return_meta_data=True)) == ["xy"]


def test_run_batch_raises_the_programs_own_errors():
    """As SGLang's run_batch: an exception of the program's code is raised (after every
    program ran); backend errors stay on their state, even when a read re-raises them."""
    be = ScriptedBackend(reply="ok")

    @rl.function
    def prog(s, d):
        s += str(1 / d) + rl.gen("a")

    with pytest.raises(ZeroDivisionError):
        prog.run_batch([{"d": 1}, {"d": 0}, {"d": 2}], backend=be, num_threads=2)
    assert be.prompts == ["1.0", "0.5"] or be.prompts == ["0.5", "1.0"]   # the others ran
    it = prog.run_batch([{"d": 1}, {"d": 0}], backend=be, generator_style=True)
    assert next(it).text() == "1.0ok"
    with pytest.raises(ZeroDivisionError):
        next(it)

    def boom(ctx, args):
        raise rl.BackendUnavailableError("server gone")

    @rl.function
    def reads(s):
        s += "Q" + rl.gen("a")
        s += s["a"] + rl.gen("b")                     # the read raises the backend's error

    @rl.function
    def reads_fork(s):
        forks = s.fork(2)
        forks += "Q" + rl.select("c", choices=["a", "b"])   # unsupported: the forks' error
        forks.join()

    states = reads.run_batch([{}, {}], backend=ScriptedBackend(reply=boom))
    assert all(isinstance(s.error(), rl.BackendUnavailableError) for s in states)
    states = reads_fork.run_batch([{}, {}], backend=be)
    assert all(isinstance(s.error(), rl.UnsupportedByBackendError) for s in states)


def test_join_gathers_what_forks_set_and_keeps_the_parents_variables():
    """SGLang's gather_variable: a list of the values of the forks that set a variable (no
    None for the others), and a variable the parent had before the join is left as it is."""
    be = ScriptedBackend(reply=lambda ctx, args: ctx.text[-2:])

    @rl.function
    def prog(s):
        s += "P" + rl.gen("p")
        forks = s.fork(3)
        for i in (0, 2):
            forks[i] += f"#{i}" + rl.gen("x") + rl.gen("p")
        forks.join()

    state = prog.run(backend=be)
    assert state["x"] == ["#0", "#2"]
    assert len(state.get_meta_info("x")) == 2
    assert state["p"] == "P"


def test_flush_cache_and_server_info_without_a_backend(monkeypatch):
    from radixlm.lang import default_backend

    monkeypatch.setattr(default_backend, "_default", None)
    assert rl.flush_cache() is False and rl.get_server_info() is None   # SGLang's answers
    seen = []

    class Flushable(ScriptedBackend):
        def flush_cache(self, empty_cache=True):
            seen.append(empty_cache)

    rl.flush_cache(Flushable(), empty_cache=False)
    monkeypatch.setattr(default_backend, "_default", Flushable())
    rl.flush_cache()
    assert seen == [False, True]


def scripted_native(logprob):
    """A NativeBackend without an engine: one token a character, prompt logprobs from
    `logprob(token, context)` (None for a token with nothing before it)."""
    from radixlm.lang.backends.native import NativeBackend

    class Scripted(NativeBackend):
        requests: list = []

        def _tokenize(self, texts):
            return [[ord(c) for c in t] for t in texts]

        def _generate(self, payload):
            if not payload.get("return_logprob"):         # a prefix prefill
                return {"text": "", "meta_info": {}}
            self.requests.append(payload)
            ids_list, starts = payload["input_ids"], payload["logprob_start_len"]
            starts = starts if isinstance(starts, list) else [starts] * len(ids_list)
            return [{"text": "", "meta_info": {
                "output_token_logprobs": [], "input_token_logprobs": [
                    [logprob(ids[j], ids[:j]) if j else None, ids[j], None]
                    for j in range(k, len(ids))]}} for ids, k in zip(ids_list, starts)]

        _generate_stream = _generate

    return Scripted()


def test_select_meta_info_and_unconditional_likelihood_normalized():
    """The select's meta_info carries SGLang's keys; unconditional_likelihood_normalized
    scores each choice's tokens against their logprobs without the prompt."""
    uln = rl.unconditional_likelihood_normalized      # (SGLang's name, top level)

    # "a" is likely anywhere, "b" unlikely unless the text starts with the prompt "Q:".
    def logprob(tok, context):
        primed = context[:2] == [ord("Q"), ord(":")]
        if chr(tok) == "a":
            return -0.5 if primed else -0.1
        return -1.0 if primed else -5.0

    @rl.function
    def prog(s, method, choices):
        s += "Q:" + rl.select("c", choices=choices, choices_method=method)

    be = scripted_native(logprob)
    state = prog.run(method="token_length_normalized", choices=["a", "b"], backend=be)
    meta = state.get_meta_info("c")
    assert state["c"] == "a" and meta["normalized_prompt_logprobs"] == [-0.5, -1.0]
    assert meta["input_token_logprobs"] == [[[-0.5, ord("a"), None]], [[-1.0, ord("b"), None]]]
    assert meta["output_token_logprobs"] == [[], []]
    state = prog.run(method="greedy_token_selection", choices=["a", "bb"], backend=be)
    assert state.get_meta_info("c")["greedy_logprob_matrix"] == [[-0.5, -0.5], [-1.0, -1.0]]

    # A choice's first token has no logprob without context (None): it counts as 0.
    state = prog.run(method=uln, choices=["a", "b"], backend=be)
    meta = state.get_meta_info("c")
    assert meta["unconditional_token_logprobs"] == [[[None, ord("a"), None]],
                                                    [[None, ord("b"), None]]]
    assert state["c"] == "a" and meta["normalized_unconditional_prompt_logprobs"] == [-0.5, -1.0]
    assert be.requests[-1]["input_ids"] == [[ord("a")], [ord("b")]]
    # "bb" is less likely than "aa" after the prompt, but far more raised by it.
    assert prog.run(method=None, choices=["aa", "bb"], backend=be)["c"] == "aa"
    state = prog.run(method=uln, choices=["aa", "bb"], backend=be)
    assert state["c"] == "bb"
    assert state.get_meta_info("c")["normalized_unconditional_prompt_logprobs"] == \
        pytest.approx([(-0.5 + (-0.5 + 0.1)) / 2, (-1.0 + (-1.0 + 5.0)) / 2])
    with pytest.raises(rl.UnsupportedByBackendError, match="unconditional"):
        prog.run(method=uln, choices=["a", "b"],
                 backend=rl.OpenAI("m", base_url="http://127.0.0.1:9/v1"))


def test_global_config_settings_radixlm_has(monkeypatch):
    """`sgl.global_config`: default_backend is set_default_backend's; enable_precache_with_tracing
    is run_batch's default warm-up; any other setting is refused by name, not ignored."""
    import radixlm.lang.default_backend as db
    monkeypatch.setattr(db, "_default", None)
    be = ScriptedBackend(reply="x")
    rl.global_config.default_backend = be
    assert rl.get_default_backend() is be and rl.global_config.default_backend is be

    @rl.function
    def prog(s, q):
        s += "A long shared preamble. " + q + rl.gen("a")

    prog.run_batch([{"q": "1"}, {"q": "2"}])
    assert be.cached == ["A long shared preamble. "]
    monkeypatch.setattr(rl.global_config, "enable_precache_with_tracing", False)
    prog.run_batch([{"q": "1"}, {"q": "2"}])
    assert be.cached == ["A long shared preamble. "]                   # (no second warm-up)
    with pytest.raises(AttributeError, match="verbosity"):
        rl.global_config.verbosity = 2
