"""The Responses API's objects, built from a chat completion (responses.py, and the stream's
events in responses_stream.py): the Response skeleton from the request, output items (reasoning,
message with output_text, function_call), usage and status, and the store of responses."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class StoredResponse:
    response: dict[str, Any]             # the Response object
    messages: list[dict[str, Any]]       # the conversation it continues, and its answer
    inputs: list[dict[str, Any]]         # this request's input, as items with ids


# Stored responses kept, oldest dropped first (each holds its whole conversation)
MAX_STORED_RESPONSES = 10_000


# A chat field named in an error -> the Responses field the user wrote
_CHAT_TO_RESPONSES = {"messages": "input", "response_format": "text.format",
                      "max_tokens": "max_output_tokens",
                      "max_completion_tokens": "max_output_tokens"}


def responses_param(param: Any) -> Any:
    """An error's `param` from the chat handler, in the Responses request's terms."""
    if not isinstance(param, str):
        return param
    parts = param.split(".")
    if parts[0] == "tools" and len(parts) > 2 and parts[2] == "function":
        return ".".join(parts[:2] + parts[3:])    # (Responses tools are flat: tools.0.name)
    return _CHAT_TO_RESPONSES.get(parts[0].split("[")[0], param)


def store(app: Any) -> dict[str, StoredResponse]:
    if getattr(app.state, "responses", None) is None:
        app.state.responses = {}
    return app.state.responses


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def skeleton(body: dict[str, Any], rid: str, model: str) -> dict[str, Any]:
    """The Response object's fields that come from the request."""
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    return {
        "id": rid, "object": "response", "created_at": int(time.time()),
        "status": "in_progress", "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens":
            body.get("max_output_tokens"), "model": model, "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None}, "store": body.get("store", True),
        "temperature": body.get("temperature"), "text": {"format": fmt or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p"), "truncation": "disabled", "usage": None,
        "user": body.get("user"), "metadata": body.get("metadata") or {},
        "top_logprobs": body.get("top_logprobs") or 0, "max_tool_calls":
            body.get("max_tool_calls"), "service_tier": "default",
        "prompt_cache_key": body.get("prompt_cache_key"),
        "safety_identifier": body.get("safety_identifier"),
    }


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    details = chat_usage.get("prompt_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0),
                                     "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


# Chat finish reasons that leave the answer cut, and the Response's incomplete_details reason:
# max_output_tokens, or an abort (POST /abort_request, the server stopping), which OpenAI's
# API has no reason for: "cancelled" says what happened.
_CUT = {"length": "max_output_tokens", "abort": "cancelled"}


def is_cut(finish_reason: str | None) -> bool:
    return (finish_reason or "") in _CUT


def finish(response: dict[str, Any], finish_reason: str | None) -> None:
    """Status from the chat's finish reason: cut (max_output_tokens, an abort) -> incomplete,
    so that a cut answer is never stored, nor continued, as a complete one."""
    reason = _CUT.get(finish_reason or "")
    if reason is not None:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": reason}
        for item in response["output"]:     # (the message that was cut)
            if item["type"] == "message":
                item["status"] = "incomplete"
    else:
        response["status"] = "completed"


def output_items(message: dict[str, Any], logprobs: Any = None) -> list[dict[str, Any]]:
    """A chat answer's message as Response output items."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(message["reasoning_content"]))
    if message.get("content") or not message.get("tool_calls"):
        items.append(message_item(message.get("content") or "", logprobs))
    for call in message.get("tool_calls") or []:
        items.append(function_call_item(call["id"], call["function"]["name"],
                                        call["function"]["arguments"]))
    return items


def reasoning_item(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def message_item(text: str, logprobs: Any = None, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id or new_id("msg"), "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": output_logprobs(logprobs)}]}


def function_call_item(call_id: str, name: str, arguments: str,
                       item_id: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call_id,
            "name": name, "arguments": arguments, "status": "completed"}


def output_logprobs(chat_logprobs: Any) -> list[dict[str, Any]]:
    """A chat choice's logprobs as output_text logprobs."""
    content = (chat_logprobs or {}).get("content") or []
    return [{"token": t["token"], "logprob": t["logprob"], "bytes": t.get("bytes"),
             "top_logprobs": [{"token": a["token"], "logprob": a["logprob"],
                               "bytes": a.get("bytes")} for a in t.get("top_logprobs") or []]}
            for t in content]


def input_items(raw: Any) -> list[dict[str, Any]]:
    """A request's `input` (already checked by responses.input_messages) as the items that
    GET /v1/responses/{id}/input_items lists: each with an id, messages with typed text parts."""
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) \
        else raw
    out = []
    for item in items:
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind == "message":
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            if isinstance(item.get("content"), str):
                item["content"] = [{"type": part, "text": item["content"]}]
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                  "reasoning": "rs"}.get(kind, "item")
        item.setdefault("id", new_id(prefix))
        item.setdefault("status", "completed")
        out.append(item)
    return out


def remember(app: Any, response: dict[str, Any], conversation: list[dict[str, Any]],
             message: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
    """Keep a stored response and its conversation with the answer (for
    previous_response_id; without the request's instructions, which are not carried over)."""
    if not response.get("store", True):
        return
    answer: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        answer["tool_calls"] = message["tool_calls"]
    stored = store(app)
    stored[response["id"]] = StoredResponse(response, conversation + [answer], inputs)
    while len(stored) > MAX_STORED_RESPONSES:
        del stored[next(iter(stored))]
