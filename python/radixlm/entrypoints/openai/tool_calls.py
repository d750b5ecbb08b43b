"""Request side of tool calling: what a chat request with `tools` / `tool_choice` needs from
the template, the prompt, the sampler and the output parser (a ToolPlan).

Decisions (the issue's part 2):
- tool_choice "none" (or no tools): tools are not shown and the output is not parsed.
- "auto" (the default with tools): the template renders the tools; the output is parsed with
  --tool-call-parser when one is set (with none, the answer is plain text, as in SGLang).
- "required" / a named function: the output is forced by a grammar to be well-formed calls
  in the parser's format (plain JSON {"name", "arguments"} without a parser, or for
  pythonic, which a grammar cannot tie to a JSON schema), whose arguments follow the
  function's `parameters` schema; they are returned as `tool_calls`. A named function is
  called once. "required" allows one or more calls when the request sends
  parallel_tool_calls true, else exactly one: the grammar cannot tell a model when to stop
  calling, and the bundled SmolLM2 (greedy) repeats the call until max_tokens, so a request
  that does not ask for parallel calls gets the one call it can rely on.
- parallel_tool_calls false: at most one call is returned (the first), whatever the choice. A forced call leaves no room
  for thinking, so the reasoning parser treats that output as content.
- A chat template that ignores `tools` (SmolLM2's, for one): with a parser, the tools are
  described in a system prompt in the parser's format, and past calls are written into the
  assistant messages as text in that format; without one, a request with tools is a 400, not
  a silent plain answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from radixlm.entrypoints.openai.protocol import ChatCompletionRequest, NamedToolChoice
from radixlm.entrypoints.openai.serving_base import OpenAIError
from radixlm.parsers.function_call import (TOOL_CALL_PARSERS, JsonParser, ToolCallParser,
                                           get_tool_call_parser)
from radixlm.parsers.function_call.grammar import forced_call_ebnf

_PROBE_NAME = "radixlm_probe_function"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_NAME, "description": "probe",
    "parameters": {"type": "object", "properties": {}}}}]
_support_cache: dict[str, bool] = {}


def template_supports_tools(tokenizer) -> bool:
    """Does the chat template render `tools`? Rendered once per template with a probe tool:
    a template that knows tools writes the function's name somewhere in the prompt."""
    template = tokenizer.chat_template
    if not isinstance(template, str):
        return False
    if template not in _support_cache:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                 tools=_PROBE_TOOLS, tokenize=False,
                                                 add_generation_prompt=True)
            _support_cache[template] = isinstance(text, str) and _PROBE_NAME in text
        except Exception:
            _support_cache[template] = False
    return _support_cache[template]


def is_special_token(tokenizer, text: str) -> bool:
    if not text:
        return False
    if text in getattr(tokenizer, "all_special_tokens", ()):
        return True
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return any(t.content == text and t.special for t in decoder.values())


@dataclass
class ToolPlan:
    """How one chat request treats tools."""
    parser: Optional[ToolCallParser] = None      # reads calls out of the output
    template_tools: Optional[list[dict[str, Any]]] = None   # `tools=` for the chat template
    system_prompt: Optional[str] = None          # describes the tools where the template can't
    history_format: Optional[ToolCallParser] = None  # writes past calls as text, likewise
    constraint: dict[str, str] = field(default_factory=dict)  # sampling_params of a forced call
    max_calls: Optional[int] = None              # calls returned at most (None: any number)
    # The functions a returned call may name (the offered ones): calls to others are left out,
    # as SGLang's parsers skip them (and /parse_function_call here)
    names: Optional[frozenset[str]] = None
    keep_special_tokens: bool = False            # the call marker is a special token

    @property
    def forced(self) -> bool:
        return bool(self.constraint)


def plan_tools(body: ChatCompletionRequest, tokenizer, parser_name: Optional[str]) -> ToolPlan:
    choice = body.tool_choice or ("auto" if body.tools else "none")
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    in_history = any(m.tool_calls or m.role == "tool" for m in body.messages)
    uses_tools = bool(tools) and choice != "none"
    native = template_supports_tools(tokenizer) if uses_tools or in_history else True
    configured = get_tool_call_parser(parser_name) if parser_name else None
    history_format = None if native else (configured or JsonParser())

    if not uses_tools:
        return ToolPlan(history_format=history_format)
    if not native and configured is None:
        raise OpenAIError(
            "this model's chat template does not support tools, and the server was started "
            "without --tool-call-parser, so tool calls could not be prompted for or read from "
            f"the output; start the server with --tool-call-parser "
            f"({' | '.join(TOOL_CALL_PARSERS)}), or send tool_choice \"none\"", 400,
            param="tools")

    offered = tools
    if isinstance(choice, NamedToolChoice):
        offered = [t for t in tools if t["function"]["name"] == choice.function.name]
    plan = ToolPlan(template_tools=offered if native else None, history_format=history_format,
                    max_calls=1 if body.parallel_tool_calls is False else None,
                    names=frozenset(t["function"]["name"] for t in offered))
    if choice == "auto":
        plan.parser = configured
    else:
        _check_no_other_constraint(body)
        plan.parser = (configured or JsonParser()).forced_parser()
        try:
            plan.constraint = {"ebnf": forced_call_ebnf(plan.parser.forced,
                                                        [t["function"] for t in offered],
                                                        several=choice == "required"
                                                        and body.parallel_tool_calls is True)}
        except ValueError as e:
            raise OpenAIError(str(e), 400, param="tools") from None
    if not native:
        plan.system_prompt = plan.parser.tool_prompt(offered)   # type: ignore[union-attr]
    plan.keep_special_tokens = plan.parser is not None and is_special_token(
        tokenizer, plan.parser.start_marker)
    return plan


def _check_no_other_constraint(body: ChatCompletionRequest) -> None:
    fmt = body.response_format
    if (fmt is not None and fmt.type != "text") or body.regex or body.ebnf or body.json_schema:
        raise OpenAIError("tool_choice \"required\" or a named function constrains the output "
                          "to a tool call; it cannot be combined with response_format, regex, "
                          "ebnf or json_schema", 400, param="tool_choice")
