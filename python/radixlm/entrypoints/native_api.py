"""SGLang's native HTTP API: /generate, health, model and server info, cache and abort control,
tokenize / detokenize, the profiler, and Prometheus metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

import radixlm.envs as envs
from radixlm.entrypoints.disconnect import ClientDisconnected, unless_disconnected
from radixlm.entrypoints.errors import bad_request, error_body, error_response
from radixlm.entrypoints.openai.serving_base import served_model_name
from radixlm.entrypoints.request_body import read_json_body
from radixlm.entrypoints.request_limits import check_generate_limits
from radixlm.entrypoints.server_info import server_info
from radixlm.managers.generate_request import GenerateReqInput
from radixlm.managers.messages import ProfileReq, UpdateWeightsReq
from radixlm.managers.no_tokenizer import no_tokenizer_error
from radixlm.managers.tokenizer_manager import (INTERNAL_RID_PREFIX, EngineDeadError,
                                               RequestRefusedError)

router = APIRouter()


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request):
    engine = request.app.state.engine
    try:
        # (`input_ids` lists: GenerateReqInput checks that they hold ints only)
        body = await read_json_body(request, id_lists=("input_ids",))
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        obj = GenerateReqInput.from_dict(body)
        check_generate_limits(request.app.state.server_args, obj)
        if not isinstance(obj.stream, bool):
            raise ValueError("`stream` must be a boolean")
        call = engine.async_generate_request(obj)  # the request as parsed, built once
        if not obj.stream:
            return JSONResponse(await unless_disconnected(request, call))
        stream = await call
        first = await anext(stream)  # validation errors surface here, before the 200 is sent
    except ValueError as e:
        return bad_request(e)
    except EngineDeadError as e:
        return error_response(str(e), 503)
    except RequestRefusedError as e:
        return error_response(str(e), e.status)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening; the request was aborted
    return StreamingResponse(_stream_body(first, stream), media_type="text/event-stream")


async def _stream_body(first: dict, rest: AsyncIterator[dict]) -> AsyncIterator[str]:
    yield sse(first)
    try:
        async for item in rest:
            yield sse(item)
    except (ValueError, EngineDeadError) as e:
        yield sse(error_body(str(e), 400 if isinstance(e, ValueError) else 503))
    yield "data: [DONE]\n\n"


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine runs; 503 once one of its processes has died (the server then
    exits), so that a load balancer's or a router's probe notices."""
    manager = getattr(request.app.state.engine, "tokenizer_manager", None)
    reason = getattr(manager, "dead_reason", None)
    if reason is not None:
        return error_response(f"the engine is not running: {reason}", 503)
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 once the engine shows it generates: the probe's one token, or any output the
    scheduler sends after the probe started (a busy engine, whose queue the probe may wait in
    or be refused by, is a working one, as in SGLang); 503 when the engine died or nothing came
    within RADIXLM_HEALTH_CHECK_TIMEOUT seconds (a stuck scheduler)."""
    engine = request.app.state.engine
    manager = engine.tokenizer_manager
    if manager.dead_reason is not None:
        return error_response(f"the engine is not running: {manager.dead_reason}", 503)
    started, timeout_s = time.monotonic(), envs.health_check_timeout_s()
    probe = asyncio.ensure_future(engine.async_generate(
        input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0},
        rid=f"{INTERNAL_RID_PREFIX}health-{uuid.uuid4().hex}"))
    try:
        while True:
            await asyncio.wait({probe}, timeout=0.05)
            outputs_since = manager.last_output_time > started
            if probe.done():
                failure = probe.exception()
                if failure is None or (outputs_since and manager.dead_reason is None):
                    return Response(status_code=200)
                return error_response(f"generation failed: {failure}", 503)
            if outputs_since:
                return Response(status_code=200)
            if time.monotonic() - started > timeout_s:
                return error_response(f"the engine produced nothing in {timeout_s:g} s", 503)
    finally:
        probe.cancel()      # (a probe still waiting is aborted by its generator's cleanup)


@router.get("/get_load")
async def get_load(request: Request):
    """What sglang-router's power_of_two policy polls: one entry per engine (one here)."""
    try:
        stats = await request.app.state.engine.tokenizer_manager.get_stats()
    except EngineDeadError as e:
        return error_response(str(e), 503)
    in_use = stats.max_total_num_tokens - stats.available_kv_tokens - stats.evictable_kv_tokens
    return [{"dp_rank": 0, "num_reqs": stats.num_running_reqs + stats.num_waiting_reqs,
             "num_waiting_reqs": stats.num_waiting_reqs, "num_tokens": in_use}]


# SGLang serves both names: `/model_info` and `/server_info` are its current ones, which
# sglang-router probes first; the `get_` names are the older ones its clients still use.

@router.get("/get_model_info")
@router.get("/model_info")
async def get_model_info(request: Request) -> dict:
    """model_path and tokenizer_path are directories a client can load a tokenizer from (a
    GGUF is served from its converted directory)."""
    ready = request.app.state.engine.ready
    config = _hf_config_fields(ready.model_path)
    return {"model_path": ready.model_path, "tokenizer_path": ready.tokenizer_path,
            "is_generation": True, "served_model_name": served_model_name(request),
            "preferred_sampling_params":
                request.app.state.server_args.preferred_sampling_params,
            "weight_version": request.app.state.engine.tokenizer_manager.weight_version,
            "context_length": ready.context_len,
            "model_type": config.get("model_type"), "architectures": config.get("architectures"),
            "has_image_understanding": False, "has_audio_understanding": False,
            # --chat-template's source, for clients that render chats themselves (the
            # frontend language's RuntimeEndpoint); None: the tokenizer's own
            "chat_template": request.app.state.server_args.chat_template and
            request.app.state.engine.tokenizer.chat_template}


@functools.lru_cache(maxsize=4)
def _hf_config_fields(model_dir: str) -> dict:
    """config.json's model_type and architectures (routers read them from /get_model_info);
    empty where the directory has none readable."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: config.get(k) for k in ("model_type", "architectures")}


@router.get("/get_server_info")
@router.get("/server_info")
async def get_server_info(request: Request):
    engine = request.app.state.engine
    try:
        stats = await engine.tokenizer_manager.get_stats()
    except EngineDeadError as e:
        return error_response(str(e), 503)
    return server_info(engine, stats, request.app.state.server_args)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    try:
        result = await request.app.state.engine.tokenizer_manager.flush_cache()
    except EngineDeadError as e:
        return error_response(str(e), 503)
    if not result.success:
        return error_response(f"cache not flushed: {result.message}", 400)
    return PlainTextResponse("Cache flushed.\n")


# /update_weights_from_disk's fields (SGLang's names)
_UPDATE_FIELDS = {"model_path", "load_format", "flush_cache", "weight_version",
                  "abort_all_requests"}
# Fields of SGLang's request that ask for nothing different at these values (the update is
# synchronous, nothing is paused, the graphs read the weights in place): others are refused.
_UPDATE_NO_OP = {"is_async": (False, None), "keep_pause": (False, None),
                 "recapture_cuda_graph": (False, None), "torch_empty_cache": (False, None),
                 "token_step": (0, None)}


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request) -> Response:
    """SGLang's: {"model_path", "load_format"?, "flush_cache"?, "weight_version"?,
    "abort_all_requests"?} -> {"success", "message", "num_paused_requests"}, 200 or 400 (the
    served weights unchanged). Running requests finish first, unless abort_all_requests."""
    engine = request.app.state.engine
    try:
        body = await read_json_body(request)
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        unknown = sorted(set(body) - _UPDATE_FIELDS - set(_UPDATE_NO_OP))
        if unknown:
            raise ValueError(f"unsupported /update_weights_from_disk fields: {unknown}; "
                             f"supported: {sorted(_UPDATE_FIELDS)}")
        for name, neutral in _UPDATE_NO_OP.items():
            if name in body and body[name] not in neutral:
                raise ValueError(f"`{name}` is not supported by this server (only "
                                 f"{' or '.join(json.dumps(v) for v in neutral)})")
        abort_all = body.get("abort_all_requests", False)
        if not isinstance(abort_all, bool):
            raise ValueError("`abort_all_requests` must be true or false")
        path = body.get("model_path")
        fmt, flush = body.get("load_format"), body.get("flush_cache", True)
        version = body.get("weight_version")
        if not isinstance(path, str) or not path:
            raise ValueError("`model_path` must be a checkpoint's path or Hub id")
        if fmt is not None and not isinstance(fmt, str) or not isinstance(flush, bool):
            raise ValueError("`load_format` must be a string and `flush_cache` true or false")
        if version is not None and not isinstance(version, str):
            raise ValueError("`weight_version` must be a string")
    except ValueError as e:
        return bad_request(e)
    if abort_all:
        engine.abort_all()
    try:
        result = await engine.tokenizer_manager.update_weights_from_disk(
            UpdateWeightsReq(path, fmt, flush), version)
    except EngineDeadError as e:
        return error_response(str(e), 503)
    return JSONResponse({"success": result.success, "message": result.message,
                         "num_paused_requests": 0}, status_code=200 if result.success else 400)


# /start_profile's fields (SGLang's names); others are refused rather than ignored.
_A_KIND = {int: "an integer", str: "a string", list: "a list", bool: "true or false"}
_PROFILE_FIELDS = {"output_dir": str, "num_steps": int, "activities": list, "with_stack": bool,
                   "record_shapes": bool}
# Fields of SGLang's profile request that its own tools send (bench_serving --profile, RL
# frameworks) with values that ask for nothing this server does differently: taken at those
# values, refused at any other.
_PROFILE_NO_OP = {"start_step": (None, 0), "profile_by_stage": (None, False),
                  "merge_profiles": (None, False), "profile_prefix": (None, ""),
                  "profile_stages": (None, []), "profile_id": (None,)}


def profile_request(body: Any) -> ProfileReq:
    """/start_profile's optional JSON body as a ProfileReq; raises ValueError naming a field."""
    if body is None or body == {}:
        return ProfileReq("start")
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    unknown = sorted(set(body) - set(_PROFILE_FIELDS) - set(_PROFILE_NO_OP))
    if unknown:
        raise ValueError(f"unsupported /start_profile fields: {unknown}; supported: "
                         f"{sorted(_PROFILE_FIELDS)}")
    for name, neutral in _PROFILE_NO_OP.items():
        if name in body and not any(body[name] == v and type(body[name]) is type(v)
                                    for v in neutral):
            raise ValueError(f"`{name}` is not supported by this server (only "
                             f"{' or '.join(json.dumps(v) for v in neutral)})")
    fields = {k: v for k, v in body.items() if k in _PROFILE_FIELDS and v is not None}
    if isinstance(fields.get("num_steps"), str) and fields["num_steps"].strip().isdigit():
        fields["num_steps"] = int(fields["num_steps"])    # (SGLang's CLI tools send a string)
    if fields.get("activities") == []:
        del fields["activities"]                          # none named: the default ones
    for name, value in fields.items():
        kind = _PROFILE_FIELDS[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"`{name}` must be {_A_KIND.get(kind, kind.__name__)}")
    if not all(isinstance(a, str) for a in fields.get("activities", [])):
        raise ValueError("`activities` must be a list of strings (\"CPU\", \"GPU\")")
    return ProfileReq("start", **fields)


@router.api_route("/start_profile", methods=["GET", "POST"])
async def start_profile(request: Request) -> Response:
    try:
        req = profile_request(await read_json_body(request))
    except ValueError as e:
        return bad_request(e)
    return await _profile(request, req)


@router.api_route("/stop_profile", methods=["GET", "POST"])
async def stop_profile(request: Request) -> Response:
    return await _profile(request, ProfileReq("stop"))


async def _profile(request: Request, req: ProfileReq) -> Response:
    try:
        result = await request.app.state.engine.tokenizer_manager.profile(req)
    except EngineDeadError as e:
        return error_response(str(e), 503)
    if not result.success:
        return error_response(result.message, 400)
    if req.action == "start":
        return PlainTextResponse(result.message + "\n")
    return JSONResponse(dataclasses.asdict(result))


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    try:
        body = await read_json_body(request)
        if isinstance(body, dict) and body.get("abort_all") is True:
            request.app.state.engine.abort_all()
            return Response(status_code=200)
        rid = body.get("rid") if isinstance(body, dict) else None
        if rid is not None and not isinstance(rid, str):
            raise ValueError(f"`rid` must be a string (the request id to abort), got "
                             f"{type(rid).__name__}")
        if not rid:
            raise ValueError("`rid` (the request id to abort) or `abort_all: true` is required")
    except ValueError as e:
        return bad_request(e)
    request.app.state.engine.abort_request(rid)
    return Response(status_code=200)


@router.post("/tokenize")
@router.post("/v1/tokenize")      # (SGLang serves both names)
async def tokenize(request: Request):
    engine = request.app.state.engine
    try:
        if engine.tokenizer is None:
            raise no_tokenizer_error(request.url.path)
        body = await read_json_body(request)
        text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        if not isinstance(text, (str, list)) or (
                isinstance(text, list) and not all(isinstance(t, str) for t in text)):
            raise ValueError("`prompt` must be a string or a list of strings")
        add_special = _flag(body, "add_special_tokens", True)
    except ValueError as e:
        return bad_request(e)

    def encode(t: str) -> list[int]:
        return engine.tokenizer(t, add_special_tokens=add_special).input_ids

    def encode_all() -> Any:
        return [encode(t) for t in text] if isinstance(text, list) else encode(text)

    # On a thread (the tokenizer lets go of the GIL): megabytes of text take seconds, during
    # which the server must go on answering everything else, health checks included.
    tokens = await asyncio.to_thread(encode_all)
    count = [len(t) for t in tokens] if isinstance(text, list) else len(tokens)
    return {"tokens": tokens, "count": count, "max_model_len": engine.ready.context_len}


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be true or false, got {value!r}")
    return value


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request):
    engine = request.app.state.engine
    try:
        if engine.tokenizer is None:
            raise no_tokenizer_error(request.url.path)
        body = await read_json_body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        batch = isinstance(tokens, list) and bool(tokens) and all(
            isinstance(t, list) for t in tokens)
        vocab = engine.ready.vocab_size
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                for seq in (tokens if batch else [tokens]) for t in seq):
            raise ValueError("`tokens` must be a list of token ids in the vocabulary, or a "
                             "list of such lists")
        skip = _flag(body, "skip_special_tokens", False)
    except ValueError as e:
        return bad_request(e)

    def decode(ids: list[int]) -> str:
        return engine.tokenizer.decode(ids, skip_special_tokens=skip)

    return {"text": [decode(seq) for seq in tokens] if batch else decode(tokens)}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    exporter = getattr(request.app.state, "metrics", None)
    if exporter is None:
        return error_response("metrics are off; start the server with --enable-metrics", 404)
    try:
        stats = await request.app.state.engine.tokenizer_manager.get_stats()
    except EngineDeadError as e:
        return error_response(str(e), 503)
    return Response(exporter.render(stats), media_type="text/plain; version=0.0.4")


# What SGLang serves for embedding, reward and cross-encoder models (started with
# --is-embedding): this server runs generation models only, so these name that, rather than
# answering a bare 404 as for a mistyped path. (/v1/score, decoder-only scoring, is served by
# generation models: score_api.py.)
POOLING_PATHS = ("/v1/embeddings", "/encode", "/v1/rerank", "/rerank", "/classify",
                 "/v1/classify")


async def _pooling_endpoint(request: Request) -> Response:
    return error_response(f"{request.url.path}: the served model is a generation model; this "
                          f"server does not compute embeddings, rewards or rerank scores", 400,
                          param="model")


for _path in POOLING_PATHS:
    router.add_api_route(_path, _pooling_endpoint, methods=["POST"], include_in_schema=False)
