"""The frontend language against a real `radixlm serve` on the bundled model: chained gens,
few-shot QA, select (checked against a direct logprob computation), regex, parallel forks,
streaming, run_batch, the OpenAI backend on the server's /v1, and the errors a program author
sees. (The in-process Engine backend: test_lang_engine.py.)"""

from __future__ import annotations

import re
import signal
import threading
import time

import httpx
import pytest

import radixlm as rl
from radixlm.lang.backends.base import Backend
from radixlm.lang.backends.native import common_prefix_len

from helpers import start_server, stop_server

FEW_SHOT = ("Q: What is the capital of France?\nA: Paris\n"
            "Q: What is the capital of Germany?\nA: Berlin\n"
            "Q: What is the capital of Italy?\nA: Rome\n")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("--max-total-tokens", "16384")
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def url(server) -> str:
    return server[1]


@pytest.fixture(scope="module")
def backend(url):
    be = rl.RuntimeEndpoint(url)
    rl.set_default_backend(be)
    yield be
    be.shutdown()


def generate(url: str, body: dict) -> dict:
    return httpx.post(url + "/generate", json=body, timeout=120).json()


class TimedBackend(Backend):
    """Delegates to a real backend and records when each generate call ran."""

    def __init__(self, real: Backend):
        super().__init__()
        self.real = real
        self.intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def generate(self, ctx, args):
        start = time.monotonic()
        res = self.real.generate(ctx, args)
        with self._lock:
            self.intervals.append((start, time.monotonic()))
        return res

    def cache_prefix(self, text):
        self.real.cache_prefix(text)

    def chat_renderer(self):
        return self.real.chat_renderer()


def test_chained_gens(backend, url):
    @rl.function
    def chained(s, country):
        s += f"The capital of {country} is" + rl.gen("capital", max_tokens=4)
        s += ". Its most famous building is" + rl.gen("building", max_tokens=4)

    state = chained.run(country="France", temperature=0)
    text = state.text()
    assert text == (f"The capital of France is{state['capital']}. Its most famous building "
                    f"is{state['building']}")
    # Each gen is exactly what the server generates for the prompt so far...
    prompt2 = text[:len(text) - len(state["building"])]
    direct = generate(url, {"text": prompt2,
                            "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert direct["text"] == state["building"]
    # ...and the second one reused the first request's KV through the radix cache.
    assert state.get_meta_info("building")["cached_tokens"] > 0


def test_few_shot_qa(backend):
    @rl.function
    def few_shot_qa(s, question):
        s += FEW_SHOT + "Q: " + question + "\nA:"
        s += rl.gen("answer", max_tokens=6, stop="\n", temperature=0)

    state = few_shot_qa.run(question="What is the capital of Japan?")
    assert state["answer"].strip() == "Tokyo"
    assert state.text() == FEW_SHOT + "Q: What is the capital of Japan?\nA: Tokyo"
    again = few_shot_qa.run(question="What is the capital of Egypt?")
    meta = again.get_meta_info("answer")
    assert meta["cached_tokens"] >= meta["prompt_tokens"] - 12   # the shots came from the cache


def test_select_scores_match_direct_logprobs(backend, url, tokenizer):
    @rl.function
    def pick(s, prefix, choices):
        s += prefix + rl.select("city", choices=choices)

    cases = [("The capital of France is", [" Paris", " London", " Berlin", " Madrid"]),
             # The prefix ends in a space that BPE merges into each choice's first token, so
             # the choice tokens start one token before the end of the prefix's tokens.
             ("The Eiffel Tower is in ", ["Paris", "London", "Berlin", "Madrid"])]
    for prefix, choices in cases:
        state = pick.run(prefix=prefix, choices=choices)
        scores = state.get_meta_info("city")["scores"]
        best = max(range(len(choices)), key=lambda i: scores[i])
        assert state["city"] == choices[best] == choices[0]
        assert state.text() == prefix + choices[best]
        prefix_ids = tokenizer(prefix).input_ids
        for choice, score in zip(choices, scores):
            # Direct: all prompt logprobs of prefix + choice in one plain request.
            ids = tokenizer(prefix + choice).input_ids
            k = common_prefix_len(prefix_ids, ids)
            out = generate(url, {"text": prefix + choice, "return_logprob": True,
                                 "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 0}})
            lps = [e[0] for e in out["meta_info"]["input_token_logprobs"][k:]]
            assert score == pytest.approx(sum(lps) / len(lps), abs=2e-3), (prefix, choice)


def test_select_in_chat_roles_and_greedy_tokens(backend):
    @rl.function
    def quiz(s):
        s += rl.user("Is the sky blue? Answer yes or no.")
        s += rl.assistant(rl.gen("answer", choices=["yes", "no", "maybe not"],
                                 choices_method=rl.greedy_token_selection))

    state = quiz.run()
    meta = state.get_meta_info("answer")
    first = [lps[0][0] if lps[0][0] is not None else lps[1][0]
             for lps in meta["input_token_logprobs"]]
    assert state["answer"] == ["yes", "no", "maybe not"][max(range(3), key=lambda i: first[i])]
    assert state.messages()[-1] == {"role": "assistant", "content": state["answer"]}


def test_regex_constrained_gen(backend):
    @rl.function
    def numbers(s):
        s += "My favourite three-digit number is " + rl.gen("n", regex=r"[0-9]{3}", max_tokens=8)
        s += ". I am this many years old: " + rl.gen("age", dtype=int, max_tokens=3)

    state = numbers.run(temperature=0)
    assert re.fullmatch(r"[0-9]{3}", state["n"]), state["n"]
    assert re.fullmatch(r"-?[0-9]+", state["age"]), state["age"]


def test_fork_join_runs_branches_in_parallel(backend):
    timed = TimedBackend(backend)
    aspects = ["clarity", "accuracy", "style"]

    @rl.function
    def judge(s, essay):
        s += "Essay: " + essay + "\n"
        forks = s.fork(len(aspects))
        for f, aspect in zip(forks, aspects):
            f += f"Rate the essay's {aspect} from 1 to 10 and explain:"
            f += rl.gen("judgement", max_tokens=6, ignore_eos=True)
        forks.join()
        s += "Verdict:" + rl.gen("verdict", max_tokens=3)

    state = judge.run(essay="The sky is blue because of Rayleigh scattering.", backend=timed,
                      temperature=0)
    assert len(state["judgement"]) == 3 and all(state["judgement"])
    fork_calls = timed.intervals[:3]
    starts, ends = zip(*fork_calls)
    assert max(starts) < min(ends), "the forks' generations did not overlap"
    assert state.text().startswith("Essay: The sky") and "Verdict:" in state.text()


def test_streaming(backend):
    @rl.function
    def story(s):
        s += "Once upon a time," + rl.gen("story", max_tokens=8, ignore_eos=True)
        s += "\nThe end."

    state = story.run(stream=True, temperature=0)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text()
    assert pieces[0] == "Once upon a time," and pieces[-1] == "\nThe end."
    assert len(pieces) >= 4, pieces        # the gen arrived in several pieces
    assert "".join(story.run(stream=True, temperature=0).text_iter("story")) == state["story"]


def test_run_batch_32_programs(backend, capfd):
    @rl.function
    def few_shot_qa(s, question):
        s += FEW_SHOT + "Q: " + question + "\nA:"
        s += rl.gen("answer", max_tokens=4, stop="\n")

    backend.usage.reset()
    questions = [f"What is {i} plus {i}?" for i in range(32)]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], temperature=0,
                                   progress_bar=True)
    assert len(states) == 32 and all(s.error() is None for s in states)
    assert all(s.text().startswith(FEW_SHOT + "Q: " + q) for s, q in zip(states, questions))
    # The shared few-shot prefix was cached once before the batch: every program hit it.
    assert all(s.get_meta_info("answer")["cached_tokens"] >= 40 for s in states)
    assert "32/32" in capfd.readouterr().err     # the progress bar
    assert backend.usage.cache_hit_rate > 0.5


def test_gen_with_n_samples(backend, url):
    """gen(n=3) draws three samples in one request: the variable is their list (each what
    the server samples for that prompt and seed), the text goes on with the first; on the
    OpenAI backend too."""
    @rl.function
    def story(s):
        s += "Once upon a time" + rl.gen("start", max_tokens=6, n=3, temperature=1.0, seed=7)
        s += "." + rl.gen("end", max_tokens=3, temperature=0)

    state = story.run()
    samples = state["start"]
    assert isinstance(samples, list) and len(samples) == 3 and len(set(samples)) > 1
    assert state.text().startswith("Once upon a time" + samples[0] + ".")
    direct = generate(url, {"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": 6, "n": 3, "temperature": 1.0, "sampling_seed": 7}})
    assert [d["text"] for d in direct] == samples
    assert len(state.get_meta_info("start")) == 3

    @rl.function
    def numbers(s):
        s += "Pick a number: " + rl.gen("x", dtype=int, n=2, max_tokens=3, temperature=1.0,
                                        seed=2)

    picked = numbers.run()["x"]
    assert len(picked) == 2 and all(re.fullmatch(r"-?[0-9]+", x) for x in picked)
    oa = rl.OpenAI("default", base_url=url + "/v1", api_key="unused")
    via_v1 = story.run(backend=oa)
    assert isinstance(via_v1["start"], list) and len(via_v1["start"]) == 3
    with pytest.raises(ValueError, match="n must be"):
        rl.gen("x", n=0)


def test_runtime_starts_and_stops_its_own_server():
    """rl.Runtime(...) starts `radixlm serve` with those settings, runs programs as a
    RuntimeEndpoint of it, and shutdown() stops it with its children."""
    from helpers import child_pids, is_alive

    runtime = rl.Runtime(max_total_tokens=4096, context_length=512, launch_timeout=600)
    try:
        assert runtime.get_server_info()["context_length"] == 512

        @rl.function
        def answer(s):
            s += "The capital of France is" + rl.gen("x", max_tokens=3, temperature=0)

        assert answer.run(backend=runtime)["x"]
        children = child_pids(runtime.process.pid)
        assert children
    finally:
        runtime.shutdown()
    assert runtime.process.poll() is not None
    assert not any(is_alive(pid) for pid in children)
    # Used after shutdown: the library's own error (httpx's closed client was a bare
    # RuntimeError, outside LangError)
    with pytest.raises(rl.BackendUnavailableError, match="has been shut down"):
        answer.run(backend=runtime)
    with pytest.raises(ValueError, match="--max-total-tokens"):
        rl.Runtime(max_total_tokens=-1)


def test_openai_backend_against_v1(url):
    if httpx.get(url + "/v1/models", timeout=10).status_code != 200:
        pytest.skip("the server's /v1 API is not there yet")
    oa = rl.OpenAI("default", base_url=url + "/v1", api_key="unused")

    @rl.function
    def plain(s):
        s += "The capital of France is" + rl.gen("x", max_tokens=3)
        s += rl.select("y", choices=[" Paris", " London"])

    @rl.function
    def chat(s):
        s += rl.user("Say hello.")
        s += rl.assistant(rl.gen("x", max_tokens=3))

    state = plain.run(backend=oa, temperature=0)
    assert state["x"] and state["y"] in (" Paris", " London")
    assert chat.run(backend=oa, temperature=0)["x"]


def test_endpoint_options_and_a_slow_answer(url):
    """SGLang's RuntimeEndpoint(chat_template_name=...) and get_model_name(); a request that
    outlives the client's timeout is reported as that, not as an unreachable server."""
    with pytest.raises(ValueError, match="chat_template_name"):
        rl.RuntimeEndpoint(url, chat_template_name="no-such-template")
    be = rl.RuntimeEndpoint(url, chat_template_name="llama-3-instruct", timeout=2.0)
    try:
        assert be.get_model_name() == httpx.get(url + "/get_model_info").json()["model_path"]

        @rl.function
        def chat(s):
            s += rl.user("Hi")
            s += rl.assistant(rl.gen("x", max_tokens=2))

        assert "<|start_header_id|>user<|end_header_id|>" in chat.run(backend=be).text()

        @rl.function
        def long(s):
            s += "Count:" + rl.gen("x", max_tokens=1500, ignore_eos=True)

        with pytest.raises(rl.BackendError, match="did not answer") as e:
            long.run(backend=be)
        assert not isinstance(e.value, rl.BackendUnavailableError)
    finally:
        be.shutdown()


def test_gen_after_the_server_died(server, backend):
    """Last: kills the module's server."""
    @rl.function
    def prog(s):
        s += "Hello" + rl.gen("a", max_tokens=2)

    stop_server(server[0], sig=signal.SIGKILL)
    with pytest.raises(rl.BackendUnavailableError, match="is it still running"):
        prog.run()
