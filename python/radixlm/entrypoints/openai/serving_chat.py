"""POST /v1/chat/completions: messages -> the model's chat template -> one engine call.

The n choices of the request are one engine request with n samples, so they share the
prompt's KV through the radix cache; the engine returns them in choice order.
"""

from __future__ import annotations

import functools
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixlm.entrypoints.openai.chat_output import ChoiceDeltas, OutputParsing
from radixlm.entrypoints.openai.chat_template import render_chat
from radixlm.entrypoints.openai.logprobs import chat_logprobs
from radixlm.entrypoints.openai.protocol import ChatCompletionRequest
from radixlm.entrypoints.openai.response_models import (ChatChoice, ChatCompletionChunk,
                                                        ChatCompletionResponse, ChatStreamChoice,
                                                        ChoiceLogprobs, DeltaMessage, now)
from radixlm.entrypoints.openai.serving_base import (ChoiceStream, OpenAIError, OpenAIServing,
                                                     finish_type, make_usage, matched_stop, sse)
from radixlm.entrypoints.openai.tool_calls import ToolPlan, plan_tools
from radixlm.managers.prompt_length import check_chars_fit
from radixlm.parsers.reasoning import get_reasoning_parser
from radixlm.utils.chat_templates import chat_template_stops


@functools.lru_cache(maxsize=16)
def single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of the one vocabulary entry spelled `text`, if there is one."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


class ChatServing(OpenAIServing):
    id_prefix = "chatcmpl"
    prompt_field = "messages"

    def __init__(self, request: Request, body: ChatCompletionRequest):
        super().__init__(request, body)
        self.args = request.app.state.server_args
        self.tools = ToolPlan()
        self.parsing = OutputParsing()
        self._deltas: list[ChoiceDeltas] = []   # per streamed choice

    async def handle(self):
        try:
            self.check_limits(1)
            self.tools = plan_tools(self.body, self.engine.tokenizer, self.args.tool_call_parser)
            self._check_messages_fit()
            prompt = render_chat(self.engine.tokenizer, self.body, self.tools)
            self.parsing = self._output_parsing(prompt)
            kwargs = self._engine_kwargs(self.tokenize(prompt, add_special_tokens=False))
            if self.body.stream:
                first, rest = await self.open_stream(**kwargs)
                return StreamingResponse(self._stream(first, rest),
                                         media_type="text/event-stream")
            return self._response(await self.generate(**kwargs))
        except OpenAIError as e:
            return e.response()

    def _check_messages_fit(self) -> None:
        """Before rendering (seconds of template work for a body of megabytes): messages whose
        text alone cannot fit the context, or more messages than it has tokens, are a 400."""
        if self.allow_auto_truncate:
            return
        messages = self.body.messages
        chars = sum(len(m.content) if isinstance(m.content, str)
                    else sum(len(p.text) for p in m.content or []) for m in messages)
        if len(messages) > self.context_len:
            raise OpenAIError(f"{len(messages)} messages do not fit the context length of "
                              f"{self.context_len} tokens", 400, param="messages")
        try:
            check_chars_fit(chars, self.engine.tokenizer, self.context_len)
        except ValueError as e:
            raise OpenAIError(str(e), 400, param="messages") from None

    # ------------------------------------------------------------------ request -> engine

    def _output_parsing(self, prompt: str) -> OutputParsing:
        reasoning = None
        if self.args.reasoning_parser and self.body.separate_reasoning:
            reasoning = get_reasoning_parser(self.args.reasoning_parser)
        # Output forced into a format (a tool call, response_format) leaves no room for a
        # thinking block, so it does not start inside one whatever the prompt says.
        fmt = self.body.response_format
        forced = self.tools.forced or (fmt is not None and fmt.type != "text")
        inside = reasoning is not None and not forced and reasoning.starts_inside(prompt)
        return OutputParsing(reasoning, inside, self.tools.parser, self.tools.max_calls,
                             self.tools.names)

    def _add_template_stops(self, params: dict[str, Any]) -> None:
        """A built-in --chat-template's end of turn stops the answer: as a stop string, and as
        a stop token where the tokenizer has it as one (decoding skips special tokens' text)."""
        stops = chat_template_stops(self.args.chat_template)
        if not stops:
            return
        given = params.get("stop") or []
        given = [given] if isinstance(given, str) else list(given)
        params["stop"] = given + [s for s in stops if s not in given]
        ids = [tid for s in stops if (tid := single_token_id(self.engine.tokenizer, s)) is not None]
        if ids:
            params["stop_token_ids"] = list(params.get("stop_token_ids") or []) + ids

    def _engine_kwargs(self, ids: list[int]) -> dict[str, Any]:
        max_new = self.max_new_tokens(len(ids), self.body.max_new_tokens,
                                      "max_completion_tokens"
                                      if self.body.max_completion_tokens is not None
                                      else "max_tokens")
        params = {**self.sampling_params(self.body, max_new), **self.tools.constraint}
        self._add_template_stops(params)
        if self.tools.keep_special_tokens:
            params["skip_special_tokens"] = False   # the call marker is a special token
        kwargs: dict[str, Any] = {"input_ids": [ids], "sampling_params": [params],
                                  "rid": self.engine_rids(1)}
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
            reason = finish_type(meta)
            message = self.parsing.message(out["text"], truncated=reason == "length")
            if message.tool_calls and reason == "stop":
                reason = "tool_calls"
            choices.append(ChatChoice(index=i, message=message, logprobs=logprobs,
                                      finish_reason=reason, matched_stop=matched_stop(meta)))
        usage = make_usage([results[0]["meta_info"]["prompt_tokens"]],
                           [r["meta_info"]["completion_tokens"] for r in results],
                           [results[0]["meta_info"].get("cached_tokens", 0)])
        return ChatCompletionResponse(id=self.request_id, model=self.model_name,
                                      choices=choices, usage=usage)

    def _chunk(self, created: int, choices: list[ChatStreamChoice], usage=None) -> str:
        chunk = ChatCompletionChunk(id=self.request_id, created=created, model=self.model_name,
                                    choices=choices, usage=usage or self.usage_so_far)
        return sse(chunk, None if self.body.include_usage else {"usage"})

    def _stream(self, first: dict, rest: AsyncIterator[dict]) -> AsyncIterator[str]:
        created, n = now(), self.body.n

        def render(i: int, out: dict, st: ChoiceStream) -> Optional[str]:
            choice = self._stream_choice(i, out, st)
            return None if choice is None else self._chunk(created, [choice])

        if self.body.continuous_usage:   # (vLLM's: on every chunk, the role's too)
            meta = first["meta_info"]
            self.usage_so_far = make_usage([meta["prompt_tokens"]], [0] * n,
                                           [meta.get("cached_tokens", 0)])
        # As OpenAI does: each choice opens with a delta that only names the role.
        preamble = [self._chunk(created, [ChatStreamChoice(
            index=i, delta=DeltaMessage(role="assistant", content=""))]) for i in range(n)]
        self._deltas = [ChoiceDeltas(self.parsing) for _ in range(n)]
        return self.stream_sse(first, rest, [ChoiceStream() for _ in range(n)], 1, render,
                               lambda usage: self._chunk(created, [], usage), preamble)

    def _stream_choice(self, index: int, out: dict,
                       st: ChoiceStream) -> Optional[ChatStreamChoice]:
        meta, reason = out["meta_info"], finish_type(out["meta_info"])
        if self.parsing.active:
            deltas = self._deltas[index]
            delta = deltas.delta(out["text"], final=reason is not None,
                                 truncated=reason == "length")
            if reason == "stop" and deltas.called:
                reason = "tool_calls"
        else:
            delta = DeltaMessage(content=out["text"][st.text_len:] or None)
        st.text_len = len(out["text"])
        logprobs = None
        if self.body.logprobs:
            logprobs, sent = self._logprobs(meta, st.logprobs_sent)
            st.logprobs_sent += sent
            if not sent:
                logprobs = None
        st.finished = reason is not None
        if delta == DeltaMessage() and logprobs is None and reason is None:
            return None
        return ChatStreamChoice(index=index, delta=delta,
                                logprobs=logprobs, finish_reason=reason,
                                matched_stop=matched_stop(meta))
