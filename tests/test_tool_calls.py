"""Tool-call and reasoning parsers on representative outputs of each model family's format, the
forced-call grammar, and the request-side plan (template support, prompt, history). No server:
see test_tool_calls_api.py for the end-to-end tests."""

from __future__ import annotations

import json

import pytest

from radixlm.config import ServerArgs
from radixlm.entrypoints.openai.chat_output import ChoiceDeltas, OutputParsing
from radixlm.parsers.function_call import TOOL_CALL_PARSERS, JsonParser, get_tool_call_parser
from radixlm.parsers.function_call.grammar import forced_call_ebnf
from radixlm.parsers.reasoning import get_reasoning_parser

# ---------------------------------------------------------------------------- outputs
# (parser, output, expected content, expected [(name, arguments dict)])

WEATHER = {"city": "Paris", "unit": "celsius"}
OUTPUTS = [
    # qwen25 / Hermes (Qwen2.5): one call, several calls, text before, malformed left as is
    ("qwen25", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
               '"unit": "celsius"}}\n</tool_call>', "", [("get_weather", WEATHER)]),
    ("qwen25", 'I will look both up.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": '
               '"get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
     "I will look both up.", [("get_weather", WEATHER), ("get_time", {"tz": "Europe/Paris"})]),
    ("qwen25", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris",}}\n'
               '</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris",}}\n</tool_call>', []),
    ("qwen25", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"Paris", "unit": "celsius"}}\n</tool_call>', "Let me check.",
     [("get_weather", WEATHER)]),
    ("qwen25", "The weather in Paris is mild, around 18 degrees.",
     "The weather in Paris is mild, around 18 degrees.", []),
    ("qwen25", '<tool_call>\n{"name": "say", "arguments": {"text": "a } and \\" and '
               '</tool_call> inside"}}\n</tool_call>', "",
     [("say", {"text": 'a } and " and </tool_call> inside'})]),
    # llama3 (Llama 3.1/3.2 JSON): bare object, python_tag, several joined by ";"
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
     "", [("get_weather", WEATHER)]),
    ("llama3", 'Let me check. <|python_tag|>{"name": "get_weather", "parameters": {"city": '
               '"Paris", "unit": "celsius"}}; {"name": "get_time", "parameters": {}}',
     "Let me check.", [("get_weather", WEATHER), ("get_time", {})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"',
     '{"name": "get_weather", "parameters": {"city": "Paris"', []),
    ("llama3", "Paris is the capital of France.", "Paris is the capital of France.", []),
    # mistral: [TOOL_CALLS] and a JSON list; arguments given as a JSON string are accepted
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", '
                '"unit": "celsius"}}, {"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}]',
     "", [("get_weather", WEATHER), ("get_time", {"tz": "UTC"})]),
    ("mistral", 'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", '
                '"unit": "celsius"}}]', "Sure.", [("get_weather", WEATHER)]),
    ("mistral", '[TOOL_CALLS] [{"arguments": {"city": "Paris"}}]',
     '[TOOL_CALLS] [{"arguments": {"city": "Paris"}}]', []),
    # pythonic (Llama 3.2 / Llama 4)
    ("pythonic", '[get_weather(city="Paris", unit="celsius"), get_time()]', "",
     [("get_weather", WEATHER), ("get_time", {})]),
    ("pythonic", "Checking now. [get_weather(city='Paris', unit='celsius')]", "Checking now.",
     [("get_weather", WEATHER)]),
    ("pythonic", '<|python_start|>[count(n=3, flags=[True, None], opts={"a": 1.5})]'
                 '<|python_end|>', "", [("count", {"n": 3, "flags": [True, None],
                                                   "opts": {"a": 1.5}})]),
    ("pythonic", "[get_weather(city=Paris)]", "[get_weather(city=Paris)]", []),
    ("pythonic", "Lists like [1, 2] are not calls.", "Lists like [1, 2] are not calls.", []),
    # json: the forced form without a parser
    ("json", '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}', "",
     [("get_weather", WEATHER)]),
]


def _parser(name):
    return JsonParser() if name == "json" else get_tool_call_parser(name)


@pytest.mark.parametrize("name,text,content,calls", OUTPUTS,
                         ids=[f"{o[0]}-{i}" for i, o in enumerate(OUTPUTS)])
def test_parse_recorded_outputs(name, text, content, calls):
    message = OutputParsing(tools=_parser(name)).message(text)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    assert got == calls
    assert (message.content or "") == content
    assert all(c.id.startswith("call_") and c.type == "function" for c in message.tool_calls or [])


def _stream(parsing: OutputParsing, text: str, step: int = 1, truncated: bool = False):
    """Feed growing prefixes as a stream would; return what a client accumulates."""
    deltas = ChoiceDeltas(parsing)
    content, reasoning, calls, first_pieces = "", "", {}, []
    cuts = list(range(step, len(text), step)) + [len(text)]
    for k in cuts:
        d = deltas.delta(text[:k], final=k == len(text), truncated=truncated)
        content += d.content or ""
        reasoning += d.reasoning_content or ""
        for piece in d.tool_calls or []:
            if piece.index not in calls:
                # The first piece of a call names it; later pieces only add arguments.
                assert piece.id and piece.type == "function" and piece.function.name
                calls[piece.index] = [piece.function.name, ""]
                first_pieces.append(piece)
            else:
                assert piece.id is None and piece.function.name is None
            calls[piece.index][1] += piece.function.arguments or ""
    return content, reasoning, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("name,text,content,calls", OUTPUTS,
                         ids=[f"{o[0]}-{i}" for i, o in enumerate(OUTPUTS)])
def test_stream_accumulates_to_message(name, text, content, calls):
    """Character by character (and in 5-character steps), the deltas add up to the
    non-streamed message, except for malformed output, whose calls never complete."""
    parsing = OutputParsing(tools=_parser(name))
    message = parsing.message(text)
    want = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    malformed = not calls and content == text and any(c in text for c in "{(")
    for step in (1, 5):
        got_content, _, got_calls = _stream(parsing, text, step)
        if not malformed:
            assert got_calls == want
            assert got_content == (message.content or "")


@pytest.mark.parametrize("name", ["qwen25", "mistral", "llama3", "json"])
def test_call_cut_by_max_tokens_is_the_same_streamed_or_not(name):
    """An output cut at max_tokens inside a call: the message keeps the call as far as it got
    (name, partial arguments), as the stream sent it; the call's text is not also content."""
    parser = _parser(name)
    whole = parser.render_call("get_weather", {"city": "Paris", "unit": "celsius"})
    # (a bare JSON call is the whole answer: no text before it)
    cut = ("" if name == "json" else "Checking. ") + whole[:whole.index("Paris") + 3]
    parsing = OutputParsing(tools=parser)
    message = parsing.message(cut, truncated=True)
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith('{"city"')
    assert "get_weather" not in (message.content or "")
    for step in (1, 4):
        content, _, calls = _stream(parsing, cut, step, truncated=True)
        assert calls == [("get_weather", call.function.arguments)]
        assert content == (message.content or "")
    # Cut before any call began: plain content, as without the flag.
    assert parsing.message("Checking the weather", truncated=True).content == \
        "Checking the weather"


def test_stream_sends_each_call_whole_once_complete():
    parsing = OutputParsing(tools=get_tool_call_parser("qwen25"))
    text = OUTPUTS[0][1]
    deltas = ChoiceDeltas(parsing)
    pieces = [p for k in range(1, len(text) + 1)
              for p in deltas.delta(text[:k], k == len(text)).tool_calls or []]
    assert len(pieces) == 1 and pieces[0].function.name == "get_weather"
    assert json.loads(pieces[0].function.arguments) == {"city": "Paris", "unit": "celsius"}


def test_stream_holds_back_partial_markers_and_unfinished_calls():
    deltas = ChoiceDeltas(OutputParsing(tools=get_tool_call_parser("qwen25")))
    assert deltas.delta("Sure <tool_", final=False).content == "Sure"
    d = deltas.delta("Sure <tool_call>\n{\"name\": \"f\"", final=False)
    assert d.content is None and d.tool_calls is None
    d = deltas.delta("Sure <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
                     final=False)
    assert d.tool_calls[0].function.name == "f" and d.tool_calls[0].function.arguments == "{}"


@pytest.mark.parametrize("cut", ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
                                 '<tool_call>\n{"name": "get_wea'])
def test_a_call_the_model_leaves_unfinished_is_content_in_both_forms(cut):
    """The model stops (EOS) inside a call: the stream never sent it as a call, and ends with
    the same content as the whole message, with no tool_calls (finish_reason "stop")."""
    parsing = OutputParsing(tools=get_tool_call_parser("qwen25"))
    text = "Let me look. " + cut
    deltas = ChoiceDeltas(parsing)
    streamed = [deltas.delta(text[:k], k == len(text)) for k in range(1, len(text) + 1)]
    assert not any(d.tool_calls for d in streamed) and not deltas.called
    message = parsing.message(text)
    assert message.tool_calls is None
    assert "".join(d.content or "" for d in streamed) == message.content == text


def test_text_on_both_sides_of_a_call_keeps_a_separator():
    parser = get_tool_call_parser("qwen25")
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert parser.parse(f"Hi there {call} bye now").content == "Hi there bye now"
    assert parser.parse(f"Hi there\n{call}\nbye").content == "Hi there\nbye"
    assert parser.parse(f"{call}\n").content == ""
    assert parser.parse(f"Checking. {call}").content == "Checking."
    # a marker that opens no call stays as written
    assert parser.parse("Use <tool_call> tags like <tool_call>oops").content == \
        "Use <tool_call> tags like <tool_call>oops"


# ---------------------------------------------------------------------------- reasoning

REASONING = [
    # (parser, prompt, output, reasoning, content)
    ("deepseek-r1", "<｜Assistant｜>", "The user wants 2+2. That is 4.\n</think>\n\nIt is 4.",
     "The user wants 2+2. That is 4.", "It is 4."),
    ("deepseek-r1", "<｜Assistant｜><think>\n", "<think>\nhmm\n</think>The answer.",
     "hmm", "The answer."),
    ("deepseek-r1", "<｜Assistant｜>", "Still thinking when the budget ran out",
     "Still thinking when the budget ran out", ""),
    ("qwen3", "<|im_start|>assistant\n", "<think>\nSimple.\n</think>\n\nHello!", "Simple.",
     "Hello!"),
    ("qwen3", "<|im_start|>assistant\n", "Hello there, no thinking.", "",
     "Hello there, no thinking."),
    # enable_thinking=false: Qwen3's template closes an empty block in the prompt
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "Hi.", "", "Hi."),
    # an always-thinking template opens the block in the prompt
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Okay.\n</think>\n\nDone.", "Okay.", "Done."),
]


@pytest.mark.parametrize("name,prompt,text,reasoning,content", REASONING)
def test_reasoning_split_and_stream(name, prompt, text, reasoning, content):
    parser = get_reasoning_parser(name)
    parsing = OutputParsing(reasoning=parser, inside_reasoning=parser.starts_inside(prompt))
    message = parsing.message(text)
    assert (message.reasoning_content or "") == reasoning
    assert (message.content or "") == content
    for step in (1, 3):
        got_content, got_reasoning, _ = _stream(parsing, text, step)
        assert (got_reasoning, got_content) == (reasoning, content)


def test_reasoning_then_tool_call():
    parser = get_reasoning_parser("qwen3")
    parsing = OutputParsing(reasoning=parser, tools=get_tool_call_parser("qwen25"))
    text = "<think>Need the weather.</think>\n" + OUTPUTS[0][1]
    message = parsing.message(text)
    assert message.reasoning_content == "Need the weather."
    assert message.tool_calls[0].function.name == "get_weather" and message.content is None
    content, reasoning, calls = _stream(parsing, text)
    assert reasoning == "Need the weather." and content == "" and calls[0][0] == "get_weather"


# ---------------------------------------------------------------------------- forced calls

FUNCTIONS = [
    {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}},
    {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
]


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS) + ["json"])
def test_forced_grammar_accepts_only_valid_calls(name):
    """The grammar accepts the format's own rendering of a valid call and nothing else: not
    another function, not arguments against the schema, not text around the call."""
    xgr_testing = pytest.importorskip("xgrammar.testing")
    import xgrammar as xgr

    parser = _parser(name).forced_parser()
    grammar = xgr.Grammar.from_ebnf(forced_call_ebnf(parser.forced, FUNCTIONS))
    f = parser.forced

    def call(fn, args):
        body = json.dumps({"name": fn, f.args_key: args}, separators=(", ", ": "))
        return f.prefix + body + f.suffix

    accepts = lambda s: xgr_testing._is_grammar_accept_string(grammar, s)  # noqa: E731
    good = call("get_weather", WEATHER)
    assert accepts(good) and accepts(call("get_time", {}))
    assert parser.parse(good).calls[0].name == "get_weather"
    assert not accepts(call("get_weather", {"city": "Paris"}))            # missing required
    assert not accepts(call("get_weather", {**WEATHER, "unit": "kelvin"}))  # not in enum
    assert not accepts(call("delete_all", {}))                            # unknown function
    assert not accepts("Sure! " + good)
    named = xgr.Grammar.from_ebnf(forced_call_ebnf(f, FUNCTIONS[1:]))
    assert not xgr_testing._is_grammar_accept_string(named, good)
    # A function declared without `parameters` takes none (OpenAI's rule): `{}` only.
    bare = xgr.Grammar.from_ebnf(forced_call_ebnf(f, [{"name": "get_date"}]))
    assert xgr_testing._is_grammar_accept_string(bare, call("get_date", {}))
    assert not xgr_testing._is_grammar_accept_string(bare, call("get_date", {"argument": 23}))


def test_forced_grammar_resolves_each_tools_local_references():
    """Parameters with $defs / $ref (as openai.pydantic_function_tool writes them) are usable
    when a call is forced: each tool's references resolve against its own parameters, even
    when two tools name a definition alike."""
    xgr_testing = pytest.importorskip("xgrammar.testing")
    import xgrammar as xgr

    def tool(name, kind):
        return {"name": name, "parameters": {
            "$defs": {"V": {"type": "object", "properties": {"v": {"type": kind}},
                            "required": ["v"], "additionalProperties": False}},
            "type": "object", "properties": {"x": {"$ref": "#/$defs/V"},
                                             "y": {"$ref": "#/properties/x"}},
            "required": ["x"], "additionalProperties": False}}

    f = _parser("qwen25").forced
    grammar = xgr.Grammar.from_ebnf(forced_call_ebnf(f, [tool("a", "integer"),
                                                         tool("b", "string")]))

    def accepts(name, args):
        body = json.dumps({"name": name, f.args_key: args}, separators=(", ", ": "))
        return xgr_testing._is_grammar_accept_string(grammar, f.prefix + body + f.suffix)

    assert accepts("a", {"x": {"v": 1}}) and accepts("a", {"x": {"v": 1}, "y": {"v": 2}})
    assert accepts("b", {"x": {"v": "s"}})
    assert not accepts("a", {"x": {"v": "s"}}) and not accepts("b", {"x": {"v": 1}})


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS) + ["json"])
def test_forced_grammar_for_several_calls(name):
    """tool_choice "required" with parallel calls: one or more calls joined by the format's
    separator, each valid, which the format's parser reads back as that many calls; the
    single-call grammar refuses two."""
    xgr_testing = pytest.importorskip("xgrammar.testing")
    import xgrammar as xgr

    parser = _parser(name).forced_parser()
    f = parser.forced
    several = xgr.Grammar.from_ebnf(forced_call_ebnf(f, FUNCTIONS, several=True))
    one = xgr.Grammar.from_ebnf(forced_call_ebnf(f, FUNCTIONS))
    bodies = [json.dumps({"name": "get_weather", f.args_key: WEATHER}, separators=(", ", ": ")),
              json.dumps({"name": "get_time", f.args_key: {}}, separators=(", ", ": "))]
    accepts = xgr_testing._is_grammar_accept_string
    two = f.prefix + f.between.join(bodies) + f.suffix
    assert accepts(several, two) and accepts(several, f.prefix + bodies[0] + f.suffix)
    assert not accepts(one, two)
    assert not accepts(several, f.prefix + f.suffix)                      # no call at all
    assert not accepts(several, f.prefix + bodies[0] + f.between + f.suffix)
    assert [c.name for c in parser.parse(two).calls] == ["get_weather", "get_time"]
    assert parser.parse(two).content == ""


# ---------------------------------------------------------------------------- requests

@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.model_executor.weight_source import load_tokenizer, resolve_model_dir
    return load_tokenizer(resolve_model_dir(None, "auto")[0])


# A minimal template that renders tools and calls (as tool-aware HF templates do) and honours
# an enable_thinking kwarg (as Qwen3's does).
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}")


def _request(**kw):
    from radixlm.entrypoints.openai.protocol import ChatCompletionRequest
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Weather in Paris?"}], **kw})


TOOLS = [{"type": "function", "function": f} for f in FUNCTIONS]
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(WEATHER)}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}]


def test_plan_for_template_without_tools(tokenizer):
    from radixlm.entrypoints.openai.chat_template import render_chat
    from radixlm.entrypoints.openai.serving_base import OpenAIError
    from radixlm.entrypoints.openai.tool_calls import plan_tools, template_supports_tools

    assert not template_supports_tools(tokenizer)        # SmolLM2: plain ChatML
    with pytest.raises(OpenAIError) as e:
        plan_tools(_request(tools=TOOLS), tokenizer, None)
    assert e.value.status == 400 and "--tool-call-parser" in e.value.message
    assert plan_tools(_request(tools=TOOLS, tool_choice="none"), tokenizer, None).parser is None

    body = _request(tools=TOOLS, messages=HISTORY)
    plan = plan_tools(body, tokenizer, "qwen25")
    assert plan.parser.name == "qwen25" and not plan.forced and plan.template_tools is None
    prompt = render_chat(tokenizer, body, plan)
    # The tools are described in a system prompt, the past call written in the parser's format
    # and the tool's answer kept.
    system = prompt.split("<|im_end|>")[0]
    assert '"name": "get_time"' in system and '<tool_call>\n{"name": "function_name"' in system
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"' in prompt
    assert "<|im_start|>tool\n18 degrees" in prompt

    named = plan_tools(_request(tools=TOOLS, tool_choice={"type": "function",
                                                          "function": {"name": "get_time"}}),
                       tokenizer, "qwen25")
    assert "get_time" in named.constraint["ebnf"] and "get_weather" not in named.constraint["ebnf"]
    assert "get_weather" not in named.system_prompt


def test_plan_for_template_with_tools(tokenizer):
    from radixlm.entrypoints.openai.chat_template import render_chat
    from radixlm.entrypoints.openai.tool_calls import plan_tools, template_supports_tools

    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.chat_template = TOOL_TEMPLATE
    assert template_supports_tools(tok)
    body = _request(tools=TOOLS, messages=HISTORY,
                    chat_template_kwargs={"enable_thinking": False})
    plan = plan_tools(body, tok, None)    # the template shows tools; no parser: no parsing
    assert plan.parser is None and plan.system_prompt is None and plan.history_format is None
    prompt = render_chat(tok, body, plan)
    assert prompt.startswith("TOOLS: get_weather get_time<user>")
    # arguments reach the template as an object, as HF templates expect
    assert 'CALL get_weather {"city": "Paris", "unit": "celsius"}' in prompt
    assert prompt.endswith("<assistant><think></think>")
    forced = plan_tools(_request(tools=TOOLS, tool_choice="required"), tok, None)
    assert isinstance(forced.parser, JsonParser) and forced.forced


def test_parallel_tool_calls(tokenizer):
    """tool_choice "required" lets the grammar write several calls when parallel_tool_calls is
    true (one by default); a named function is called once; with parallel_tool_calls false the
    output parsing returns the first call only, in auto mode too."""
    from radixlm.entrypoints.openai.tool_calls import plan_tools
    from radixlm.parsers.function_call.formats import HermesParser

    between = json.dumps(HermesParser.forced.between)   # as the EBNF spells it

    def plan(**kw):
        return plan_tools(_request(tools=TOOLS, **kw), tokenizer, "qwen25")

    several = plan(tool_choice="required", parallel_tool_calls=True)
    assert several.max_calls is None and between in several.constraint["ebnf"]
    for one in (plan(tool_choice="required"),
                plan(tool_choice="required", parallel_tool_calls=False),
                plan(tool_choice={"type": "function", "function": {"name": "get_time"}},
                     parallel_tool_calls=True)):
        assert between not in one.constraint["ebnf"]
    assert plan(tool_choice="required", parallel_tool_calls=False).max_calls == 1
    auto = plan_tools(_request(tools=TOOLS, parallel_tool_calls=False), tokenizer, "qwen25")
    assert auto.max_calls == 1 and not auto.forced

    text = ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    both = OutputParsing(tools=HermesParser()).message(text).tool_calls
    first = OutputParsing(tools=HermesParser(), max_calls=1).message(text).tool_calls
    assert [c.function.name for c in both] == ["get_time", "get_weather"]
    assert [c.function.name for c in first] == ["get_time"]


def test_special_token_markers(tokenizer):
    """Markers that are special tokens (llama3's <|python_tag|>, mistral's [TOOL_CALLS] in their
    tokenizers) make the request keep special tokens in its text."""
    from radixlm.entrypoints.openai.tool_calls import is_special_token
    assert is_special_token(tokenizer, "<|im_start|>")
    assert not is_special_token(tokenizer, "<tool_call>") and not is_special_token(tokenizer, "")


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),              # two tools of one name
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    # a call's arguments are an object: a forced call against another schema was written and
    # then not read as a call (200, no tool_calls)
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}], "tool_choice": "required"}, "tools"),
    # a past call that names no function (a template rendered an empty one)
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]},
     "messages"),
])
def test_invalid_tools_rejected(body, param):
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as e:
        _request(**body)
    assert e.value.errors()[0]["loc"][0] == param


def test_server_args_validate_parser_names():
    assert ServerArgs(tool_call_parser="pythonic", reasoning_parser="qwen3")
    for flag, kw in (("--tool-call-parser", {"tool_call_parser": "hermes2"}),
                     ("--reasoning-parser", {"reasoning_parser": "r1"})):
        with pytest.raises(ValueError, match=flag):
            ServerArgs(**kw)


def test_calls_to_functions_not_offered_are_left_out():
    """As SGLang's parsers (and /parse_function_call here) skip them: a call naming a function
    that is not in `tools` is not returned, streamed or whole; the offered ones are."""
    parsing = OutputParsing(tools=get_tool_call_parser("qwen25"),
                            names=frozenset({"get_weather"}))
    unknown = '<tool_call>\n{"name": "unknown_fn", "arguments": {"x": 1}}\n</tool_call>'
    known = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = unknown + "\n" + known
    message = parsing.message(text)
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    deltas = ChoiceDeltas(parsing)
    streamed = [p for k in range(1, len(text) + 1)
                for p in deltas.delta(text[:k], k == len(text)).tool_calls or []]
    assert [p.function.name for p in streamed] == ["get_weather"] and streamed[0].index == 0
    assert parsing.message(unknown).tool_calls is None


@pytest.mark.parametrize("name,text", [
    ("llama3", '{"name": "get_weather", "parameters": {"city": "X"}} after'),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {}}.'),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {}}] after'),
])
def test_text_after_a_tail_call_is_content_streamed_or_not(name, text):
    """Formats whose calls run to the end of the answer: text after a call makes the whole
    answer content. The stream used to send the call as soon as it closed, then the same
    text again as content (probe 32): now no call goes out before the answer ends."""
    parsing = OutputParsing(tools=_parser(name))
    message = parsing.message(text)
    assert message.tool_calls is None and message.content == text
    for step in (1, 5):
        content, _, calls = _stream(parsing, text, step)
        assert calls == [] and content == text


def test_a_call_cut_before_its_name_is_whole_stays_content():
    """Cut by max_tokens inside the call's name: there is no call to report, and the text
    must not vanish (it came back as content '' with no tool_calls)."""
    parsing = OutputParsing(tools=get_tool_call_parser("qwen25"))
    for cut in ('Let me look. <tool_call>\n{"name":',
                'Let me look. <tool_call>\n{"name": "get_wea'):
        message = parsing.message(cut, truncated=True)
        assert message.tool_calls is None and message.content == cut
        content, _, calls = _stream(parsing, cut, 1, truncated=True)
        assert calls == [] and content == cut
