"""The OpenAI-compatible API, end to end: a real `radixlm serve` subprocess on the bundled model,
driven by the official `openai` client (and raw HTTP for the malformed requests it refuses to
send). Set RADIXLM_TEST_SERVER_URL to reuse a server that is already running."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from helpers import (launch_server, openai_client, serve_app_in_thread,
                     stop_server)

openai = pytest.importorskip("openai")
try:
    import httpx
except ImportError:  # the openai client may bring its HTTP library under this name
    import httpx2 as httpx  # type: ignore[no-redef]

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server_url():
    if os.environ.get("RADIXLM_TEST_SERVER_URL"):
        yield os.environ["RADIXLM_TEST_SERVER_URL"].rstrip("/")
        return
    proc, url = launch_server(["--max-total-tokens", "8192", "--log-level", "warning"], 180)
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def client(server_url):
    return openai_client(server_url)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _check_usage(resp, max_tokens: int | None = None) -> None:
    """total = prompt + completion; a single choice that ran out of budget used all of it."""
    u = resp.usage
    assert u.prompt_tokens > 0 and u.prompt_tokens + u.completion_tokens == u.total_tokens
    if max_tokens is not None and resp.choices[0].finish_reason == "length":
        assert len(resp.choices) == 1 and u.completion_tokens == max_tokens


def _collect_stream(stream) -> tuple[dict[int, str], dict[int, list[str]], list]:
    """Joined text per choice index, the finish reasons seen per index, and usage chunks."""
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    usages = []
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usages.append(chunk.usage)
        for c in chunk.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] = texts.get(c.index, "") + piece
            if c.finish_reason is not None:
                finishes.setdefault(c.index, []).append(c.finish_reason)
    return texts, finishes, usages


# ---------------------------------------------------------------------------- models

def test_models(client, model):
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model" and models[0].owned_by == "radixlm"
    assert isinstance(models[0].created, int)
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


# ---------------------------------------------------------------------------- completions

def test_completion_greedy_stream_matches(client, model):
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert resp.model == model and isinstance(resp.created, int)
    choice = resp.choices[0]
    assert choice.index == 0 and choice.finish_reason in ("stop", "length") and choice.text
    _check_usage(resp, 8)

    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    texts, finishes, usages = _collect_stream(stream)
    assert texts == {0: choice.text}
    assert finishes == {0: [choice.finish_reason]}
    assert len(usages) == 1 and usages[0].total_tokens == resp.usage.total_tokens


def test_continuous_usage_stats(client, model):
    """stream_options.continuous_usage_stats (vLLM's): every chunk with output carries the
    usage so far, growing to the final usage chunk's."""
    for create, extra in ((client.completions.create, {"prompt": PROMPT}),
                          (client.chat.completions.create, {"messages": CHAT})):
        chunks = list(create(model=model, max_tokens=6, temperature=0, stream=True,
                             stream_options={"include_usage": True,
                                             "continuous_usage_stats": True},
                             extra_body={"ignore_eos": True}, **extra))
        with_output = [c for c in chunks if c.choices and c.usage is not None]
        counts = [c.usage.completion_tokens for c in with_output]
        assert len(counts) >= 3 and counts == sorted(counts) and counts[-1] == 6
        assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens > 0
                   for c in with_output)
        assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 6
        assert all(c.usage is not None for c in chunks)    # the role chunk's too (vLLM's)


def test_structural_tag_response_format(client, model):
    """response_format {"type": "structural_tag", ...} (SGLang's) constrains the answer; a
    malformed one is a 400 naming it."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    fmt = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<n>", "content": {"type": "json_schema", "json_schema": schema},
        "end": "</n>"}}
    resp = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24,
                                          temperature=0, response_format=fmt)
    body = re.fullmatch(r"<n>(.*)</n>", resp.choices[0].message.content, re.S)
    assert body and isinstance(json.loads(body.group(1))["n"], int)
    with pytest.raises(openai.BadRequestError, match="structural_tag"):
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, response_format={
            "type": "structural_tag", "triggers": ["<n>"]})


def test_response_formats_that_would_be_ignored_are_a_400(client, model):
    """A schema keyword the grammar cannot enforce, a json_schema without its name, or a
    field of another response_format type: each a 400 naming the field, not a 200 whose
    output breaks what was asked."""
    unique = {"type": "object", "properties": {"l": {"type": "array", "items": {
        "type": "integer"}, "uniqueItems": True}}, "required": ["l"]}
    bad = [({"type": "json_schema", "json_schema": {"name": "u", "schema": unique}},
            "uniqueItems"),
           ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "name"),
           ({"type": "text", "json_schema": {"name": "u", "schema": {"type": "object"}}},
            "for type json_schema"),
           ({"type": "json_object", "triggers": ["<a>"]}, "for type structural_tag")]
    for fmt, words in bad:
        with pytest.raises(openai.BadRequestError, match=words) as e:
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=4,
                                           response_format=fmt)
        assert e.value.body["param"].split(".")[0] in ("response_format", "json_schema")
    ok = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16,
                                        temperature=0, response_format={
                                            "type": "json_schema", "json_schema": {
                                                "name": "u", "schema": {"type": "object"}}})
    assert ok.choices[0].message.content.startswith("{")


def test_completion_length_counts(client, model):
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5


def test_completion_batch_and_n(client, model):
    prompts = ["One, two,", "Red, green,"]
    single = [client.completions.create(model=model, prompt=p, max_tokens=3, temperature=0)
              for p in prompts]
    resp = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=3,
                                     temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    # Prompt-major: choices 0, 1 answer prompt 0; greedy, so both equal the single answer.
    assert [c.text for c in resp.choices] == [single[0].choices[0].text] * 2 + \
        [single[1].choices[0].text] * 2
    assert resp.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)
    assert resp.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in single)
    _check_usage(resp)

    stream = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=3,
                                       temperature=0, stream=True)
    texts, finishes, _ = _collect_stream(stream)
    assert texts == {c.index: c.text for c in resp.choices}
    assert sorted(finishes) == [0, 1, 2, 3] and all(len(f) == 1 for f in finishes.values())


def test_completion_token_id_prompts(client, model, tokenizer):
    ids = tokenizer(PROMPT).input_ids
    by_text = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    batch = client.completions.create(model=model, prompt=[ids, ids], max_tokens=4,
                                      temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert [c.text for c in batch.choices] == [by_text.choices[0].text] * 2
    assert by_ids.usage.prompt_tokens == len(ids)


def test_completion_logprobs(client, model):
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                     logprobs=3)
    lp = resp.choices[0].logprobs
    n = resp.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert len(lp.text_offset) == n and lp.text_offset == sorted(lp.text_offset)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and 1 <= len(top) <= 4 and all(v <= 0 for v in top.values())
        assert top[token] == value == max(top.values())  # greedy picks the top-1


def test_completion_logprobs_of_split_characters(client, model, tokenizer):
    """A character in two tokens (the emoji): each piece is named by its bytes (as chat names
    it), every top_logprobs keeps its distinct alternatives, and text_offset points into the
    text: each token at the character it starts or continues, the pieces joined giving it."""
    prompt = "Café 😀 is"
    ids = tokenizer(prompt).input_ids
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids), "no split character"
    for stream in (False, True):
        kwargs = dict(model=model, prompt=prompt, max_tokens=2, temperature=0, echo=True,
                      logprobs=5)
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks)
            lps = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
            tokens = sum((lp.tokens for lp in lps), [])
            offsets = sum((lp.text_offset for lp in lps), [])
            tops = sum((lp.top_logprobs for lp in lps), [])
        else:
            choice = client.completions.create(**kwargs).choices[0]
            text, lp = choice.text, choice.logprobs
            tokens, offsets, tops = lp.tokens, lp.text_offset, lp.top_logprobs
        pieces = [t for t in tokens if t.startswith("bytes:")]
        assert len(pieces) >= 2 and "\ufffd" not in "".join(tokens), tokens
        for token, at in zip(tokens, offsets):
            if not token.startswith("bytes:"):
                assert text[at:at + len(token)] == token, (token, at, text)
        assert offsets == sorted(offsets) and offsets[-1] < len(text)
        # the emoji's pieces point at it (the first at the space it starts with, here)
        emoji_at = text.index("😀")
        piece_at = [at for t, at in zip(tokens, offsets) if t.startswith("bytes:")]
        assert piece_at[-1] == emoji_at and emoji_at - 1 <= piece_at[0] <= emoji_at, piece_at
        assert all(top is None or len(top) >= 5 for top in tops), tops


def test_completion_echo(client, model):
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0)
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                     echo=True, logprobs=1)
    choice = resp.choices[0]
    assert choice.text == PROMPT + plain.choices[0].text
    lp = choice.logprobs
    assert len(lp.tokens) == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens[:resp.usage.prompt_tokens]) == PROMPT
    # Scoring a prompt without generating: max_tokens 0 with echo.
    score = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True,
                                      logprobs=0)
    assert score.choices[0].text == PROMPT and score.usage.completion_tokens == 0
    assert score.choices[0].logprobs.token_logprobs[1:] == \
        pytest.approx(lp.token_logprobs[1:resp.usage.prompt_tokens], abs=1e-4)

    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                       echo=True, stream=True)
    assert _collect_stream(stream)[0] == {0: choice.text}


def test_completion_stop(client, model):
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base.strip().split()[1]  # a word from the middle of the greedy answer
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                     stop=[stop, "never-seen"])
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and stop not in choice.text
    assert base.startswith(choice.text)
    # vLLM's include_stop_str_in_output (SGLang's no_stop_trim) keeps the stop in the text
    for extra in ({"include_stop_str_in_output": True}, {"no_stop_trim": True}):
        kept = client.completions.create(model=model, prompt=PROMPT, max_tokens=8,
                                         temperature=0, stop=[stop], extra_body=extra)
        assert kept.choices[0].text.endswith(stop) and base.startswith(kept.choices[0].text)
    kept = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8,
                                          temperature=0, stop=["e"],
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content.endswith("e"), kept.choices[0].message.content


def test_an_empty_completion_prompt_is_named(client, model):
    for prompt in ("", ["a", ""], [[]]):
        with pytest.raises(openai.BadRequestError, match="prompt must not be empty"):
            client.completions.create(model=model, prompt=prompt, max_tokens=1)


# ---------------------------------------------------------------------------- chat

def test_chat_greedy_stream_matches(client, model):
    resp = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8,
                                          temperature=0, seed=1)
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    _check_usage(resp, 8)

    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    texts, finishes, usages = _collect_stream(chunks)
    assert texts == {0: choice.message.content}
    assert finishes == {0: [choice.finish_reason]}
    assert len(usages) == 1
    assert (usages[0].prompt_tokens, usages[0].completion_tokens, usages[0].total_tokens) == \
        (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens)


def test_chat_n_stream(client, model):
    resp = client.chat.completions.create(model=model, messages=CHAT, n=2, max_tokens=4,
                                          temperature=0.8, seed=7,
                                          extra_body={"ignore_eos": True})
    assert [c.index for c in resp.choices] == [0, 1]
    assert [c.finish_reason for c in resp.choices] == ["length", "length"]
    assert resp.usage.completion_tokens == 2 * 4  # summed over choices
    _check_usage(resp)
    stream = client.chat.completions.create(model=model, messages=CHAT, n=2, max_tokens=4,
                                            temperature=0.8, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    roles = {c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role}
    assert roles == {0, 1}
    _, finishes, usages = _collect_stream(chunks)
    assert sorted(finishes) == [0, 1] and all(len(f) == 1 for f in finishes.values())
    assert len(usages) == 1 and usages[0].prompt_tokens == resp.usage.prompt_tokens


def test_chat_logprobs(client, model):
    resp = client.chat.completions.create(model=model, messages=CHAT, max_tokens=5,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert entry.logprob <= 0 and len(tops) == 2 and tops == sorted(tops, reverse=True)
        assert entry.logprob == pytest.approx(tops[0]) and entry.token == entry.top_logprobs[0].token
        assert bytes(entry.bytes).decode("utf-8", "replace")
    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=5,
                                            temperature=0, logprobs=True, top_logprobs=2,
                                            stream=True)
    streamed = [e for c in stream for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_chat_uses_template(client, model, tokenizer):
    """Chat = completions on the rendered template; continue_final_message continues it."""
    for messages, kwargs in (
            (CHAT, {"add_generation_prompt": True}),
            (CHAT + [{"role": "assistant", "content": "Red, blue"}],
             {"add_generation_prompt": False, "continue_final_message": True})):
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        plain = client.completions.create(model=model, prompt=text, max_tokens=5,
                                          temperature=0)
        chat = client.chat.completions.create(
            model=model, messages=messages, max_tokens=5, temperature=0,
            extra_body={"continue_final_message": kwargs.get("continue_final_message", False)})
        assert chat.choices[0].message.content == plain.choices[0].text
        assert chat.usage.prompt_tokens == plain.usage.prompt_tokens


def test_chat_add_generation_prompt_false(client, model, tokenizer):
    """vLLM's add_generation_prompt=False renders the conversation without opening the
    assistant's turn; `modalities: ["text"]` is what is served anyway."""
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)
    plain = client.completions.create(model=model, prompt=text, max_tokens=4, temperature=0)
    chat = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=4, temperature=0, modalities=["text"],
        extra_body={"add_generation_prompt": False})
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.choices[0].message.content == plain.choices[0].text
    opened = client.chat.completions.create(model=model, messages=CHAT, max_tokens=1)
    assert opened.usage.prompt_tokens > chat.usage.prompt_tokens
    # The same through chat_template_kwargs (as vLLM takes it); keys the server sets: a 400
    via_kwargs = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=1,
        extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert via_kwargs.usage.prompt_tokens == chat.usage.prompt_tokens
    for key in ("tools", "messages"):
        with pytest.raises(openai.BadRequestError, match=f"'{key}' is set by the server"):
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=1,
                                           extra_body={"chat_template_kwargs": {key: []}})


def test_response_names_the_requested_model(client, model):
    """As SGLang: the one model is served under any name, and the response names the model
    the request asked for."""
    resp = client.chat.completions.create(model="my-alias", messages=CHAT, max_tokens=1)
    assert resp.model == "my-alias"
    assert client.completions.create(model=model, prompt="x", max_tokens=1).model == model


def test_min_tokens_ignores_stops_before_it(client, model):
    """A stop string in the first min_tokens tokens is not a match: the answer goes on to
    the next one (as in SGLang and vLLM), streamed or not."""
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0]
    tokens = client.completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                       temperature=0, logprobs=0,
                                       extra_body={"ignore_eos": True}).choices[0].logprobs.tokens
    stop = tokens[1]          # the second token's text: inside the first min_tokens
    assert base.text.startswith(tokens[0] + stop)
    # The first occurrence ending in token 4 or later (past the first three tokens' text).
    boundary = len("".join(tokens[:3]))
    later = base.text.find(stop, max(0, boundary - len(stop) + 1))
    want = base.text if later < 0 else base.text[:later]
    for stream in (False, True):
        kwargs = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop],
                      extra_body={"min_tokens": 4, "ignore_eos": True}, stream=stream)
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(**kwargs)
                           if c.choices)
        else:
            text = client.completions.create(**kwargs).choices[0].text
        assert text == want, (stop, text, want)


def test_chat_content_parts_and_roles(client, model):
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    as_str = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    a = client.chat.completions.create(model=model, messages=parts, max_tokens=3, temperature=0)
    b = client.chat.completions.create(model=model, messages=as_str, max_tokens=3, temperature=0,
                                       response_format={"type": "text"})
    assert a.choices[0].message.content == b.choices[0].message.content


def test_tools_need_a_parser_on_a_template_without_tools(client, model):
    """SmolLM2's template ignores `tools` and this server has no --tool-call-parser: asking for
    tools is a 400 that says so (not a silent plain answer); tool_choice "none" is fine."""
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
            client.chat.completions.create(model=model, messages=CHAT, tools=tools,
                                           tool_choice=choice, max_tokens=2)
    ok = client.chat.completions.create(model=model, messages=CHAT, tools=tools,
                                        tool_choice="none", max_tokens=2)
    assert ok.choices[0].message.tool_calls is None and ok.choices[0].message.content


def test_cached_tokens_in_usage(client, model):
    """usage.prompt_tokens_details.cached_tokens: the second request with a long shared prefix
    finds it in the radix cache (non-streamed and in the streamed usage chunk)."""
    prompt = "Once upon a time, " * 40
    first = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    again = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens
    assert again.usage.prompt_tokens - 1 <= again.usage.prompt_tokens_details.cached_tokens \
        < again.usage.prompt_tokens
    messages = [{"role": "user", "content": prompt}]
    client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1 > 100


# ---------------------------------------------------------------------------- errors

BAD_REQUESTS = [
    ("completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ("completions", {"prompt": "x", "temperature": 2.5}, "temperature"),
    ("completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("completions", {"prompt": "x", "n": 0}, "n"),
    ("completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("completions", {"prompt": "x", "best_of": 2}, "best_of"),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("completions", {"prompt": "x", "stop_token_ids": [10 ** 9]}, "stop_token_ids"),
    ("completions", {"prompt": "x", "stream": True, "stop_token_ids": [10 ** 9]},
     "stop_token_ids"),  # raised by the engine when the stream starts: still a 400
    ("completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("completions", {"prompt": [1] * 9000}, "prompt"),  # longer than the context
    ("completions", {"prompt": []}, "prompt"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("chat/completions", {"messages": CHAT, "top_logprobs": 21, "logprobs": True},
     "top_logprobs"),
    ("chat/completions", {"messages": CHAT, "top_logprobs": 2}, "logprobs"),
    ("chat/completions", {"messages": CHAT, "stream": True, "temperature": -1}, "temperature"),
    ("chat/completions", {"messages": CHAT, "continue_final_message": True},
     "continue_final_message"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "content"),
    # Known fields that would change the answer and are not implemented: refused, not ignored.
    ("completions", {"prompt": "x", "return_hidden_states": True}, "return_hidden_states"),
    ("chat/completions", {"messages": CHAT, "lora_path": "adapter"}, "lora_path"),
    ("chat/completions", {"messages": CHAT, "modalities": ["text", "audio"]}, "modalities"),
    ("chat/completions", {"messages": CHAT, "audio": {"voice": "alloy", "format": "wav"}},
     "audio"),
    ("chat/completions", {"messages": CHAT, "functions": [{"name": "f", "parameters": {}}]},
     "functions"),
    ("chat/completions", {"messages": CHAT, "function_call": "auto"}, "function_call"),
    ("chat/completions", {"messages": CHAT, "web_search_options": {}}, "web_search_options"),
    ("chat/completions", {"messages": CHAT, "chat_template": "{{ 'X' }}"}, "chat_template"),
    ("chat/completions", {"messages": CHAT, "echo": True}, "echo"),
]


@pytest.mark.parametrize("path,body,field", BAD_REQUESTS,
                         ids=[f"{p}-{f}-{i}" for i, (p, _, f) in enumerate(BAD_REQUESTS)])
def test_bad_request(server_url, path, body, field):
    r = httpx.post(f"{server_url}/v1/{path}", json={"model": "m", **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert field in err["message"] and err["type"] == "invalid_request_error"
    if err["param"] is not None:  # set where one field is to blame
        assert err["param"].split(".")[0] in field or field in err["param"]


EXACT_PARAMS = [
    # union fields: the field, not pydantic's member tags (`stop.str`, `rid.constrained-str`)
    ("chat/completions", {"messages": CHAT, "stop": 5}, "stop"),
    ("chat/completions", {"messages": CHAT, "tool_choice": "sometimes"}, "tool_choice"),
    ("chat/completions", {"messages": CHAT, "rid": ""}, "rid"),
    ("chat/completions", {"messages": CHAT, "json_schema": 5}, "json_schema"),
    ("completions", {"prompt": [True]}, "prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    # every message but an assistant's needs its content (a null one rendered an empty turn)
    ("chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages.0"),
    ("chat/completions", {"messages": [*CHAT, {"role": "tool", "tool_call_id": "c"}]},
     "messages.1"),
    # checks past pydantic's: still the field the request used
    ("chat/completions", {"messages": CHAT, "chat_template_kwargs": {"messages": []}},
     "chat_template_kwargs"),
    ("completions", {"prompt": [10 ** 9]}, "prompt"),
    ("completions", {"prompt": ["a", "b"], "rid": ["d", "d"]}, "rid"),
    ("chat/completions", {"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format"),
]


@pytest.mark.parametrize("path,body,param", EXACT_PARAMS,
                         ids=[f"{p}-{f}-{i}" for i, (p, _, f) in enumerate(EXACT_PARAMS)])
def test_the_error_param_is_the_request_field(server_url, path, body, param):
    r = httpx.post(f"{server_url}/v1/{path}", json={"model": "m", "max_tokens": 2, **body},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "prompt" in r.json()["error"]["message"] if param == "prompt" else True


def test_a_non_finite_number_names_its_field(server_url):
    body = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    r = httpx.post(f"{server_url}/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text


def test_null_means_unset(client, model):
    """OpenAI's nullable fields ("boolean or null"): the official client sends None as null."""
    plain = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4,
                                           temperature=0)
    nulls = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, n=None,
                                           temperature=0,
                                           stream=None, logprobs=None,
                                           extra_body={"ignore_eos": None})
    assert len(nulls.choices) == 1 and nulls.choices[0].logprobs is None
    assert nulls.choices[0].message.content == plain.choices[0].message.content
    out = client.completions.create(model=model, prompt="Hi", max_tokens=3, echo=None, n=None)
    assert len(out.choices) == 1 and not out.choices[0].text.startswith("Hi")


def test_malformed_json_then_good_request(server_url, client, model):
    r = httpx.post(f"{server_url}/v1/chat/completions", content=b'{"messages": [',
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", max_tokens=-1)
    ok = client.completions.create(model=model, prompt=PROMPT, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_stream_disconnect_aborts(server_url):
    body = {"messages": CHAT, "max_tokens": 4000, "stream": True,
            "unknown_field": 1, "ignore_eos": True}
    with httpx.stream("POST", f"{server_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
    # The abandoned request is aborted, not left generating 4000 tokens.
    deadline = time.monotonic() + 20
    while True:
        info = httpx.get(f"{server_url}/get_server_info", timeout=10).json()
        if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            break
        assert time.monotonic() < deadline, "the disconnected stream kept running"
        time.sleep(0.2)


def test_stream_error_is_http_error_before_streaming(server_url):
    r = httpx.post(f"{server_url}/v1/completions",
                   json={"prompt": [1] * 9000, "stream": True}, timeout=60)
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    body = {"prompt": PROMPT, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{server_url}/v1/completions", json=body, timeout=60) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert all("choices" in json.loads(e[6:]) for e in events[:-1])


# ---------------------------------------------------------------------------- fake engine

class _FakeEngine:
    """Stands in for Engine to produce failures a real model cannot be made to produce on
    demand: an error in the middle of a stream, and an aborted sequence."""

    def __init__(self, tokenizer):
        from types import SimpleNamespace
        self.tokenizer = tokenizer
        self.ready = SimpleNamespace(context_len=2048, model_path="/models/fake-model")
        self.model_sampling_defaults: dict = {}     # (--sampling-defaults: none to apply)
        self.closed = False

    @staticmethod
    def _out(text: str, finish: dict | None) -> dict:
        return {"text": text, "output_ids": [], "index": 0,
                "meta_info": {"id": "r", "finish_reason": finish, "prompt_tokens": 3,
                              "completion_tokens": len(text)}}

    async def async_generate(self, stream: bool = False, **kwargs):
        if not stream:
            return [self._out("partial", {"type": "abort", "matched": None,
                                          "message": "out of KV cache memory for this request",
                                          "status_code": 400})]

        async def gen():
            try:
                yield self._out("Hel", None)
                raise RuntimeError("the scheduler fell over")
            finally:
                self.closed = True
        return gen()


@pytest.fixture
def fake_server(tokenizer):
    from radixlm.config import ServerArgs

    engine = _FakeEngine(tokenizer)
    for url in serve_app_in_thread(engine, ServerArgs(model_path="/models/fake-model")):
        yield url, engine


def test_midstream_error_and_abort(fake_server):
    url, engine = fake_server
    body = {"messages": CHAT, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "fell over" in error["message"] and error["code"] == 500
    assert json.loads(events[1])["choices"][0]["delta"] == {"content": "Hel"}
    assert engine.closed
    # OpenAI has no "abort" finish reason: an aborted sequence fails the request.
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 400 and "KV cache" in r.json()["error"]["message"]
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == "fake-model"
