"""A worker that answers at once, for measuring a router's own overhead (`bench router
--part overhead`): the endpoints a router probes, in radixlm / SGLang shapes, and a /generate
that returns one token without computing anything. `--fail MODE` makes its /generate fail in
one way, for the router's fault tests: `503` (an error answer), `close` (the connection drops
before any answer), `truncate` (the body stops short of its Content-Length), `stream-head` (a
stream's headers, then nothing), `stream-cut` (two stream events, then the connection drops);
`busy` makes its /flush_cache refuse as a server running requests does (400).

    python -m radixlm.bench.trivial_worker --port 31001 [--fail close]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Sequence

from aiohttp import web

GENERATED = {"text": "ok", "output_ids": [1],
             "meta_info": {"id": "trivial", "finish_reason": {"type": "length", "length": 1},
                           "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0}}
MODEL_INFO = {"model_path": "trivial", "tokenizer_path": None, "is_generation": True,
              "served_model_name": "trivial"}
LOAD = [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


FAIL_MODES = ("none", "503", "close", "truncate", "stream-head", "stream-cut", "busy")


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _fail(request: web.Request, mode: str, stream: bool) -> web.StreamResponse:
    if mode == "503":
        return web.json_response({"message": "engine dead", "code": 503}, status=503)
    if mode == "close":
        request.transport.close()
        return web.Response()
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream" if stream
                                      else "application/json"})
    if mode == "truncate":
        out.content_length = 1000
    await out.prepare(request)
    if mode == "truncate":
        await out.write(b'{"text": "o')
    elif mode == "stream-cut":
        for n in (1, 2):
            await out.write(_sse({**GENERATED, "output_ids": [1] * n}))
    await asyncio.sleep(0.05)
    request.transport.close()
    return out


def app(fail: str = "none") -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stream = bool(body.get("stream"))
        if fail in ("503", "close", "truncate") or (stream and fail.startswith("stream")):
            return await _fail(request, fail, stream)
        if stream:
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            await out.write(_sse(GENERATED) + b"data: [DONE]\n\n")
            return out
        return web.json_response(GENERATED)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def flush_cache(request: web.Request) -> web.Response:
        if fail == "busy":      # (what a server answers while it runs requests)
            return web.json_response({"error": {
                "message": "cannot flush the cache while requests are running", "code": 400}},
                status=400)
        return web.Response(text="OK")

    def constant(value):
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(value)
        return handler

    a = web.Application()
    a.router.add_post("/generate", generate)
    a.router.add_get("/health", ok)
    a.router.add_get("/health_generate", ok)
    a.router.add_route("*", "/flush_cache", flush_cache)
    for path in ("/get_model_info", "/model_info"):
        a.router.add_get(path, constant(MODEL_INFO))
    for path in ("/get_server_info", "/server_info"):
        a.router.add_get(path, constant({**MODEL_INFO, "internal_states": [{}]}))
    a.router.add_get("/get_load", constant(LOAD))
    a.router.add_get("/v1/models", constant({"object": "list", "data": [
        {"id": "trivial", "object": "model", "owned_by": "radixlm"}]}))
    return a


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m radixlm.bench.trivial_worker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fail", choices=FAIL_MODES, default="none")
    ns = p.parse_args(argv)
    web.run_app(app(ns.fail), host=ns.host, port=ns.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
