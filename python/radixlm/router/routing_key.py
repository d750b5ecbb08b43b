"""The text a request is routed by: what the worker's radix cache will see first.

/generate: `text` (or `input_ids`, one character per token id); for a batch, the first prompt
stands for the batch (the whole batch goes to one worker). /v1/completions: `prompt`.
/v1/chat/completions: the messages' roles and contents in order, so conversations that share
a system prompt and earlier turns share a prefix. Anything else (a malformed body, which the
worker will reject with its own 400) has no key and is routed by load.
"""

from __future__ import annotations

from typing import Any

MAX_CODE_POINT = 0x10FFFF


def _ids_key(ids: Any) -> str | None:
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        ids = ids[0]
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        return None
    return "".join(chr(min(t, MAX_CODE_POINT)) for t in ids)


def _first_text(text: Any) -> str | None:
    if isinstance(text, list) and text:
        text = text[0]
    return text if isinstance(text, str) else None


def _chat_key(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):   # content parts: the text ones
            content = "".join(p.get("text", "") for p in content
                              if isinstance(p, dict) and isinstance(p.get("text"), str))
        parts.append(f"<{m.get('role')}>{content if isinstance(content, str) else ''}")
    return "".join(parts)


def routing_key(path: str, body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    if path == "/generate":
        text = _first_text(body.get("text"))
        return text if text is not None else _ids_key(body.get("input_ids"))
    if path == "/v1/completions":
        prompt = body.get("prompt")
        text = _first_text(prompt)
        return text if text is not None else _ids_key(prompt)
    if path == "/v1/chat/completions":
        return _chat_key(body.get("messages"))
    return None
