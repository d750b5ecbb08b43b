"""OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}, GET
/v1/responses/{id}/input_items), on top of chat completions: a request becomes a chat request
(`instructions` the system message, `input` a string or a list of message / function_call /
function_call_output items, a stored response's conversation first for `previous_response_id`,
`text.format` the response_format, function tools the chat's tools), runs through the chat
handler (routes.serve_body: the same checks and 400s), and its answer is written back as a
Response object: a reasoning item (with a reasoning parser), a message item with output_text
(its token logprobs with include=["message.output_text.logprobs"] or top_logprobs), and
function_call items; errors name the Responses field (input, text.format), not the chat one.
Streams: responses_stream.py.

Stored responses (`store`, true by default) live in the server's memory. Fields that would need
what this server does not have (background mode, built-in tools such as web search, prompt
templates, conversations) are refused with a 400, never ignored.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.entrypoints.errors import bad_request, error_response
from radixlm.entrypoints.openai.files import (list_args_problem, list_page,
                                             metadata_problem, paginate)
from radixlm.entrypoints.openai.responses_items import (finish, input_items, new_id,
                                                       output_items, remember, responses_param,
                                                       skeleton, store, usage)
from radixlm.entrypoints.openai.responses_stream import stream_response
from radixlm.entrypoints.openai.routes import answer_json, serve_body
from radixlm.entrypoints.request_body import read_json_body

router = APIRouter()

CHAT = "/v1/chat/completions"
# Request fields passed to the chat request as they are (OpenAI's and SGLang's sampling extras)
PASSED_THROUGH = ("model", "temperature", "top_p", "parallel_tool_calls", "top_k", "min_p",
                  "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                  "ignore_eos", "min_tokens", "regex", "ebnf", "logit_bias", "separate_reasoning",
                  "stop_token_ids", "skip_special_tokens", "no_stop_trim", "rid",
                  "chat_template_kwargs", "include_stop_str_in_output")
# Fields that ask for what this server does not do: a 400 when set
REFUSED = ("background", "background_options", "prompt", "conversation", "context_management",
           "image", "moderation", "access_programs")
# OpenAI's other request fields: handled here, or hints with nothing to do on this server
# (prompt caching is automatic; no built-in tools for max_tool_calls to limit; no obfuscation
# for stream_options to turn off). Any field in none of these lists is a 400, as OpenAI's.
HANDLED = ("input", "instructions", "max_output_tokens", "metadata", "parallel_tool_calls",
           "previous_response_id", "reasoning", "store", "stream", "stream_options", "text",
           "tool_choice", "tools", "top_logprobs", "truncation", "user", "include",
           "max_tool_calls", "prompt_cache_key", "prompt_cache_options",
           "prompt_cache_retention", "safety_identifier", "service_tier")
# `include` values this server answers (the others name outputs of tools it does not have)
INCLUDABLE = ("message.output_text.logprobs",)


class ResponsesInputError(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# ---------------------------------------------------------------------- request -> chat

def chat_request(body: dict[str, Any], history: list[dict[str, Any]]
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat-completions body for a Responses request, and the conversation it continues
    (to store with the answer); `history`: the conversation of the response it continues
    (previous_response_id). Instructions are this request's only: a system message before the
    conversation, never carried over (as OpenAI's)."""
    check_fields(body)
    conversation = list(history) + input_messages(body.get("input"))
    messages = conversation
    if body.get("instructions") is not None:
        messages = [{"role": "system", "content": body["instructions"]}] + conversation
    chat: dict[str, Any] = {k: body[k] for k in PASSED_THROUGH if body.get(k) is not None}
    chat["model"] = chat.get("model", "default")
    chat["messages"] = messages
    # OpenAI's Responses default is parallel calls allowed (chat: one unless asked)
    chat.setdefault("parallel_tool_calls", True)
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ResponsesInputError(f"max_output_tokens must be a positive integer, got "
                                      f"{limit!r}", "max_output_tokens")
        chat["max_tokens"] = limit
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None:
        chat["response_format"] = _response_format(fmt)
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool)
                            or not 0 <= top <= 20):
        raise ResponsesInputError(f"top_logprobs must be an integer from 0 to 20, got {top!r}",
                                  "top_logprobs")
    if top or "message.output_text.logprobs" in (body.get("include") or []):
        chat["logprobs"], chat["top_logprobs"] = True, top or 0
    return chat, conversation


# field -> (types it may have, what to say)
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "instructions": ((str,), "a string"), "user": ((str,), "a string"),
    "store": ((bool,), "true or false"), "stream": ((bool,), "true or false"),
    "previous_response_id": ((str,), "a response id (a string)"),
    "text": ((dict,), "an object"), "parallel_tool_calls": ((bool,), "true or false"),
}


def check_fields(body: dict[str, Any]) -> None:
    """What chat_request cannot check by translating: refused fields, types of the fields the
    Response echoes, metadata, reasoning."""
    unknown = sorted(set(body) - set(PASSED_THROUGH) - set(REFUSED) - set(HANDLED))
    if unknown:
        raise ResponsesInputError(f"Unknown parameter: {unknown[0]!r}", unknown[0])
    for name in REFUSED:
        if body.get(name) not in (None, False, [], {}, ""):
            raise ResponsesInputError(f"`{name}` is not supported by this server", name)
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
            raise ResponsesInputError("include must be a list of strings", "include")
        for value in include:
            if value not in INCLUDABLE:
                raise ResponsesInputError(f"include {value!r} is not supported by this server "
                                          f"(only {', '.join(INCLUDABLE)})", "include")
    if body.get("truncation") not in (None, "disabled"):
        raise ResponsesInputError("truncation must be disabled (the default)", "truncation")
    for name, (types, what) in _TYPES.items():
        if body.get(name) is not None and not isinstance(body[name], types):
            raise ResponsesInputError(f"{name} must be {what}", name)
    problem = metadata_problem(body.get("metadata"))
    if problem:
        raise ResponsesInputError(problem, "metadata")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or any(
            v is not None for v in reasoning.values())):
        raise ResponsesInputError("reasoning options (effort, summary) are not supported by "
                                  "this server", "reasoning")
    choice = body.get("tool_choice")
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        raise ResponsesInputError(f"tool_choice must be auto, none, required or a function, "
                                  f"got {choice!r}", "tool_choice")
    if choice not in (None, "auto", "none") and not body.get("tools"):
        raise ResponsesInputError("tool_choice asks for a tool call, but no tools are given",
                                  "tool_choice")


def input_messages(items: Any) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; a list holds messages
    (role + content: a string or input_text parts), function_call items (an assistant turn's
    calls) and function_call_output items (tool results)."""
    if items is None:
        raise ResponsesInputError("input is required", "input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ResponsesInputError("input must be a string or a list of items", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ResponsesInputError(f"input[{i}] must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ResponsesInputError(f"input[{i}].role must be user, assistant, system or "
                                          f"developer, got {role!r}", "input")
            out.append({"role": role, "content": _text(item.get("content"), i)})
        elif kind == "function_call":
            _require_strings(item, ("call_id", "name", "arguments"), i)
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"),
                                 "arguments": item.get("arguments", "{}")}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            _require_strings(item, ("call_id",), i)
            output = item.get("output")
            if not isinstance(output, (str, list)):
                raise ResponsesInputError(f"input[{i}].output must be a string or a list of "
                                          f"parts", "input")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue    # (earlier thinking is not fed back, as chat templates drop it)
        else:
            raise ResponsesInputError(f"input[{i}] has type {kind!r}, which this server does "
                                      f"not take (message, function_call, "
                                      f"function_call_output)", "input")
    return out


def _require_strings(item: dict[str, Any], names: tuple[str, ...], i: int) -> None:
    for name in names:
        if not isinstance(item.get(name), str):
            raise ResponsesInputError(f"input[{i}].{name} must be a string", "input")


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                    "input_text", "output_text", "text"):
                raise ResponsesInputError(f"input[{i}].content: only text parts are taken "
                                          f"(input_text)", "input")
            if not isinstance(part.get("text"), str):
                raise ResponsesInputError(f"input[{i}].content: a text part needs `text` (a "
                                          f"string)", "input")
            texts.append(part["text"])
        return "".join(texts)
    raise ResponsesInputError(f"input[{i}].content must be a string or a list of parts", "input")


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not tools:
        return []
    if not isinstance(tools, list):
        raise ResponsesInputError("tools must be a list", "tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise ResponsesInputError(f"only function tools are supported, got {kind!r}",
                                      "tools")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict")
              if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ResponsesInputError(f"tool_choice {choice!r} is not supported", "tool_choice")


def _response_format(fmt: Any) -> dict[str, Any]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise ResponsesInputError(f"text.format type must be text, json_object or json_schema, "
                              f"got {kind!r}", "text.format")


# ---------------------------------------------------------------------- endpoints

@router.post("/v1/responses")
async def create_response(request: Request):
    try:
        body = await read_json_body(request)
        if not isinstance(body, dict):
            raise ResponsesInputError("the body must be a JSON object")
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise ResponsesInputError("previous_response_id must be a string",
                                      "previous_response_id")
        if previous is not None:
            stored = store(request.app).get(previous)
            if stored is None:
                return _no_such_response(previous, "previous_response_id")
            history = stored.messages
        chat, conversation = chat_request(body, history)
    except ResponsesInputError as e:
        return error_response(str(e), 400, param=e.param)
    except ValueError as e:       # (the body reader's: size, depth, non-finite numbers)
        return bad_request(e)
    model = body.get("model") or "default"
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
        answer = await serve_body(request, CHAT, chat)
        if not isinstance(answer, StreamingResponse):
            return _in_responses_terms(answer)      # (an error, answered before any event)
        return StreamingResponse(stream_response(request.app, body, conversation, model,
                                                 answer),
                                 media_type="text/event-stream")
    answer = await serve_body(request, CHAT, chat)
    status, completion = answer_json(answer)
    if status != 200:
        return _in_responses_terms(answer)
    choice = completion["choices"][0]
    response = skeleton(body, new_id("resp"), completion.get("model", model))
    response["output"] = output_items(choice["message"], choice.get("logprobs"))
    response["usage"] = usage(completion["usage"])
    finish(response, choice.get("finish_reason"))
    remember(request.app, response, conversation, choice["message"], input_items(body["input"]))
    return JSONResponse(response)


def _no_such_response(response_id: str, param: str) -> JSONResponse:
    return error_response(f"no stored response with id {response_id!r}", 404, param=param)


def _in_responses_terms(answer: Any) -> Any:
    """The chat handler's error with `param` naming the Responses field the user wrote
    (input, not messages)."""
    status, body = answer_json(answer)
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or responses_param(error.get("param")) == error.get("param"):
        return answer
    old, error["param"] = error["param"], responses_param(error["param"])
    if isinstance(error.get("message"), str) and "." in old:   # (a pydantic path in the text)
        error["message"] = error["message"].replace(f"{old}:", f"{error['param']}:")
    if body.get("param") == old:                   # (the body's top-level copy)
        body["param"], body["message"] = error["param"], error["message"]
    return JSONResponse(body, status_code=status)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request, stream: bool = False):
    if stream:      # (OpenAI replays the events of a background response; there are none here)
        return error_response("stream=true replays a background response's events; this "
                              "server has no background mode", 400, param="stream")
    stored = store(request.app).get(response_id)
    if stored is None:
        return _no_such_response(response_id, "response_id")
    return JSONResponse(stored.response)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, limit: int = 20,
                           order: str = "desc", after: str | None = None):
    """The input items of a stored response (this request's `input`, not the conversation
    of its previous_response_id), newest first by default, in OpenAI's list pages."""
    stored = store(request.app).get(response_id)
    if stored is None:
        return _no_such_response(response_id, "response_id")
    problem = list_args_problem(limit, 100, order)
    if problem is not None:
        return problem
    items = stored.inputs if order == "asc" else stored.inputs[::-1]
    page, more = paginate(items, limit, after)
    if page is None:
        return error_response(f"no input item with id {after!r}", 404, param="after")
    return list_page(page, more)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    if store(request.app).pop(response_id, None) is None:
        return _no_such_response(response_id, "response_id")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request):
    """OpenAI cancels background responses only; every response here was answered in full
    before its id was returned (no background mode), so a stored one is a 400, as OpenAI
    answers for a response that was not created in the background."""
    if store(request.app).get(response_id) is None:
        return _no_such_response(response_id, "response_id")
    return error_response("only background responses can be cancelled; this response was "
                          "answered in full (this server has no background mode)", 400,
                          param="response_id")
