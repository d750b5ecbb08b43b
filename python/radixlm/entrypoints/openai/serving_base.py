"""What /v1/completions and /v1/chat/completions share: errors, prompt length checks, the
mapping of OpenAI fields onto SGLang sampling_params, and the engine calls (one per request,
aborted when the client goes away)."""

from __future__ import annotations

import asyncio
import json
import dataclasses
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from radixlm.entrypoints.errors import error_body, error_response
from radixlm.entrypoints.request_limits import LimitExceeded, check_request_limits
from radixlm.entrypoints.server_info import model_name
from radixlm.entrypoints.openai.logprobs import TextOffsets
from radixlm.entrypoints.openai.protocol import SamplingExtras
from radixlm.entrypoints.openai.response_models import PromptTokensDetails, Usage
from radixlm.managers.prompt_length import check_text_fits, context_exceeded, fit_to_context
from radixlm.sampling.params import CONSTRAINT_KINDS, SamplingParams
from radixlm.managers.tokenizer_manager import EngineDeadError, RequestRefusedError
from radixlm.entrypoints.disconnect import ClientDisconnected, unless_disconnected

logger = logging.getLogger(__name__)



class OpenAIError(Exception):
    """An error to return in OpenAI's shape with an HTTP status."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def response(self) -> JSONResponse:
        return error_response(self.message, self.status, param=self.param)

    def body(self) -> dict:
        return error_body(self.message, self.status, param=self.param)


def engine_error(e: BaseException) -> OpenAIError:
    """Exceptions from the engine -> HTTP errors: bad input is the client's (400), a dead
    engine is unavailability (503), anything else is ours (500)."""
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ValueError):
        return OpenAIError(str(e), 400, param=_constraint_param(str(e)))
    if isinstance(e, EngineDeadError):
        return OpenAIError(str(e), 503)
    if isinstance(e, RequestRefusedError):
        return OpenAIError(str(e), e.status)
    logger.exception("OpenAI request failed", exc_info=e)
    return OpenAIError(f"internal error: {type(e).__name__}: {e}", 500)


def failed(meta: dict[str, Any]) -> bool:
    """An abort that is an error: it carries an HTTP status (400: the request cannot be
    served, 503: the server stops, 500: an internal failure). A client's own abort
    (/abort_request) has none: its choice ends with finish_reason "abort", as in SGLang."""
    reason = meta.get("finish_reason")
    return bool(reason) and reason.get("type") == "abort" and bool(reason.get("status_code"))


# sampling_params' names in the engine's messages -> the OpenAI request's field
_OPENAI_FIELD = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def _constraint_param(message: str) -> Optional[str]:
    """The request field an engine error is about, from its words: a constraint's compile
    error ("invalid regex: ...", "json_schema is not valid JSON: ...") or a sampling check,
    which starts with the field's name ("top_k must be ...", "stop strings must ...")."""
    for kind in CONSTRAINT_KINDS:
        if message.startswith((f"invalid {kind}:", f"{kind} is not valid")):
            return kind
    word = re.match(r"[a-z_]+", message)
    name = word.group() if word else ""
    if name == "stop" or name in _SAMPLING_FIELDS:
        return _OPENAI_FIELD.get(name, name)
    return None


def abort_error(meta: dict[str, Any]) -> OpenAIError:
    """The whole request fails with an aborted sequence's status (see `failed`)."""
    reason = meta.get("finish_reason") or {}
    message = reason.get("message") or "the request was aborted"
    return OpenAIError(message, reason.get("status_code") or 500)


def served_model_name(request: Request) -> str:
    return model_name(request.app.state.server_args)


def sse(obj: BaseModel | dict, exclude: Optional[set[str]] = None) -> str:
    data = obj.model_dump_json(exclude=exclude) if isinstance(obj, BaseModel) \
        else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def structured_output(req: SamplingExtras) -> dict[str, Any]:
    """The one output constraint of a request as sampling_params: OpenAI's response_format or
    SGLang's json_schema / regex / ebnf. Two at once is a 400 (the native API agrees), never one
    silently winning."""
    given = {name: getattr(req, name) for name in ("json_schema", "regex", "ebnf")
             if getattr(req, name) is not None}
    fmt = req.response_format
    if fmt is not None and fmt.type == "structural_tag":
        if given:
            raise OpenAIError(f"response_format cannot be combined with {', '.join(given)}: "
                              f"give one output constraint", 400, param="response_format")
        tag = fmt.model_dump(include={"type", "structures", "triggers", "format"},
                             exclude_none=True)
        return {"structural_tag": json.dumps(tag)}
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            schema: Any = {"type": "object"}
        elif fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise OpenAIError("response_format of type json_schema needs json_schema.schema",
                              400, param="response_format")
        else:
            schema = fmt.json_schema.schema_
        if given:
            raise OpenAIError(f"response_format cannot be combined with {', '.join(given)}: "
                              f"give one output constraint", 400, param="response_format")
        return {"json_schema": json.dumps(schema)}
    if len(given) > 1:
        raise OpenAIError(f"only one of json_schema, regex, ebnf may be set, got "
                          f"{sorted(given)}", 400, param=sorted(given)[1])
    if isinstance(given.get("json_schema"), dict):
        given["json_schema"] = json.dumps(given["json_schema"])
    return given


def finish_type(meta: dict[str, Any]) -> Optional[str]:
    reason = meta.get("finish_reason")
    return reason.get("type") if reason else None


def matched_stop(meta: dict[str, Any]) -> Any:
    reason = meta.get("finish_reason")
    return reason.get("matched") if reason and reason.get("type") == "stop" else None


def make_usage(prompt_tokens: list[int], completion_tokens: list[int],
               cached_tokens: Optional[list[int]] = None) -> Usage:
    """prompt_tokens and cached_tokens (prompt tokens served from the prefix cache): one per
    prompt (not per choice); completion_tokens: one per choice. Cached tokens are reported by
    default (SGLang and vLLM hide them behind a flag; clients ask for them)."""
    p, c = sum(prompt_tokens), sum(completion_tokens)
    details = PromptTokensDetails(cached_tokens=sum(cached_tokens or ()))
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c,
                 prompt_tokens_details=details)


@dataclass
class ChoiceStream:
    """What has been sent so far for one choice of a streamed response."""
    text_len: int = 0          # characters of the engine's cumulative text already sent
    logprobs_sent: int = 0     # output logprob entries already sent
    offsets: Optional[TextOffsets] = None   # completions: where its tokens start in its text
    started: bool = False      # completions: the echoed prompt has been sent
    finished: bool = False
    completion_tokens: int = 0


class OpenAIServing:
    """Base of the two handlers: holds the engine and knows the model's limits."""

    id_prefix = "cmpl"
    prompt_field = "prompt"   # the request field that holds the prompt, for error params

    def __init__(self, request: Request, body: SamplingExtras):
        self.http_request = request
        self.body = body
        self.engine = request.app.state.engine
        # The response names the model the request asked for, as SGLang's does (this server
        # serves its one model under any name); without one, the served name.
        self.model_name = body.model or served_model_name(request)
        self.context_len: int = self.engine.ready.context_len
        self.allow_auto_truncate: bool = request.app.state.server_args.allow_auto_truncate
        # SGLang's `rid`, a string: the response's id too (a list names a batch's prompts)
        self.request_id = body.rid if isinstance(body.rid, str) else \
            f"{self.id_prefix}-{uuid.uuid4().hex}"
        # stream_options.continuous_usage_stats: the usage so far, for the next chunk
        self.usage_so_far: Optional[Usage] = None

    def engine_rids(self, num_prompts: int) -> list[str]:
        """The engine's request id of each prompt: the `rid` list as given, a single rid for
        one prompt, rid_0, rid_1, ... for several (as the native API names a batch's)."""
        rid = self.body.rid
        if isinstance(rid, list):
            if len(rid) != num_prompts:
                raise OpenAIError(f"rid has {len(rid)} entries for {num_prompts} prompts", 400,
                                  param="rid")
            if len(set(rid)) != len(rid):
                raise OpenAIError("rid: the request ids of one request must be distinct", 400,
                                  param="rid")
            return list(rid)
        if num_prompts == 1:
            return [self.request_id]
        return [f"{self.request_id}_{i}" for i in range(num_prompts)]

    # ------------------------------------------------------------------ prompts

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # Tokenized here rather than in the engine so the length checks below can run first.
        # Chat templates render their own special tokens, hence add_special_tokens=False there.
        if not self.allow_auto_truncate:
            try:
                check_text_fits(text, self.engine.tokenizer, self.context_len)
            except ValueError as e:
                raise OpenAIError(str(e), 400, param=self.prompt_field) from None
        return self.fit_prompt(
            list(self.engine.tokenizer(text, add_special_tokens=add_special_tokens).input_ids))

    def fit_prompt(self, ids: list[int]) -> list[int]:
        """The prompt's ids, cut to the context with --allow-auto-truncate; otherwise
        unchanged (a prompt that leaves no room is refused by max_new_tokens)."""
        if not self.allow_auto_truncate:
            return ids
        return fit_to_context(ids, self.context_len, allow_truncate=True)

    def max_new_tokens(self, prompt_len: int, requested: Optional[int], field: str,
                       default: Optional[int] = None) -> int:
        """The completion budget for one prompt: what was asked for (else the server's
        --preferred-sampling-params max_new_tokens, else `default`, else all the context
        leaves). A budget the request names past what the context leaves is a 400 naming
        `field`, as SGLang and OpenAI answer it (--allow-auto-truncate: clamped); a default is
        clamped (the response then ends with finish_reason "length"). A prompt that leaves no
        room at all is a 400."""
        named = requested is not None
        if requested is None:
            preferred = self.http_request.app.state.preferred_sampling_params
            requested = preferred.get("max_new_tokens", default)
        room = self.context_len - prompt_len
        if room <= 0:
            raise OpenAIError(f"the prompt has {prompt_len} tokens, which does not fit the "
                              f"model's context length of {self.context_len} tokens",
                              400, param=self.prompt_field)
        if named and requested > room and not self.allow_auto_truncate:
            raise OpenAIError(context_exceeded(self.context_len, prompt_len, requested), 400,
                              param=field)
        return room if requested is None else min(requested, room)

    def check_limits(self, num_prompts: int) -> None:
        """The server's per-request limits (--max-n-per-request, ...), before any tokenizing."""
        body = self.body
        stops = [body.stop] if isinstance(body.stop, list) else []
        try:
            check_request_limits(self.http_request.app.state.server_args, num_prompts,
                                 [body.n], stops)
            if isinstance(body.stop_regex, list):
                check_request_limits(self.http_request.app.state.server_args, num_prompts, [],
                                     [body.stop_regex], stop_field="stop_regex")
        except LimitExceeded as e:
            param = self.prompt_field if e.field == "prompts" else e.field
            raise OpenAIError(str(e), 400, param=param) from None

    def sampling_params(self, req: SamplingExtras, max_new_tokens: int) -> dict[str, Any]:
        """OpenAI + SGLang request fields -> SGLang sampling_params (None = engine default).
        Fields the request leaves out take the model's recommended values under
        --sampling-defaults model (utils/sampling_defaults.py)."""
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens, "n": req.n,
            "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
            "min_p": req.min_p, "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
            "repetition_penalty": req.repetition_penalty, "min_new_tokens": req.min_tokens,
            "stop": req.stop, "stop_token_ids": req.stop_token_ids,
            "stop_regex": req.stop_regex,
            "ignore_eos": req.ignore_eos, "skip_special_tokens": req.skip_special_tokens,
            "spaces_between_special_tokens": req.spaces_between_special_tokens,
            "no_stop_trim": req.no_stop_trim or req.include_stop_str_in_output,
            "sampling_seed": req.seed,
            "logit_bias": req.logit_bias, **structured_output(req),
        }
        if req.min_tokens is not None and req.min_tokens > max_new_tokens:
            raise OpenAIError(f"min_tokens ({req.min_tokens}) must be <= max_tokens "
                              f"({max_new_tokens})", 400, param="min_tokens")
        for key, value in self.engine.model_sampling_defaults.items():
            if params.get(key) is None:
                params[key] = value
        return {k: v for k, v in params.items() if v is not None}

    # ------------------------------------------------------------------ engine calls

    def engine_error(self, e: BaseException) -> OpenAIError:
        """engine_error, with `param` naming the field this request used: the engine knows
        a prompt as input_ids and a response_format as the constraint it became."""
        err = engine_error(e)
        if err.param is None and err.message.startswith("input_ids "):
            err.param = self.prompt_field
            err.message = f"{self.prompt_field} {err.message[len('input_ids '):]}"
        elif (err.param in CONSTRAINT_KINDS and getattr(self.body, err.param, None) is None
              and self.body.response_format is not None):
            err.param = "response_format"
        return err

    async def generate(self, **kwargs: Any) -> list[dict]:
        """One non-streaming engine call; results flattened prompt-major (n per prompt).
        If the client disconnects first, the call is cancelled, which aborts the requests."""
        try:
            results = await unless_disconnected(self.http_request,
                                                self.engine.async_generate(**kwargs))
        except ClientDisconnected:
            raise OpenAIError("the client disconnected", 499) from None
        except Exception as e:
            raise self.engine_error(e) from e
        results = results if isinstance(results, list) else [results]
        for out in results:
            if failed(out["meta_info"]):
                raise abort_error(out["meta_info"])
        return results

    async def stream_sse(self, first: dict, rest: AsyncIterator[dict],
                         states: list["ChoiceStream"], num_prompts: int,
                         render: Callable[[int, dict, "ChoiceStream"], Optional[str]],
                         usage_chunk: Callable[[Usage], str],
                         preamble: Sequence[str] = ()) -> AsyncIterator[str]:
        """The SSE body of a streamed request with `self.body.n` choices per prompt: routes each
        engine output (cumulative, tagged with its `index`) to its choice, where `render` turns
        it into the next chunk (or None); then the usage chunk when asked, an `error` event if
        the engine failed, and [DONE]. Closing the outputs aborts the engine's requests."""
        n = self.body.n
        prompt_tokens = [0] * num_prompts
        cached_tokens = [0] * num_prompts   # as the prompt's first choice saw it
        outputs = chain(first, rest)
        try:
            for chunk in preamble:
                yield chunk
            async for out in outputs:
                i = out.get("index", 0)
                meta, st = out["meta_info"], states[i]
                if st.finished:
                    continue
                if failed(meta):
                    raise abort_error(meta)
                prompt_tokens[i // n] = meta["prompt_tokens"]
                if i % n == 0:
                    cached_tokens[i // n] = meta.get("cached_tokens", 0)
                st.completion_tokens = meta["completion_tokens"]
                if self.body.continuous_usage:
                    self.usage_so_far = make_usage(prompt_tokens,
                                                   [s.completion_tokens for s in states],
                                                   cached_tokens)
                chunk = render(i, out, st)
                if chunk is not None:
                    yield chunk
            if self.body.include_usage:
                yield usage_chunk(make_usage(prompt_tokens,
                                             [s.completion_tokens for s in states],
                                             cached_tokens))
        except asyncio.CancelledError:
            raise  # the client went away; closing `outputs` below aborts the requests
        except Exception as e:
            yield sse({"error": self.engine_error(e).body()["error"]})
        finally:
            await outputs.aclose()
        yield SSE_DONE

    async def open_stream(self, **kwargs: Any) -> tuple[dict, AsyncIterator[dict]]:
        """Start a streaming engine call and wait for its first output, so that bad input (or
        an immediate abort) becomes an HTTP error instead of a 200 with an error inside."""
        stream = None
        try:
            stream = await self.engine.async_generate(stream=True, **kwargs)
            first = await stream.__anext__()
        except StopAsyncIteration:
            raise OpenAIError("the engine returned no output", 500) from None
        except BaseException as e:
            if stream is not None:
                await stream.aclose()  # aborts whatever was started
            if isinstance(e, Exception):
                raise self.engine_error(e) from e
            raise
        if failed(first["meta_info"]):
            await stream.aclose()
            raise abort_error(first["meta_info"])
        return first, stream


async def chain(first: dict, rest: AsyncIterator[dict]) -> AsyncIterator[dict]:
    """The prefetched first output, then the rest; closing this closes (aborts) the engine's
    stream even when the consumer stops between two items rather than inside an await."""
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()
