"""A streamed Response: the chat handler's SSE chunks rewritten as the Responses API's events
(response.created, response.in_progress, then per output item output_item.added, its deltas
and its .done events, and response.completed / response.incomplete with the whole Response).
Each event carries a sequence_number; the stream ends after the last event (no [DONE])."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi.responses import StreamingResponse

from radixlm.entrypoints.openai import responses_items as r


class _EventWriter:
    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class _OpenItem:
    """The output item being streamed: its index, object and the text gathered so far."""

    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index, self.item, self.text = index, item, ""
        self.logprobs: list[dict[str, Any]] = []      # (a message's output_text logprobs)


async def _chat_chunks(answer: StreamingResponse) -> AsyncIterator[dict[str, Any]]:
    async for piece in answer.body_iterator:
        text = piece.decode() if isinstance(piece, bytes) else piece
        # (SSE lines end at \n only: str.splitlines() would also cut at U+2028, U+2029 and
        # U+0085, which the chat's JSON holds unescaped)
        for line in text.split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


async def stream_response(app: Any, body: dict[str, Any], conversation: list[dict[str, Any]],
                          model: str, answer: StreamingResponse) -> AsyncIterator[str]:
    emit = _EventWriter()
    response = r.skeleton(body, r.new_id("resp"), model)
    yield emit("response.created", response=response)
    yield emit("response.in_progress", response=response)
    items: list[dict[str, Any]] = []
    open_item: _OpenItem | None = None
    calls: dict[int, _OpenItem] = {}
    finish_reason, message = None, {"content": "", "tool_calls": []}
    pending_logprobs: list[dict[str, Any]] = []     # (of tokens whose text is not out yet)

    def close(item: _OpenItem | None, cut: bool = False) -> list[str]:
        """The item's .done events; `cut`: the answer ended there without finishing (a
        message's status is then incomplete, as r.finish marks it)."""
        if item is None:
            return []
        it, out = item.item, []
        it["status"] = "incomplete" if cut and it["type"] == "message" else "completed"
        if it["type"] == "message":
            item.logprobs += pending_logprobs
            pending_logprobs.clear()
            part = {"type": "output_text", "text": item.text, "annotations": [],
                    "logprobs": item.logprobs}
            it["content"] = [part]
            out += [emit("response.output_text.done", item_id=it["id"], output_index=item.index,
                         content_index=0, text=item.text, logprobs=item.logprobs),
                    emit("response.content_part.done", item_id=it["id"],
                         output_index=item.index, content_index=0, part=part)]
        elif it["type"] == "reasoning":
            it["content"] = [{"type": "reasoning_text", "text": item.text}]
            out.append(emit("response.reasoning_text.done", item_id=it["id"],
                            output_index=item.index, content_index=0, text=item.text))
        else:
            it["arguments"] = item.text
            out.append(emit("response.function_call_arguments.done", item_id=it["id"],
                            output_index=item.index, arguments=item.text))
        return out + [emit("response.output_item.done", output_index=item.index, item=it)]

    def start(item: dict[str, Any]) -> tuple[_OpenItem, list[str]]:
        opened = _OpenItem(len(items), item)
        items.append(item)
        return opened, [emit("response.output_item.added", output_index=opened.index,
                             item={**item, "status": "in_progress"})]

    async for chunk in _chat_chunks(answer):
        if "error" in chunk:
            error = chunk["error"]
            yield emit("error", code=str(error.get("code")), message=error.get("message"),
                       param=r.responses_param(error.get("param")))
            return
        if chunk.get("usage") and not chunk.get("choices"):
            response["usage"] = r.usage(chunk["usage"])
            continue
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            finish_reason = choice.get("finish_reason") or finish_reason
            pending_logprobs += r.output_logprobs(choice.get("logprobs"))
            if delta.get("reasoning_content"):
                if open_item is None or open_item.item["type"] != "reasoning":
                    for event in close(open_item):
                        yield event
                    open_item, events = start({"type": "reasoning", "id": r.new_id("rs"),
                                               "summary": [], "content": []})
                    for event in events:
                        yield event
                open_item.text += delta["reasoning_content"]
                yield emit("response.reasoning_text.delta", item_id=open_item.item["id"],
                           output_index=open_item.index, content_index=0,
                           delta=delta["reasoning_content"])
            if delta.get("content"):
                if open_item is None or open_item.item["type"] != "message":
                    for event in close(open_item):
                        yield event
                    open_item, events = start({"type": "message", "id": r.new_id("msg"),
                                               "role": "assistant", "content": []})
                    events.append(emit(
                        "response.content_part.added", item_id=open_item.item["id"],
                        output_index=open_item.index, content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []}))
                    for event in events:
                        yield event
                open_item.text += delta["content"]
                message["content"] += delta["content"]
                sent, pending_logprobs = pending_logprobs, []
                open_item.logprobs += sent
                yield emit("response.output_text.delta", item_id=open_item.item["id"],
                           output_index=open_item.index, content_index=0,
                           delta=delta["content"], logprobs=sent)
            for call in delta.get("tool_calls") or []:
                k = call["index"]
                if k not in calls:
                    # (each item is finished before the next starts, as OpenAI streams them)
                    for event in close(open_item):
                        yield event
                    open_item = None
                    if calls:
                        for event in close(calls[max(calls)]):
                            yield event
                    fn = call.get("function") or {}
                    calls[k], events = start(r.function_call_item(
                        call.get("id"), fn.get("name"), ""))
                    message["tool_calls"].append({"id": call.get("id"), "type": "function",
                                                  "function": {"name": fn.get("name"),
                                                               "arguments": ""}})
                    for event in events:
                        yield event
                piece = (call.get("function") or {}).get("arguments") or ""
                if piece:
                    calls[k].text += piece
                    message["tool_calls"][k]["function"]["arguments"] += piece
                    yield emit("response.function_call_arguments.delta",
                               item_id=calls[k].item["id"], output_index=calls[k].index,
                               delta=piece)
    if not items:      # (an empty answer is still one message, announced as any other)
        open_item, events = start({"type": "message", "id": r.new_id("msg"),
                                   "role": "assistant", "content": []})
        for event in events:
            yield event
    cut = r.is_cut(finish_reason)
    for event in close(open_item, cut):
        yield event
    if calls:
        for event in close(calls[max(calls)], cut):
            yield event
    response["output"] = items
    r.finish(response, finish_reason)
    if not message["tool_calls"]:
        del message["tool_calls"]
    r.remember(app, response, conversation, message, r.input_items(body["input"]))
    yield emit("response.incomplete" if response["status"] == "incomplete"
               else "response.completed", response=response)
