"""OpenAI's Responses API through the official client against a real server (the bundled model
on the CPU): the answer equals the chat completion of the same conversation, streams give the
same text through the documented events, previous_response_id continues a stored conversation,
text.format constrains the output, and what the server cannot do is a 400."""

from __future__ import annotations

import json

import pytest

from helpers import launch_server, openai_client, stop_server

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client():
    proc, url = launch_server(["--device", "cpu", "--max-total-tokens", "8192",
                               "--tool-call-parser", "qwen25", "--log-level", "warning"], 180)
    try:
        yield openai_client(url)
    finally:
        stop_server(proc)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="m", messages=messages, temperature=0, **kw)


def test_response_equals_the_chat_completion(client):
    resp = client.responses.create(model="m", input="Name three colors.",
                                   instructions="Answer briefly.", max_output_tokens=12,
                                   temperature=0)
    chat = _chat(client, [{"role": "system", "content": "Answer briefly."},
                          {"role": "user", "content": "Name three colors."}], max_tokens=12)
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == chat.choices[0].message.content
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    want = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert resp.status == want
    if want == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(resp.id).output_text == resp.output_text


def test_stream_events_give_the_same_text(client):
    kw = dict(model="m", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Count to five."}]}], max_output_tokens=10, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = [e for e in events if e.type == "response.output_text.done"]
    assert done and done[0].text == text
    assert events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model="m", input="My name is Ada.", max_output_tokens=6,
                                    temperature=0)
    second = client.responses.create(model="m", input="What is my name?",
                                     previous_response_id=first.id, max_output_tokens=6,
                                     temperature=0)
    chat = _chat(client, [{"role": "user", "content": "My name is Ada."},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "What is my name?"}], max_tokens=6)
    assert second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    # Instructions are not carried over to the next response (OpenAI's rule).
    briefed = client.responses.create(model="m", input="Hi", instructions="Talk like a pirate.",
                                      max_output_tokens=4, temperature=0)
    after = client.responses.create(model="m", input="Ok", previous_response_id=briefed.id,
                                    max_output_tokens=4, temperature=0)
    plain = _chat(client, [{"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": briefed.output_text},
                           {"role": "user", "content": "Ok"}], max_tokens=4)
    assert after.usage.input_tokens == plain.usage.prompt_tokens
    # Only background responses can be cancelled (OpenAI's rule; there are none here)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(first.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="Hi", previous_response_id=first.id)
    unstored = client.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    resp = client.responses.create(
        model="m", input="Give a city as JSON.", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                         "strict": True}})
    assert set(json.loads(resp.output_text)) == {"city"}
    assert resp.text.format.type == "json_schema"


def test_what_the_server_cannot_do_is_a_400(client):
    for kw, param in ((dict(tools=[{"type": "web_search"}]), "tools"),
                      (dict(background=True), "background"),
                      (dict(include=["file_search_call.results"]), "include"),
                      (dict(input=[{"type": "input_image", "image_url": "x"}]), "input"),
                      (dict(previous_response_id=["x"]), "previous_response_id"),
                      (dict(metadata={"a": 1}), "metadata"), (dict(store="no"), "store"),
                      (dict(reasoning={"effort": "high"}), "reasoning"),
                      (dict(tool_choice="required"), "tool_choice"),
                      (dict(input=[{"type": "function_call", "name": "f"}]), "input"),
                      (dict(input=[{"role": "user", "content": [{"type": "input_text"}]}]),
                       "input"),
                      (dict(extra_body={"max_tokens": 5}), "max_tokens"),   # (a chat field)
                      (dict(extra_body={"context_management": [{"type": "compaction"}]}),
                       "context_management")):
        kw.setdefault("input", "Hi")
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", **kw)
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="Hi", max_output_tokens=-1)
    assert e.value.body["param"] == "max_output_tokens"
    assert client.responses.create(model="m", input="Hi", max_output_tokens=2).status
    # Hints with nothing to do here are taken (prompt caching is automatic, no built-in tools)
    hinted = client.responses.create(model="m", input="Hi", max_output_tokens=2,
                                     prompt_cache_key="k", safety_identifier="u1",
                                     service_tier="auto", max_tool_calls=1,
                                     extra_body={"top_k": 5, "chat_template_kwargs": {}})
    assert hinted.prompt_cache_key == "k" and hinted.max_tool_calls == 1


def test_function_tools_become_function_call_items(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]
    resp = client.responses.create(model="m", input="Weather in Paris?", tools=tools,
                                   tool_choice="required", max_output_tokens=40, temperature=0)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    # The call's result goes back as a function_call_output item.
    follow = client.responses.create(
        model="m", previous_response_id=resp.id, max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny"}])
    assert follow.status in ("completed", "incomplete") and follow.output[0].type == "message"
    events = list(client.responses.create(model="m", input="Weather in Paris?", tools=tools,
                                          tool_choice="required", max_output_tokens=40,
                                          temperature=0, stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert added[0].type == "function_call" and added[0].name == "get_weather"
    args = "".join(e.delta for e in events
                   if e.type == "response.function_call_arguments.delta")
    assert args == calls[0].arguments


def test_logprobs_whole_and_streamed(client):
    """include=["message.output_text.logprobs"] gives the output_text's token logprobs (with
    top_logprobs alternatives), whole and in the stream's deltas, the same for both."""
    kw = dict(model="m", input="Say hello.", max_output_tokens=8, temperature=0,
              include=["message.output_text.logprobs"], top_logprobs=2)
    whole = client.responses.create(**kw)
    logprobs = whole.output[0].content[0].logprobs
    assert len(logprobs) == whole.usage.output_tokens
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in logprobs)
    assert "".join(lp.token for lp in logprobs).startswith(whole.output_text)
    events = list(client.responses.create(stream=True, **kw))
    streamed = [lp for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in done.logprobs][:len(streamed)]
    assert [round(lp.logprob, 3) for lp in done.logprobs] == [round(lp.logprob, 3)
                                                             for lp in logprobs]
    plain = client.responses.create(model="m", input="Say hello.", max_output_tokens=4)
    assert plain.output[0].content[0].logprobs == []
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="Hi", top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"


def test_input_items_list_in_pages(client):
    items = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
             {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Name a fruit."}]
    resp = client.responses.create(model="m", input=items, max_output_tokens=3)
    listed = client.responses.input_items.list(resp.id)
    assert [i.type for i in listed.data] == ["message"] * 4
    assert [i.role for i in listed.data] == ["user", "assistant", "user", "system"]  # newest 1st
    assert listed.data[0].content[0].type == "input_text"
    assert listed.data[0].content[0].text == "Name a fruit."
    assert listed.data[1].content[0].type == "output_text"
    assert not listed.has_more and listed.first_id == listed.data[0].id
    first = client.responses.input_items.list(resp.id, order="asc", limit=3)
    assert [i.role for i in first.data] == ["system", "user", "assistant"] and first.has_more
    rest = client.responses.input_items.list(resp.id, order="asc", after=first.last_id)
    assert [i.id for i in first.data + rest.data] == [i.id for i in reversed(listed.data)]
    assert not rest.has_more
    follow = client.responses.create(model="m", input="And a color?", max_output_tokens=3,
                                     previous_response_id=resp.id)
    assert [i.content[0].text for i in client.responses.input_items.list(follow.id).data] \
        == ["And a color?"]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.input_items.list(resp.id, limit=0)
    assert e.value.body["param"] == "limit"
    with pytest.raises(openai.BadRequestError) as e:     # (no background mode to replay)
        client.responses.retrieve(resp.id, stream=True)
    assert e.value.body["param"] == "stream"


def test_chat_errors_name_the_responses_fields(client):
    """An error the chat handler finds names the field the Responses request used."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="Hi", text={"format": {"type": "json_object"}},
                                extra_body={"regex": "a+"})
    assert e.value.body["param"] == "text.format"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="word " * 9000)
    assert e.value.body["param"] == "input"


def test_a_cut_answer_is_incomplete_streamed_or_not(client):
    """max_output_tokens, or an abort (POST /abort_request): the Response is incomplete, and
    so is its message item, in the stream's output_item.done too (a cut answer must not be
    stored, nor continued by previous_response_id, as a complete one)."""
    import threading
    import time

    import httpx

    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    events = list(client.responses.create(model="m", input="Count to fifty.", stream=True,
                                          max_output_tokens=3, temperature=0))
    item_done = [e for e in events if e.type == "response.output_item.done"]
    assert events[-1].type == "response.incomplete" and item_done[-1].item.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"

    rid = "responses-abort-test"
    threading.Thread(target=lambda: (time.sleep(1.0), httpx.post(
        f"{base}/abort_request", json={"rid": rid}, timeout=30))).start()
    resp = httpx.post(f"{base}/v1/responses", timeout=120, json={
        "model": "m", "input": "Write a long story about a dragon.", "rid": rid,
        "max_output_tokens": 2000, "temperature": 0}).json()
    assert resp["status"] == "incomplete", resp
    assert resp["incomplete_details"] == {"reason": "cancelled"}
    assert resp["output"][0]["status"] == "incomplete"
    assert client.responses.retrieve(resp["id"]).status == "incomplete"


def test_chat_chunks_split_events_at_newlines_only():
    """U+2028 / U+2029 / U+0085 inside a chunk's JSON (unescaped) are not line ends: the
    Responses stream once died mid-body on them."""
    import asyncio

    from fastapi.responses import StreamingResponse

    from radixlm.entrypoints.openai.responses_stream import _chat_chunks

    texts = ["A\u2028B", "C\u2029D\u0085E"]

    async def body():
        for t in texts:
            yield "data: " + json.dumps({"t": t}, ensure_ascii=False) + "\n\n"
        yield "data: [DONE]\n\n"

    async def read():
        return [c async for c in _chat_chunks(StreamingResponse(body()))]

    assert [c["t"] for c in asyncio.run(read())] == texts


def test_errors_name_the_responses_fields(client):
    import httpx

    base = str(client.base_url).rstrip("/").removesuffix("/v1")

    def error(raw: str) -> dict:
        r = httpx.post(f"{base}/v1/responses", content=raw, timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        return r.json()["error"]

    assert error('{"input": "Hi", "temperature": NaN}')["param"] == "temperature"
    flat = error('{"input": "Hi", "tools": [{"type": "function"}]}')
    assert flat["param"] == "tools.0.name" and "function" not in flat["message"], flat
    choice = error('{"input": "Hi", "tool_choice": "sometimes"}')
    assert choice["param"] == "tool_choice" and "sometimes" in choice["message"]
    fmt = error('{"input": "Hi", "text": {"format": {"type": "xml"}}}')
    assert fmt["param"] == "text.format"
