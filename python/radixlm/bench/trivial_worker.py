"""A worker that answers at once, for measuring a router's own overhead (`bench router
--part overhead`): the endpoints a router probes, in radixlm / SGLang shapes, and a /generate
that returns one token without computing anything.

    python -m radixlm.bench.trivial_worker --port 31001
"""

from __future__ import annotations

import argparse
from typing import Sequence

from aiohttp import web

GENERATED = {"text": "ok", "output_ids": [1],
             "meta_info": {"id": "trivial", "finish_reason": {"type": "length", "length": 1},
                           "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0}}
MODEL_INFO = {"model_path": "trivial", "tokenizer_path": None, "is_generation": True,
              "served_model_name": "trivial"}
LOAD = [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


def app() -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(GENERATED)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    def constant(value):
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(value)
        return handler

    a = web.Application()
    a.router.add_post("/generate", generate)
    a.router.add_get("/health", ok)
    a.router.add_get("/health_generate", ok)
    a.router.add_route("*", "/flush_cache", ok)
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
    ns = p.parse_args(argv)
    web.run_app(app(), host=ns.host, port=ns.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
