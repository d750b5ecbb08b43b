"""POST /v1/completions: OpenAI's (legacy) text completions on top of one engine call.

Every prompt of the request, each with its n samples, goes to the engine in one call, so the n
samples of a prompt share its KV through the radix cache. Choice i is sample i % n of prompt
i // n, which is also the order the engine returns them in (prompt-major).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixlm.entrypoints.openai.logprobs import TextOffsets, extend_completion_logprobs
from radixlm.entrypoints.openai.protocol import CompletionRequest
from radixlm.entrypoints.openai.response_models import (CompletionChoice, CompletionLogprobs,
                                                        CompletionResponse,
                                                        CompletionStreamResponse, Usage, now)
from radixlm.entrypoints.openai.serving_base import (ChoiceStream, OpenAIError, OpenAIServing,
                                                     finish_type, make_usage, matched_stop, sse)


@dataclass
class _Prompts:
    ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)   # for echo


class CompletionServing(OpenAIServing):
    id_prefix = "cmpl"

    def __init__(self, request: Request, body: CompletionRequest):
        super().__init__(request, body)
        self.want_logprobs = body.logprobs is not None
        self.top_n = body.logprobs or 0

    async def handle(self):
        try:
            self.check_limits(self._num_prompts())
            prompts = self._prompts()
            kwargs = self._engine_kwargs(prompts)
            if self.body.stream:
                first, rest = await self.open_stream(**kwargs)
                return StreamingResponse(self._stream(first, rest, prompts),
                                         media_type="text/event-stream")
            results = await self.generate(**kwargs)
            return self._response(results, prompts)
        except OpenAIError as e:
            return e.response()

    # ------------------------------------------------------------------ request -> engine

    def _prompt_items(self) -> list[Any]:
        prompt = self.body.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [prompt]                       # one prompt given as token ids
        return list(prompt)                       # a batch of strings or of id lists

    def _num_prompts(self) -> int:
        return len(self._prompt_items())

    def _prompts(self) -> _Prompts:
        out = _Prompts()
        for item in self._prompt_items():
            if isinstance(item, str):
                ids = self.tokenize(item)
                out.ids.append(ids)
                # (echo shows what the model saw: a truncated prompt's kept tokens)
                cut = self.allow_auto_truncate and len(ids) == self.context_len - 1
                out.texts.append(self.engine.tokenizer.decode(ids) if cut else item)
            else:
                ids = self.fit_prompt(list(item))
                out.ids.append(ids)
                out.texts.append(self.engine.tokenizer.decode(ids) if self.body.echo else "")
        return out

    def _engine_kwargs(self, prompts: _Prompts) -> dict[str, Any]:
        params = [self.sampling_params(self.body, self.max_new_tokens(
                      len(ids), self.body.max_tokens, "max_tokens", default=16))
                  for ids in prompts.ids]
        kwargs: dict[str, Any] = {"input_ids": prompts.ids, "sampling_params": params,
                                  "rid": self.engine_rids(len(params))}
        if self.want_logprobs:
            # With echo, prompt logprobs too: from the first token on (its logprob is null).
            kwargs.update(return_logprob=True, top_logprobs_num=self.top_n,
                          logprob_start_len=0 if self.body.echo else -1,
                          return_text_in_logprobs=True)
        return kwargs

    # ------------------------------------------------------------------ engine -> response

    def _tops(self, meta: dict[str, Any], key: str) -> Optional[list]:
        return meta.get(key) if self.top_n > 0 else None

    def _response(self, results: list[dict], prompts: _Prompts) -> CompletionResponse:
        n = self.body.n
        choices = []
        for i, out in enumerate(results):
            meta = out["meta_info"]
            prefix = prompts.texts[i // n] if self.body.echo else ""
            logprobs = None
            if self.want_logprobs:
                logprobs, tok = CompletionLogprobs(), self.engine.tokenizer
                if self.body.echo:
                    extend_completion_logprobs(logprobs, meta.get("input_token_logprobs", []),
                                               self._tops(meta, "input_top_logprobs"),
                                               TextOffsets(0), tok)
                extend_completion_logprobs(logprobs, meta.get("output_token_logprobs", []),
                                           self._tops(meta, "output_top_logprobs"),
                                           TextOffsets(len(prefix)), tok)
            choices.append(CompletionChoice(index=i, text=prefix + out["text"], logprobs=logprobs,
                                            finish_reason=finish_type(meta),
                                            matched_stop=matched_stop(meta)))
        usage = make_usage([results[p * n]["meta_info"]["prompt_tokens"]
                            for p in range(len(prompts.ids))],
                           [r["meta_info"]["completion_tokens"] for r in results],
                           [results[p * n]["meta_info"].get("cached_tokens", 0)
                            for p in range(len(prompts.ids))])
        return CompletionResponse(id=self.request_id, model=self.model_name, choices=choices,
                                  usage=usage)

    def _stream(self, first: dict, rest: AsyncIterator[dict],
                prompts: _Prompts) -> AsyncIterator[str]:
        n, created = self.body.n, now()
        exclude = None if self.body.include_usage else {"usage"}

        def render(i: int, out: dict, st: ChoiceStream) -> Optional[str]:
            choice = self._stream_choice(i, out, st, prompts.texts[i // n])
            if choice is None:
                return None
            return sse(CompletionStreamResponse(id=self.request_id, created=created,
                                                model=self.model_name, choices=[choice],
                                                usage=self.usage_so_far),
                       exclude)

        def usage_chunk(usage: Usage) -> str:
            return sse(CompletionStreamResponse(id=self.request_id, created=created,
                                                model=self.model_name, choices=[], usage=usage))

        states = [ChoiceStream() for _ in range(len(prompts.ids) * n)]
        return self.stream_sse(first, rest, states, len(prompts.ids), render, usage_chunk)

    def _stream_choice(self, index: int, out: dict, st: ChoiceStream,
                       prompt_text: str) -> Optional[CompletionChoice]:
        """The next chunk of one choice (None when there is nothing new to say)."""
        meta, reason = out["meta_info"], finish_type(out["meta_info"])
        text = out["text"][st.text_len:]
        st.text_len = len(out["text"])
        logprobs = None
        if self.want_logprobs:
            logprobs = CompletionLogprobs()
            tok = self.engine.tokenizer
            if self.body.echo and not st.started:
                extend_completion_logprobs(logprobs, meta.get("input_token_logprobs", []),
                                           self._tops(meta, "input_top_logprobs"),
                                           TextOffsets(0), tok)
            entries = meta.get("output_token_logprobs", [])[st.logprobs_sent:]
            tops = self._tops(meta, "output_top_logprobs")
            if not st.started:
                st.offsets = TextOffsets(len(prompt_text) if self.body.echo else 0)
            extend_completion_logprobs(
                logprobs, entries, tops[st.logprobs_sent:] if tops is not None else None,
                st.offsets, tok)
            st.logprobs_sent += len(entries)
        if self.body.echo and not st.started:
            text = prompt_text + text
        st.started = True
        st.finished = reason is not None
        if not text and not (logprobs and logprobs.tokens) and reason is None:
            return None
        return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=reason,
                                matched_stop=matched_stop(meta))
