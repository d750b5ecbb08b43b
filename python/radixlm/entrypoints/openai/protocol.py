"""Pydantic models of the OpenAI-compatible API's requests, strictly validated (the responses
are in response_models.py).

Requests are strict on types (no "5" for an int, no 1 for a bool) so that a wrong type is a 400
naming the field, as OpenAI does, instead of a silent coercion. Unknown fields are ignored
(extra="ignore") because clients send many optional OpenAI fields we have no use for; known
fields that would change the answer and are not implemented (audio output, the deprecated
`functions`, SGLang's `return_hidden_states`, ...) are declared and refused when set.

Besides OpenAI's fields, requests accept SGLang's sampling extras (top_k, min_p, regex, ...) so
that SGLang clients and scripts work unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

# Strict scalar types: JSON's 1 is accepted for a float (JSON has one number type), but not
# "1", and booleans are never numbers.
Int = Annotated[int, Strict()]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosInt = Annotated[int, Strict(), Field(ge=1)]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]
Penalty = Annotated[float, Strict(), Field(ge=-2.0, le=2.0)]
TopLogprobsNum = Annotated[int, Strict(), Field(ge=0, le=20)]


def invalid(message: str) -> PydanticCustomError:
    """A validation error whose message reads as given (a ValueError would get "Value error, "
    in front). Cross-field checks are field validators, not model validators, so that the
    error's location, and so the OpenAI error's `param`, names the field."""
    return PydanticCustomError("value_error", message)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """`null` for a field that has a default means "not set", as OpenAI's reference has it
        ("boolean or null"; the official client sends None as null): `n: null` is n = 1. A
        required field stays required."""
        if not isinstance(data, dict):
            return data
        unset = [k for k, v in data.items() if v is None and k in cls.model_fields
                 and not cls.model_fields[k].is_required()
                 and cls.model_fields[k].get_default() is not None]
        return {k: v for k, v in data.items() if k not in unset} if unset else data


class StreamOptions(_Request):
    include_usage: Bool = False
    # (vLLM's, with include_usage: every chunk carries the usage so far)
    continuous_usage_stats: Bool = False


def _refuse_when_set(v: Any, info: ValidationInfo, why: str = "is not supported by this "
                     "server") -> Any:
    """For fields that would change the answer and are not implemented: accepted only unset
    (null, or false for a flag; `{}` asks for a feature's defaults, so it counts as set)."""
    if v is not None and v is not False:
        raise invalid(f"{info.field_name} {why}")
    return v


class JsonSchemaSpec(_Request):
    name: str       # (required, as in OpenAI's and SGLang's)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[Bool] = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: Optional[JsonSchemaSpec] = None
    # type structural_tag (SGLang's): free text where a trigger starts one of the structures,
    # or xgrammar's `format`
    structures: Optional[list[dict[str, Any]]] = None
    triggers: Optional[list[str]] = None
    format: Optional[dict[str, Any]] = None

    @field_validator("json_schema", "structures", "triggers", "format")
    @classmethod
    def _belongs_to_type(cls, v: Any, info: ValidationInfo) -> Any:
        # A field of another type would be ignored: refuse it rather than answer unconstrained
        owner = "json_schema" if info.field_name == "json_schema" else "structural_tag"
        if v is not None and info.data.get("type") != owner:
            raise invalid(f"response_format.{info.field_name} is for type {owner}, not "
                          f"{info.data.get('type')}")
        return v


class SamplingExtras(_Request):
    """Fields shared by completions and chat: OpenAI's sampling knobs plus SGLang's extras."""

    model: Optional[str] = None
    n: PosInt = 1  # the upper bound is a server setting (--max-n-per-request)
    temperature: Optional[Annotated[float, Strict(), Field(ge=0.0, le=2.0)]] = None
    top_p: Optional[Annotated[float, Strict(), Field(gt=0.0, le=1.0)]] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    logit_bias: Optional[dict[str, Annotated[float, Strict(), Field(ge=-100.0, le=100.0)]]] = None
    seed: Optional[Int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted and ignored

    # SGLang extras, passed through to sampling_params.
    top_k: Optional[Int] = None
    min_p: Optional[Float] = None
    repetition_penalty: Optional[Float] = None
    min_tokens: Optional[NonNegInt] = None
    ignore_eos: Bool = False
    skip_special_tokens: Bool = True
    spaces_between_special_tokens: Bool = True
    no_stop_trim: Bool = False
    include_stop_str_in_output: Bool = False    # vLLM's name for no_stop_trim
    stop_token_ids: Optional[list[NonNegInt]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    regex: Optional[str] = None
    json_schema: Optional[Union[str, dict[str, Any]]] = None
    ebnf: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # SGLang's request id: the engine's rid (a prompt's, or one per prompt), which
    # /abort_request takes; a string is also the response's id
    rid: Optional[Union[NonEmptyStr, list[NonEmptyStr]]] = None
    # SGLang request fields not implemented here, refused as native /generate refuses them.
    return_hidden_states: Optional[Bool] = None
    lora_path: Optional[Any] = None

    @field_validator("return_hidden_states", "lora_path")
    @classmethod
    def _unsupported_sglang_fields(cls, v: Any, info: ValidationInfo) -> Any:
        return _refuse_when_set(v, info)

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, v: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        for key in v or ():
            if not key.strip().isdigit():
                raise invalid(f"logit_bias keys must be token ids, got {key!r}")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, v: Optional[StreamOptions],
                                    info: ValidationInfo) -> Optional[StreamOptions]:
        if v is not None and not info.data.get("stream"):
            raise invalid("stream_options is only allowed when stream is true")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


# ---------------------------------------------------------------------------- completions

Prompt = Union[str, list[str], list[Int], list[list[Int]]]


class CompletionRequest(SamplingExtras):
    prompt: Prompt
    max_tokens: Optional[NonNegInt] = None    # (None: --preferred-sampling-params, else 16)
    echo: Bool = False
    logprobs: Optional[TopLogprobsNum] = None
    best_of: Optional[PosInt] = None
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Prompt) -> Prompt:
        # (an empty prompt is no tokens here: this model has no start token to add)
        if v == "" or isinstance(v, list) and (not v or any(p in ("", []) for p in v)):
            raise invalid("prompt must not be empty")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        n = info.data.get("n", 1)
        if v is not None and v != n:
            raise invalid(f"best_of must be equal to n (got best_of={v}, n={n}); ranking "
                          f"candidates is not supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: Optional[str]) -> Optional[str]:
        if v:
            raise invalid("suffix is not supported")
        return v


# ---------------------------------------------------------------------------- chat

class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message. Extra keys (name, tool_call_id, ...) go to the chat template untouched."""
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    tool_calls: Optional[list[dict[str, Any]]] = None

    @model_validator(mode="after")
    def _content_given(self) -> "ChatMessage":
        """OpenAI requires the content of every message but an assistant's (which may carry
        tool calls instead): a missing or null one would render as an empty turn."""
        if self.content is None and self.role != "assistant":
            raise invalid(f"content is required for a {self.role} message")
        return self

    @field_validator("tool_calls")
    @classmethod
    def _calls_name_a_function(cls, v: Optional[list[dict[str, Any]]]
                               ) -> Optional[list[dict[str, Any]]]:
        """A past call must say which function it called, with what (OpenAI requires
        function.name and function.arguments): a template would render an empty one."""
        for i, call in enumerate(v or []):
            fn = call.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not fn["name"]:
                raise invalid(f"tool_calls[{i}].function must name the function called")
            if not isinstance(fn.get("arguments"), (str, dict)):
                raise invalid(f"tool_calls[{i}].function.arguments must be the call's "
                              f"arguments (a JSON string)")
        return v


class FunctionDefinition(_Request):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[Bool] = None

    @field_validator("parameters")
    @classmethod
    def _an_object_schema(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        # (a call's arguments are a JSON object: a forced call against another schema would be
        # written, then not read as a call)
        if v is not None and v.get("type", "object") not in ("object", ["object"]):
            raise invalid(f"must be a JSON Schema of type object, got type {v.get('type')!r}")
        return v


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


# Keys of apply_chat_template the chat handler sets itself: chat_template_kwargs may not
SERVER_TEMPLATE_KWARGS = {"conversation", "messages", "tokenize", "tools", "return_dict"}


class ChatCompletionRequest(SamplingExtras):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Optional[NonNegInt] = None
    max_completion_tokens: Optional[NonNegInt] = None
    logprobs: Bool = False
    top_logprobs: Optional[TopLogprobsNum] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None   # None: "auto" with tools, else "none"
    parallel_tool_calls: Optional[Bool] = None  # false: one call at most (tool_calls.py)
    continue_final_message: Bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    separate_reasoning: Bool = True   # SGLang's: False keeps thinking inside `content`
    # vLLM's: False renders the conversation without opening the assistant's turn.
    add_generation_prompt: Bool = True
    # Fields that would change the answer and are not implemented: refused when set.
    modalities: Optional[list[str]] = None      # only ["text"]
    audio: Optional[dict[str, Any]] = None
    functions: Optional[list[Any]] = None       # the deprecated form of `tools`
    function_call: Optional[Any] = None
    web_search_options: Optional[dict[str, Any]] = None
    chat_template: Optional[str] = None         # vLLM's per-request template
    echo: Bool = False                          # vLLM's echo of the last message

    @model_validator(mode="before")
    @classmethod
    def _template_flags_from_kwargs(cls, data: Any) -> Any:
        """As vLLM takes them: chat_template_kwargs may set add_generation_prompt and
        continue_final_message (over the top-level fields); the other keys the server sets
        itself (messages, tools, ...) are refused, not silently overridden (_no_server_kwargs,
        a field check, so that the error's param names the field)."""
        kw = data.get("chat_template_kwargs") if isinstance(data, dict) else None
        if not isinstance(kw, dict):
            return data
        moved = {k: kw[k] for k in ("add_generation_prompt", "continue_final_message")
                 if k in kw}
        if not moved:
            return data
        rest = {k: v for k, v in kw.items() if k not in moved}
        return {**data, **moved, "chat_template_kwargs": rest}

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_server_kwargs(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        taken = sorted(SERVER_TEMPLATE_KWARGS & set(v or ()))
        if taken:
            raise invalid(f"{taken[0]!r} is set by the server (pass the "
                          f"conversation as `messages`, tools as `tools`)")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None and set(v) != {"text"}:
            raise invalid(f"modalities {v} are not supported: this server answers in text only")
        return v

    @field_validator("audio", "web_search_options", "chat_template", "echo")
    @classmethod
    def _unsupported_chat_fields(cls, v: Any, info: ValidationInfo) -> Any:
        return _refuse_when_set(v, info)

    @field_validator("functions", "function_call")
    @classmethod
    def _legacy_functions(cls, v: Any, info: ValidationInfo) -> Any:
        return _refuse_when_set(v, info, "is not supported: pass the functions as `tools` "
                                "(and `tool_choice`)")

    @field_validator("tools")
    @classmethod
    def _unique_tool_names(cls, v: Optional[list[Tool]]) -> Optional[list[Tool]]:
        # A tool call names its function: with two tools of one name, neither the model's call
        # nor a tool_choice could say which is meant.
        names = [t.function.name for t in v or []]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise invalid(f"tool names must be unique; repeated: {', '.join(repeated)}")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_needs_tool(cls, v: Optional[ToolChoice],
                                info: ValidationInfo) -> Optional[ToolChoice]:
        tools = info.data.get("tools") or []
        if v == "required" and not tools:
            raise invalid("tool_choice 'required' needs at least one tool in `tools`")
        if isinstance(v, NamedToolChoice) and v.function.name not in {
                t.function.name for t in tools}:
            raise invalid(f"tool_choice names the function {v.function.name!r}, which is not "
                          f"in `tools`")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        if v and not info.data.get("logprobs"):
            raise invalid("top_logprobs requires logprobs to be true")
        return v

    @field_validator("continue_final_message")
    @classmethod
    def _continue_assistant(cls, v: bool, info: ValidationInfo) -> bool:
        messages = info.data.get("messages")
        if v and messages and messages[-1].role != "assistant":
            raise invalid("continue_final_message needs the last message to have role "
                          "'assistant'")
        return v

    @property
    def max_new_tokens(self) -> Optional[int]:
        """max_completion_tokens (the newer name) wins over max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens
