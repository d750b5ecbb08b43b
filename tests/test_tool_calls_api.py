"""Tool calling and reasoning on /v1/chat/completions, end to end: a real `radixlm serve` with
`--tool-call-parser qwen25 --reasoning-parser qwen3` on the bundled SmolLM2 (whose template
ignores tools, so the server describes them in a system prompt), driven by the official openai
client. SmolLM2 is too small to call tools on its own, so where a test needs a call it either
forces one (tool_choice required / named: the grammar path) or steers the output with a regex
(to exercise the parser on the "auto" path)."""

from __future__ import annotations

import json

import pytest

from helpers import openai_client, start_server, stop_server

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")
try:
    import httpx
except ImportError:  # the openai client may bring its HTTP library under this name
    import httpx2 as httpx  # type: ignore[no-redef]

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "Current weather in a city"}},
         {"type": "function", "function": {"name": "add", "parameters": ADD,
                                           "description": "Add two integers"}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# Steers the model into a Hermes call without forcing it through tool_choice.
CALL_REGEX = (r'Let me check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
              r'\{"city": "(Paris|London)", "unit": "celsius"\}\}\n</tool_call>')


@pytest.fixture(scope="module")
def server_url():
    proc, url = start_server("--max-total-tokens", "8192", "--tool-call-parser", "qwen25",
                             "--reasoning-parser", "qwen3")
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def client(server_url):
    return openai_client(server_url, timeout=300)


def _check_calls(choice, allowed: set[str], single: bool = True) -> list:
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and calls and (len(calls) == 1 or not single)
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return calls


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "add"}},
    {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_is_valid(client, tool_choice):
    """Sampled at temperature 1, every choice is one well-formed call to an allowed function
    whose arguments validate against its schema."""
    resp = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                          tool_choice=tool_choice,
                                          n=3 if tool_choice == "required" else 1,
                                          temperature=1.0, seed=3, max_tokens=80)
    allowed = set(SCHEMAS) if tool_choice == "required" else {tool_choice["function"]["name"]}
    for choice in resp.choices:
        _check_calls(choice, allowed)
        assert not choice.message.content


def test_required_with_parallel_tool_calls(client):
    """parallel_tool_calls true lets a forced answer hold several calls, each valid, and the
    stream numbers them by index; the same request with false returns one call."""
    kwargs = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", n=4,
                  temperature=0.7, seed=5, max_tokens=200)
    several = client.chat.completions.create(parallel_tool_calls=True, **kwargs)
    counts = [len(_check_calls(c, set(SCHEMAS), single=False)) for c in several.choices
              if c.finish_reason == "tool_calls"]
    assert counts and max(counts) >= 2
    for choice in client.chat.completions.create(parallel_tool_calls=False, **kwargs).choices:
        _check_calls(choice, set(SCHEMAS))
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(parallel_tool_calls=True, stream=True,
                                                **{**kwargs, "n": 1, "seed": 5}):
        for c in chunk.choices:
            for call in c.delta.tool_calls or []:
                streamed.setdefault(call.index, "")
                streamed[call.index] += call.function.arguments or ""
    assert streamed and list(streamed) == list(range(len(streamed)))
    for args in streamed.values():
        json.loads(args)


def test_call_cut_by_max_tokens_streamed_and_not(client):
    """A forced call cut at max_tokens: finish_reason "length", the call as far as it got in
    tool_calls, and no raw call text in content, streamed or not."""
    kwargs = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                  max_tokens=14)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "length" and not whole.message.content
    (call,) = whole.message.tool_calls
    content, args, names, reasons = "", "", [], []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasons.append(c.finish_reason)
            for piece in c.delta.tool_calls or []:
                names += [piece.function.name] if piece.function.name else []
                args += piece.function.arguments or ""
    assert content == "" and names == [call.function.name] and args == call.function.arguments
    assert reasons[-1] == "length"


def test_streamed_call_accumulates_to_the_same_call(client):
    """The client's stream helper reads the call (sent whole once complete: one delta with
    its id, name and arguments) as the call the non-streamed request returns, and parses it
    into the tool's Pydantic model."""

    class GetWeather(pydantic.BaseModel):
        city: str
        days: int

    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    kwargs = dict(model="m", messages=ASK, tools=[tool], tool_choice="required",
                  temperature=0, max_tokens=60)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls"
    with client.chat.completions.stream(**kwargs) as stream:
        argument_events = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and len(argument_events) == 1
    got, want = final.message.tool_calls[0].function, whole.message.tool_calls[0].function
    assert (got.name, got.arguments) == (want.name, want.arguments)
    assert isinstance(got.parsed_arguments, GetWeather)


def test_auto_parses_a_call_with_text_before_it(client):
    kwargs = dict(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=60,
                  extra_body={"regex": CALL_REGEX})
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.message.content == "Let me check."
    (call,) = _check_calls(choice, {"get_weather"})
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    deltas = [c.choices[0].delta for c in chunks]
    content = "".join(d.content or "" for d in deltas)
    pieces = [p for d in deltas for p in d.tool_calls or []]
    assert content == "Let me check."      # no marker characters leak into content
    assert pieces[0].function.name == "get_weather" and pieces[0].id
    assert all(p.function.name is None and p.id is None for p in pieces[1:])
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == \
        ["tool_calls"]


def test_auto_and_none_answer_in_text(client):
    """Without a call in the output, "auto" is a plain answer; "none" does not even show the
    tools to the model (a shorter prompt)."""
    auto = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                          temperature=0, max_tokens=8)
    none = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                          tool_choice="none", temperature=0, max_tokens=8)
    plain = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=8)
    for resp in (auto, none):
        choice = resp.choices[0]
        assert choice.message.tool_calls is None and choice.message.content
        assert choice.finish_reason in ("stop", "length")
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens


def test_tool_history_renders(client):
    """An assistant turn that called a tool and the tool's answer go through the template."""
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather",
                          "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    with_history = client.chat.completions.create(model="m", messages=history, tools=TOOLS,
                                                  tool_choice="none", temperature=0,
                                                  max_tokens=4)
    without = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                             tool_choice="none", temperature=0, max_tokens=4)
    assert with_history.usage.prompt_tokens > without.usage.prompt_tokens + 20


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "no-such-type"}}}}}],
      "tool_choice": "required"}, "tools"),
    # (a keyword the grammar would drop: the call could break its schema)
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "not": {"const": 0}}}}}}],
      "tool_choice": "required"}, "tools"),
])
def test_bad_tool_requests_then_ok(server_url, client, body, param):
    r = httpx.post(f"{server_url}/v1/chat/completions",
                   json={"model": "m", "messages": ASK, "max_tokens": 4, **body}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"].split(".")[0] == param
    ok = client.chat.completions.create(model="m", messages=ASK, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


# ---------------------------------------------------------------------------- reasoning

THINK_REGEX = r"<think>[a-z ]{4,16}</think>[a-z ]{4,16}"


def test_reasoning_content_whole_and_streamed(server_url, client):
    kwargs = dict(model="m", messages=ASK, temperature=0, max_tokens=40,
                  extra_body={"regex": THINK_REGEX})
    # separate_reasoning false: the raw text, tags included. This first request also puts the
    # prompt in the radix cache, so the two compared below start from the same cached prefix
    # (a cold prefill can round differently enough to change a greedy pick among the few
    # tokens the regex leaves).
    raw = client.chat.completions.create(**{**kwargs, "extra_body": {
        "regex": THINK_REGEX, "separate_reasoning": False}}).choices[0].message
    assert raw.content.startswith("<think>") and "</think>" in raw.content
    assert raw.model_extra.get("reasoning_content") is None
    message = client.chat.completions.create(**kwargs).choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content and "<think>" not in message.content + reasoning
    streamed = {"reasoning_content": "", "content": ""}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            streamed["content"] += c.delta.content or ""
            streamed["reasoning_content"] += (c.delta.model_extra or {}).get(
                "reasoning_content") or ""
    assert streamed == {"reasoning_content": reasoning, "content": message.content}
    # The native API keeps the raw text.
    native = httpx.post(f"{server_url}/generate", timeout=120, json={
        "text": "The weather in Paris is", "sampling_params": {
            "regex": THINK_REGEX, "max_new_tokens": 40, "temperature": 0}}).json()
    assert native["text"].startswith("<think>") and "</think>" in native["text"]


def test_parse_with_pydantic_model(client):
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        country: str = pydantic.Field(max_length=24)
        population_millions: int = pydantic.Field(ge=0, le=100)

    resp = client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City, temperature=0, max_tokens=80)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_parse_function_call_and_separate_reasoning_endpoints(server_url):
    """SGLang's native parsing endpoints, on text a client generated with /generate."""
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "delete_all", '
            '"arguments": {}}\n</tool_call>')
    out = httpx.post(server_url + "/parse_function_call", timeout=30, json={
        "text": text, "tool_call_parser": "qwen25", "tools": TOOLS}).json()
    assert out["normal_text"] == "Let me check."
    # (a call to a function not in `tools` is left out)
    assert out["calls"] == [{"tool_index": 0, "name": "get_weather",
                             "parameters": '{"city": "Paris", "unit": "celsius"}'}]
    plain = httpx.post(server_url + "/parse_function_call", timeout=30, json={
        "text": "No call here.", "tool_call_parser": "qwen25", "tools": TOOLS}).json()
    assert plain == {"normal_text": "No call here.", "calls": []}
    split = httpx.post(server_url + "/separate_reasoning", timeout=30, json={
        "text": "Rain is likely.</think>Take an umbrella.",
        "reasoning_parser": "deepseek-r1"}).json()
    assert split == {"text": "Take an umbrella.", "reasoning_text": "Rain is likely."}
    for path, body, field in (
            ("/parse_function_call", {"text": text, "tool_call_parser": "gpt5", "tools": TOOLS},
             "tool_call_parser"),
            ("/parse_function_call", {"text": text, "tool_call_parser": "qwen25"}, "tools"),
            ("/separate_reasoning", {"text": 3, "reasoning_parser": "qwen3"}, "text"),
            ("/separate_reasoning", {"text": "x"}, "reasoning_parser")):
        resp = httpx.post(server_url + path, json=body, timeout=30)
        assert resp.status_code == 400 and field in resp.json()["error"]["message"]
