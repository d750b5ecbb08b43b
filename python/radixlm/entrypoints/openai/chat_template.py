"""Chat messages -> the prompt text, through the model's chat template.

Templates see messages as HF templates expect them: content parts joined into one string,
`developer` as `system`, and a call's `arguments` as an object (OpenAI sends a JSON string;
templates apply `tojson` to it). Where the template cannot render tools (ToolPlan.history_format
set), past calls are written into the assistant's text in the tool-call parser's format, and
the tools are described in a system prompt.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from radixlm.entrypoints.openai.serving_base import OpenAIError
from radixlm.entrypoints.openai.tool_calls import ToolPlan
from radixlm.parsers.function_call import ToolCallParser



def template_message(m: ChatMessage) -> dict[str, Any]:
    """A message as the chat template sees it: content parts joined into one string (templates
    of text models expect a string), `developer` as `system` (OpenAI's newer name for it), and
    every other key (tool_calls, tool_call_id, name, ...) passed through as given."""
    d = {k: v for k, v in m.model_dump().items() if v is not None}
    d["role"] = "system" if m.role == "developer" else m.role
    if isinstance(m.content, list):
        d["content"] = "\n".join(part.text for part in m.content)
    else:
        # null content (an assistant turn that only calls tools) as "": templates that know
        # nothing of tools concatenate content and would fail on None.
        d["content"] = m.content or ""
    if m.tool_calls:
        d["tool_calls"] = [_template_call(c) for c in m.tool_calls]
    return d


def _arguments(call: dict[str, Any]) -> Any:
    args = (call.get("function") or {}).get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    fn["arguments"] = _arguments(call)
    return {**call, "function": fn}


def _inline_calls(d: dict[str, Any], fmt: ToolCallParser) -> dict[str, Any]:
    """An assistant message's calls written into its text, for templates without tools."""
    calls = d.pop("tool_calls", None)
    if calls:
        written = "\n".join(fmt.render_call((c.get("function") or {}).get("name", ""),
                                            c["function"]["arguments"]) for c in calls)
        d["content"] = f"{d['content']}\n{written}" if d["content"] else written
    return d


def template_messages(body: ChatCompletionRequest, plan: ToolPlan) -> list[dict[str, Any]]:
    messages = [template_message(m) for m in body.messages]
    if plan.history_format is not None:
        messages = [_inline_calls(d, plan.history_format) for d in messages]
    if plan.system_prompt:
        if messages[0]["role"] == "system":
            messages[0] = {**messages[0],
                           "content": f"{messages[0]['content']}\n\n{plan.system_prompt}"}
        else:
            messages.insert(0, {"role": "system", "content": plan.system_prompt})
    return messages


def render_chat(tokenizer, body: ChatCompletionRequest, plan: ToolPlan) -> str:
    # (the request's validation moved add_generation_prompt and continue_final_message out
    # of chat_template_kwargs, and refused the keys set here)
    kwargs = dict(body.chat_template_kwargs or {})
    if plan.template_tools:
        kwargs["tools"] = plan.template_tools
    # continue_final_message: the reply goes on from the last assistant message instead of
    # starting a new turn after it.
    kwargs["add_generation_prompt"] = body.add_generation_prompt and not body.continue_final_message
    if body.continue_final_message:
        kwargs["continue_final_message"] = True
    try:
        text = tokenizer.apply_chat_template(template_messages(body, plan), tokenize=False,
                                             **kwargs)
    except Exception as e:  # a template that rejects the conversation is bad input
        raise OpenAIError(f"the chat template could not render these messages: "
                          f"{type(e).__name__}: {e}", 400, param="messages") from None
    if not isinstance(text, str):
        raise OpenAIError("the chat template did not render to text", 500)
    return text
