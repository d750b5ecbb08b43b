"""API speculative execution (`@function(num_api_spec_tokens=N)`) through the OpenAI backend
against a real `radixlm serve`'s /v1, counting the HTTP requests the official client sends
(an httpx event hook on the client the backend is given): with speculation a template the
model follows costs fewer calls and yields the same values as separate calls (greedy); a
template it does not follow falls back to normal calls with the same values. On the chat
endpoint, an assistant message made of text and several gens is written by one call."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

import radixlm as rl

from helpers import start_server, stop_server

CONTEXT = ("Here are three people.\n"
           "name: Marie Curie\njob: physicist\n"
           "name: Louis Armstrong\njob: trumpeter\n")


@pytest.fixture(scope="module")
def url():
    proc, base = start_server("--max-total-tokens", "8192")
    yield base
    stop_server(proc)


class CountingOpenAI:
    """An OpenAI backend whose HTTP requests are counted by endpoint path."""

    def __init__(self, url: str):
        self.calls: Counter[str] = Counter()
        client = httpx.Client(event_hooks={"request": [self._count]}, timeout=300)
        self.backend = rl.OpenAI("default", base_url=url + "/v1", api_key="unused",
                                 http_client=client)

    def _count(self, request: httpx.Request) -> None:
        self.calls[request.url.path] += 1


def character_program(second_field: str, spec_tokens: int | None):
    @rl.function(num_api_spec_tokens=spec_tokens)
    def gen_character(s):
        s += CONTEXT + "name:" + rl.gen("name", stop="\n") \
            + "\n" + second_field + ":" + rl.gen(second_field, stop="\n")
    return gen_character


def run_counted(url: str, program) -> tuple[int, rl.ProgramState]:
    counted = CountingOpenAI(url)
    state = program.run(backend=counted.backend, temperature=0, max_new_tokens=12)
    return counted.calls["/v1/completions"], state


def test_template_followed_saves_calls(url):
    calls, plain = run_counted(url, character_program("job", None))
    assert calls == 2
    calls, spec = run_counted(url, character_program("job", 20))
    assert calls == 1                                # one call produced both fields
    assert plain["name"].strip() and plain["job"].strip()
    assert (spec["name"], spec["job"]) == (plain["name"], plain["job"])
    assert spec.text() == plain.text()
    assert spec.get_meta_info("name")["speculative_call"] is True
    assert spec.get_meta_info("job")["speculative"] is True    # answered without a call


def test_template_not_followed_falls_back(url):
    # The examples have a job after each name, the program asks for an age: the speculative
    # text ("\njob: ...") does not match "\nage:", so the age makes its own call.
    calls, plain = run_counted(url, character_program("age", None))
    assert calls == 2
    calls, spec = run_counted(url, character_program("age", 20))
    assert calls == 2
    assert (spec["name"], spec["age"]) == (plain["name"], plain["age"])
    assert "speculative" not in spec.get_meta_info("age")      # it had a call of its own


def test_chat_programs_make_their_usual_calls(url):
    @rl.function(num_api_spec_tokens=64)
    def multi_turn(s):
        s += rl.user("Say hi.")
        s += rl.assistant(rl.gen("answer_1", max_tokens=3))
        s += rl.user("Say bye.")
        s += rl.assistant(rl.gen("answer_2", max_tokens=3))

    counted = CountingOpenAI(url)
    state = multi_turn.run(backend=counted.backend, temperature=0)
    assert counted.calls["/v1/chat/completions"] == 2
    assert state["answer_1"] and state["answer_2"]


@rl.function(num_api_spec_tokens=16)
def character_chat(s):
    s += rl.system("You write characters in the format shown.")
    s += rl.user("Make a character.")
    s += rl.assistant("Name: Ada Lovelace\nJob: mathematician")
    s += rl.user("Make another character.")
    s += rl.assistant("Name: Louis Armstrong\nJob: trumpeter")
    s += rl.user("Make another character.")
    s += rl.assistant("Name:" + rl.gen("name", stop="\n") + "\nJob:" + rl.gen("job", stop="\n"))


def test_chat_message_with_several_gens_in_one_call(url):
    counted = CountingOpenAI(url)
    state = character_chat.run(backend=counted.backend, temperature=0)
    assert counted.calls["/v1/chat/completions"] == 1
    assert state["name"].strip() and state["job"].strip()
    assert state.messages()[-1] == {"role": "assistant",
                                    "content": "Name:" + state["name"] + "\nJob:" + state["job"]}
    # Without speculation a chat endpoint cannot continue the half-written message at all.
    plain = rl.function(character_chat.func)
    with pytest.raises(rl.UnsupportedByBackendError, match="assistant"):
        plain.run(backend=counted.backend, temperature=0)
