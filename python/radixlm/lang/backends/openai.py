"""OpenAI: any OpenAI-compatible endpoint (OpenAI itself, a radixlm or SGLang server's /v1,
vLLM, ...), through the official client.

A program that writes chat roles talks to /v1/chat/completions (the endpoint applies its own
template, so the state's text is only a readable transcript); one without roles talks to
/v1/completions with the whole text as the prompt. Settings the OpenAI API lacks (top_k, min_p,
regex, ...) are sent as extra body fields, and only when set, so that strict endpoints do not
reject them.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from radixlm.lang.backends.base import (Backend, GenResult, PromptContext, SelectResult,
                                        StreamChunk)
from radixlm.lang.choices import ChoicesMethod
from radixlm.lang.errors import (BackendError, BackendUnavailableError, RequestRejectedError,
                                 UnsupportedByBackendError)
from radixlm.lang.ir import SamplingArgs

# Extra body fields and the value that means "not set" (so it is not sent).
_EXTRA_DEFAULTS: dict[str, Any] = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                   "ignore_eos": False, "min_new_tokens": 0,
                                   "stop_token_ids": None, "stop_regex": None, "regex": None,
                                   "json_schema": None}


class OpenAI(Backend):
    def __init__(self, model_name: str, base_url: str | None = None,
                 api_key: str | None = None, is_chat_model: bool | None = None,
                 **client_kwargs: Any):
        super().__init__()
        import openai

        self._openai = openai
        self.model_name = model_name
        self.is_chat_model = is_chat_model   # None: decide per program (roles -> chat)
        self.client = openai.OpenAI(base_url=base_url,
                                    api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    **client_kwargs)

    def __repr__(self) -> str:
        return f"OpenAI({self.model_name!r}, base_url={str(self.client.base_url)!r})"

    # ------------------------------------------------------------------ requests

    def _use_chat(self, ctx: PromptContext) -> bool:
        if self.is_chat_model is not None:
            return self.is_chat_model
        return ctx.role is not None or bool(ctx.messages)

    def _chat_messages(self, ctx: PromptContext) -> list[dict[str, str]]:
        if ctx.role not in (None, "assistant") or ctx.role_content:
            raise UnsupportedByBackendError(
                "with a chat endpoint, gen() must start an assistant message: write "
                "assistant(gen(...)) (the endpoint cannot continue a partly written message)")
        if not ctx.messages:
            return [{"role": "user", "content": ctx.text}]  # a forced chat model, no roles
        return ctx.messages

    @staticmethod
    def _params(args: SamplingArgs) -> dict[str, Any]:
        params: dict[str, Any] = {"max_tokens": args.max_new_tokens, "n": args.n,
                                  "temperature": args.temperature, "top_p": args.top_p,
                                  "frequency_penalty": args.frequency_penalty,
                                  "presence_penalty": args.presence_penalty,
                                  "stop": args.stop, "seed": args.sampling_seed}
        params = {k: v for k, v in params.items() if v is not None}
        extra = {k: v for k, default in _EXTRA_DEFAULTS.items()
                 if (v := getattr(args, k)) is not None and v != default}
        if "min_new_tokens" in extra:
            extra["min_tokens"] = extra.pop("min_new_tokens")
        if extra:
            params["extra_body"] = extra
        return params

    def _create(self, ctx: PromptContext, args: SamplingArgs, stream: bool) -> tuple[Any, bool]:
        chat = self._use_chat(ctx)
        params = self._params(args)
        if stream:
            params.update(stream=True, stream_options={"include_usage": True})
        try:
            if chat:
                return self.client.chat.completions.create(
                    model=self.model_name, messages=self._chat_messages(ctx), **params), chat
            return self.client.completions.create(model=self.model_name, prompt=ctx.text,
                                                  **params), chat
        except self._openai.OpenAIError as e:
            raise self._translate(e) from e

    def _translate(self, e: Exception) -> Exception:
        oa = self._openai
        if isinstance(e, oa.APITimeoutError):
            return BackendError(f"{self.client.base_url} did not answer within the client's "
                                f"timeout: {e}")
        if isinstance(e, oa.APIConnectionError):
            return BackendUnavailableError(f"cannot reach {self.client.base_url}: {e}")
        if isinstance(e, (oa.BadRequestError, oa.UnprocessableEntityError)):
            return RequestRejectedError(f"the endpoint rejected the request: {e}")
        if isinstance(e, oa.APIStatusError) and e.status_code == 503:
            return BackendUnavailableError(f"the endpoint cannot serve requests: {e}")
        return BackendError(f"the OpenAI-compatible endpoint failed: {e}")

    @staticmethod
    def _meta(resp_id: str, finish: str | None, usage: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"id": resp_id, "finish_reason": {"type": finish or "stop"}}
        if usage is not None:
            meta["prompt_tokens"] = usage.prompt_tokens
            meta["completion_tokens"] = usage.completion_tokens
            details = getattr(usage, "prompt_tokens_details", None)
            meta["cached_tokens"] = getattr(details, "cached_tokens", 0) or 0
        return meta

    # ------------------------------------------------------------------ Backend

    def api_speculation(self, ctx: PromptContext) -> str | None:
        # Completions continue the text, so one call can run past a gen's stop into the
        # template's next fields; a chat call writes one whole assistant message.
        return "chat" if self._use_chat(ctx) else "completion"

    def generate(self, ctx: PromptContext, args: SamplingArgs) -> GenResult:
        resp, chat = self._create(ctx, args, stream=False)
        choices = sorted(resp.choices, key=lambda c: c.index)
        texts = [(c.message.content or "") if chat else c.text for c in choices]
        # (usage covers the whole request: it goes with the first sample's meta_info)
        metas = [self._meta(resp.id, c.finish_reason, resp.usage if i == 0 else None)
                 for i, c in enumerate(choices)]
        self.usage.add(metas[0])
        return GenResult.of_samples(texts, metas)

    def generate_stream(self, ctx: PromptContext, args: SamplingArgs) -> Iterator[StreamChunk]:
        stream, chat = self._create(ctx, args, stream=True)
        finish, usage, resp_id = None, None, ""
        try:
            for chunk in stream:
                resp_id = chunk.id or resp_id
                usage = chunk.usage or usage
                for choice in chunk.choices or []:
                    delta = (choice.delta.content or "") if chat else (choice.text or "")
                    finish = choice.finish_reason or finish
                    if delta:
                        yield StreamChunk(delta)
        except self._openai.OpenAIError as e:
            raise self._translate(e) from e
        meta = self._meta(resp_id, finish, usage)
        self.usage.add(meta)
        yield StreamChunk("", meta)

    def select(self, ctx: PromptContext, choices: list[str], method: ChoicesMethod,
               temperature: float) -> SelectResult:
        """Through legacy completions with `echo` + `logprobs` (prompt logprobs), where the
        endpoint supports them; otherwise a clear UnsupportedByBackendError."""
        if not ctx.text:
            raise ValueError("select needs prompt text before it: a choice's first token has "
                             "nothing before it to be scored on")
        if method.requires_unconditional_logprobs:
            # Its echo logprobs come per text token, with no token ids: the choice's tokens
            # cannot be scored alone exactly as they were tokenized after the prompt.
            raise UnsupportedByBackendError(
                f"choices_method={method.name} is not supported by the OpenAI backend: it "
                f"needs each choice's token logprobs without the prompt, by token id; use a "
                f"radixlm backend (RuntimeEndpoint or Engine)")
        if self._use_chat(ctx):
            raise UnsupportedByBackendError(
                "select() is not supported by the OpenAI backend inside chat roles: chat "
                "endpoints do not return prompt logprobs; use a radixlm backend "
                "(RuntimeEndpoint or Engine), or gen() with a regex")
        try:
            resp = self.client.completions.create(
                model=self.model_name, prompt=[ctx.text + c for c in choices], max_tokens=0,
                echo=True, logprobs=0, temperature=0)
        except self._openai.OpenAIError as e:
            raise UnsupportedByBackendError(
                f"select() is not supported by this OpenAI-compatible endpoint: it did not "
                f"return prompt logprobs (completions with echo + logprobs): {e}") from e
        logprobs: list[list[float]] = [[] for _ in choices]
        for out in resp.choices:
            lp = out.logprobs
            if lp is None or not lp.token_logprobs or lp.text_offset is None:
                raise UnsupportedByBackendError(
                    "select() is not supported by this OpenAI-compatible endpoint: it returned "
                    "no prompt logprobs for echo=True")
            start, end = len(ctx.text), len(ctx.text) + len(choices[out.index])
            # The choice's tokens: those whose text overlaps the choice's characters.
            logprobs[out.index] = [
                v for tok, off, v in zip(lp.tokens, lp.text_offset, lp.token_logprobs)
                if v is not None and off < end and off + len(tok) > start]
        decision = method(logprobs, temperature)
        return SelectResult(decision.index, choices[decision.index], decision.scores,
                            {"normalized_prompt_logprobs": decision.scores, **decision.meta,
                             "choices_method": method.name})
