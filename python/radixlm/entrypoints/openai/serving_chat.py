"""POST /v1/chat/completions: messages -> the model's chat template -> one engine call.

The n choices of the request are one engine request with n samples, so they share the
prompt's KV through the radix cache; the engine returns them in choice order.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixlm.entrypoints.openai.logprobs import chat_logprobs
from radixlm.entrypoints.openai.protocol import (ChatChoice, ChatCompletionChunk,
                                                 ChatCompletionRequest, ChatCompletionResponse,
                                                 ChatMessage, ChatResponseMessage,
                                                 ChatStreamChoice, ChoiceLogprobs, DeltaMessage,
                                                 now)
from radixlm.entrypoints.openai.serving_base import (ChoiceStream, OpenAIError, OpenAIServing,
                                                     finish_type, make_usage, matched_stop, sse)

# Keys of apply_chat_template that this handler controls; chat_template_kwargs may not set them.
_RESERVED_TEMPLATE_KWARGS = {"conversation", "messages", "tokenize", "add_generation_prompt",
                             "continue_final_message", "tools", "return_dict"}


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
    return d


class ChatServing(OpenAIServing):
    id_prefix = "chatcmpl"
    prompt_field = "messages"

    def __init__(self, request: Request, body: ChatCompletionRequest):
        super().__init__(request)
        self.body = body

    async def handle(self):
        try:
            self.check_limits(1)
            kwargs = self._engine_kwargs(self.tokenize(self._render(), add_special_tokens=False))
            if self.body.stream:
                first, rest = await self.open_stream(**kwargs)
                return StreamingResponse(self._stream(first, rest),
                                         media_type="text/event-stream")
            return self._response(await self.generate(**kwargs))
        except OpenAIError as e:
            return e.response()

    # ------------------------------------------------------------------ request -> engine

    def _render(self) -> str:
        body = self.body
        kwargs = {k: v for k, v in (body.chat_template_kwargs or {}).items()
                  if k not in _RESERVED_TEMPLATE_KWARGS}
        if body.tools:
            kwargs["tools"] = body.tools
        # continue_final_message: the reply goes on from the last assistant message instead of
        # starting a new turn after it.
        kwargs["add_generation_prompt"] = not body.continue_final_message
        if body.continue_final_message:
            kwargs["continue_final_message"] = True
        messages = [template_message(m) for m in body.messages]
        try:
            text = self.engine.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        except Exception as e:  # a template that rejects the conversation is bad input
            raise OpenAIError(f"the chat template could not render these messages: "
                              f"{type(e).__name__}: {e}", 400, param="messages") from None
        if not isinstance(text, str):
            raise OpenAIError("the chat template did not render to text", 500)
        return text

    def _engine_kwargs(self, ids: list[int]) -> dict[str, Any]:
        max_new = self.max_new_tokens(len(ids), self.body.max_new_tokens,
                                      "max_completion_tokens"
                                      if self.body.max_completion_tokens is not None
                                      else "max_tokens")
        params = self.sampling_params(self.body, max_new)
        kwargs: dict[str, Any] = {"input_ids": [ids], "sampling_params": [params],
                                  "rid": [self.request_id]}
        if self.body.logprobs:
            kwargs.update(return_logprob=True, top_logprobs_num=self.body.top_logprobs or 0,
                          return_text_in_logprobs=True)
        return kwargs

    # ------------------------------------------------------------------ engine -> response

    def _logprobs(self, meta: dict[str, Any], start: int = 0) -> tuple[ChoiceLogprobs, int]:
        entries = meta.get("output_token_logprobs", [])[start:]
        tops = meta.get("output_top_logprobs")
        content = chat_logprobs(entries, tops[start:] if tops is not None else None,
                                self.engine.tokenizer)
        return ChoiceLogprobs(content=content), len(entries)

    def _response(self, results: list[dict]) -> ChatCompletionResponse:
        choices = []
        for i, out in enumerate(results):
            meta = out["meta_info"]
            logprobs = self._logprobs(meta)[0] if self.body.logprobs else None
            choices.append(ChatChoice(index=i, message=ChatResponseMessage(content=out["text"]),
                                      logprobs=logprobs, finish_reason=finish_type(meta),
                                      matched_stop=matched_stop(meta)))
        usage = make_usage([results[0]["meta_info"]["prompt_tokens"]],
                           [r["meta_info"]["completion_tokens"] for r in results])
        return ChatCompletionResponse(id=self.request_id, model=self.model_name,
                                      choices=choices, usage=usage)

    def _chunk(self, created: int, choices: list[ChatStreamChoice], usage=None) -> str:
        chunk = ChatCompletionChunk(id=self.request_id, created=created, model=self.model_name,
                                    choices=choices, usage=usage)
        return sse(chunk, None if self.body.include_usage else {"usage"})

    def _stream(self, first: dict, rest: AsyncIterator[dict]) -> AsyncIterator[str]:
        created, n = now(), self.body.n

        def render(i: int, out: dict, st: ChoiceStream) -> Optional[str]:
            choice = self._stream_choice(i, out, st)
            return None if choice is None else self._chunk(created, [choice])

        # As OpenAI does: each choice opens with a delta that only names the role.
        preamble = [self._chunk(created, [ChatStreamChoice(
            index=i, delta=DeltaMessage(role="assistant", content=""))]) for i in range(n)]
        return self.stream_sse(first, rest, [ChoiceStream() for _ in range(n)], 1, render,
                               lambda usage: self._chunk(created, [], usage), preamble)

    def _stream_choice(self, index: int, out: dict,
                       st: ChoiceStream) -> Optional[ChatStreamChoice]:
        meta, reason = out["meta_info"], finish_type(out["meta_info"])
        text = out["text"][st.text_len:]
        st.text_len = len(out["text"])
        logprobs = None
        if self.body.logprobs:
            logprobs, sent = self._logprobs(meta, st.logprobs_sent)
            st.logprobs_sent += sent
            if not sent:
                logprobs = None
        st.finished = reason is not None
        if not text and logprobs is None and reason is None:
            return None
        return ChatStreamChoice(index=index, delta=DeltaMessage(content=text or None),
                                logprobs=logprobs, finish_reason=reason,
                                matched_stop=matched_stop(meta))
