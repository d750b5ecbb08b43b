"""`radixlm router`: the HTTP load balancer in front of radixlm (or SGLang) workers.

Routed endpoints (one worker each, chosen by the policy): /generate, /v1/completions,
/v1/chat/completions, and SGLang's embedding / reward / score endpoints (ROUTED_PATHS).
Passed to any healthy worker: /v1/models (and /v1/models/{id}), /get_model_info,
/model_info, /health_generate, /tokenize, /detokenize (and their /v1/ names).
Fanned out to every healthy worker: /flush_cache, /abort_request, /start_profile,
/stop_profile, /get_load, /get_server_info (aggregated). The router's own: /health, /metrics
(with the workers' `sglang:*` metrics merged in), and the control plane of admin.py (worker
membership, /get_loads, /liveness, /readiness). Unknown routes and methods answer in the
workers' JSON error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from radixlm.router.admin import WorkerAdmin, load_entries
from radixlm.router.config import RouterArgs
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policy import create_policy
from radixlm.router.proxy import Forwarder, json_error, json_or_none
from radixlm.router.routing_key import routing_key
from radixlm.router.worker_metrics import merge_worker_metrics
from radixlm.router.workers import LOOP_HEADER, WorkerPool

logger = logging.getLogger("radixlm.router")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# serve --dp-size: how long stopped engines get to end their requests before the router goes
ENGINE_STOP_TIMEOUT_S = 10.0
# POSTs sent to one worker chosen by the policy. The embedding / reward / rerank ones are
# served by SGLang workers started with --is-embedding (radixlm workers answer them with a 400)
ROUTED_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                "/encode", "/v1/rerank", "/rerank", "/classify", "/v1/classify", "/v1/score")
# Answered without the API key, as by SGLang: load balancers' and Prometheus' probes
OPEN_PATHS = ("/health", "/health_generate", "/metrics", "/liveness", "/readiness")
# /get_server_info figures that add up over the workers (requests, KV tokens)
SUMMED_INFO_KEYS = ("num_running_reqs", "num_waiting_reqs", "max_total_num_tokens",
                    "available_kv_tokens", "evictable_kv_tokens", "protected_kv_tokens",
                    "num_retractions", "generated_tokens_total", "max_running_requests")


def _worker_message(body: bytes) -> str:
    """A worker's error answer as text: its OpenAI-shaped message, else the body itself."""
    answer = json_or_none(body)
    error = answer.get("error", answer) if isinstance(answer, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return body.decode("utf-8", "replace")[:200]


class Router:
    def __init__(self, args: RouterArgs, info_overrides: dict[str, Any] | None = None) -> None:
        self.args = args
        # Keys /get_server_info reports for the whole deployment rather than for one worker
        # (`serve --dp-size N`: its dp_size, host and port)
        self.info_overrides = dict(info_overrides or {})
        self.pool = WorkerPool(args)
        self.metrics = RouterMetrics()
        self.policy = create_policy(args.policy, args.cache_threshold,
                                    args.balance_abs_threshold, args.balance_rel_threshold)
        self.forwarder = Forwarder(self.pool, self.policy, self.metrics)
        self.admin = WorkerAdmin(self.pool, self._each_healthy)
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=self.args.max_payload_size)
        r = app.router
        for path in ROUTED_PATHS:
            r.add_post(path, self.routed)
        r.add_put("/generate", self.routed)
        for path in ("/v1/models", "/v1/models/{model_id:.+}", "/get_model_info", "/model_info",
                     "/health_generate"):
            r.add_get(path, self.any_worker)
        for path in ("/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize"):
            r.add_post(path, self.any_worker)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        for path in ("/start_profile", "/stop_profile"):
            r.add_route("*", path, self.profile)
        # OpenAI's files, batches and stored responses live in the worker that received them:
        # always the same one (previous_response_id must find its conversation)
        for base in ("/v1/files", "/v1/batches", "/v1/responses"):
            r.add_route("*", base, self.pinned_worker)
            r.add_route("*", base + "/{rest:.+}", self.pinned_worker)
        r.add_get("/get_load", self.get_load)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics_text)
        self.admin.add_routes(r)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        # Idle connections are dropped before the workers' own keep-alive limit (uvicorn: 5 s),
        # so a request is rarely sent on a connection the worker is closing.
        self.pool.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4), auto_decompress=False)
        await self.pool.probe_all()
        healthy = len(self.pool.healthy())
        logger.info("router: %d of %d workers healthy, policy %s", healthy,
                    len(self.pool.workers), self.args.policy)
        self._tasks = [asyncio.create_task(self.pool.health_loop()),
                       asyncio.create_task(self.pool.eviction_loop())]

    async def _stop(self, app: web.Application) -> None:
        for t in self._tasks:
            t.cancel()
        if self.pool.session is not None:
            await self.pool.session.close()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.pool.came_through_me(request.headers.get(LOOP_HEADER, "")):
            return json_error("this request came back to the router that sent it: a worker "
                              "URL leads to the router itself (--worker-urls, /add_worker)", 508)
        key = self.args.api_key
        if key and request.path not in OPEN_PATHS:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(), key):
                return json_error("invalid or missing API key (Authorization: Bearer KEY)", 401)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return json_error(f"request body over --max-payload-size "
                              f"({self.args.max_payload_size} bytes)", 413)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as e:
            return json_error(f"{request.method} {request.path}: {e.reason}", e.status)

    # ------------------------------------------------------------------ routed

    async def routed(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = None      # the worker answers the malformed body with its own 400
        return await self.forwarder.forward(request, body, routing_key(request.path, parsed))

    async def any_worker(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else None
        return await self.forwarder.forward(request, body, None, routed=False)

    async def pinned_worker(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else None
        return await self.forwarder.forward(request, body, None, routed=False, pinned=True)

    # ------------------------------------------------------------------ fanned out

    async def _each_healthy(self, method: str, path: str, body: bytes | None = None
                            ) -> list[tuple[str, int, bytes]]:
        """(url, status, body) from every healthy worker; status 0 if it could not answer."""
        async def one(w) -> tuple[str, int, bytes]:
            try:
                async with self.pool.session.request(
                        method, w.url + path, data=body, headers=self.pool.auth_headers(w),
                        timeout=aiohttp.ClientTimeout(total=self.args.request_timeout_secs)) as r:
                    return w.url, r.status, await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self.pool.mark_failed(w, f"{path}: {type(e).__name__}")
                return w.url, 0, str(e).encode()
        return list(await asyncio.gather(*(one(w) for w in self.pool.healthy())))

    async def flush_cache(self, request: web.Request) -> web.StreamResponse:
        answers = await self._each_healthy("POST", "/flush_cache")
        if not answers:
            return json_error("no healthy worker", 503)
        flushed = [url for url, status, _ in answers if status == 200]
        for url in flushed:
            self.pool.workers[url].tree.clear()     # that worker's cache is empty now
        refused = [(url, status, body) for url, status, body in answers if status != 200]
        if refused and not flushed:
            # None flushed (a worker busy with requests says 400): its answer, as one server's
            _, status, body = refused[0]
            if 400 <= status < 500:
                return web.Response(body=body, status=status, content_type="application/json")
            return json_error(f"cache not flushed: {_worker_message(body)}", 502)
        not_flushed = [{"url": url, "message": _worker_message(body)}
                       for url, _, body in refused]
        not_flushed += [{"url": w.url, "message": "unhealthy"}
                        for w in self.pool.workers.values() if not w.healthy]
        if not_flushed:   # (as sglang-router: 206, naming the workers not flushed)
            return web.json_response({"status": "partial_success",
                                      "message": f"Cache flushed on {len(flushed)} workers, "
                                                 f"not on {len(not_flushed)}",
                                      "failed_workers": [w["url"] for w in not_flushed],
                                      "details": not_flushed}, status=206)
        return web.Response(text=f"Cache flushed on {len(flushed)} workers.\n")

    async def profile(self, request: web.Request) -> web.StreamResponse:
        """/start_profile or /stop_profile on every healthy worker (each writes its own
        trace); the first worker's error if any refused. A JSON answer is the first worker's
        with every worker's own under `workers` (each names its trace_path)."""
        body = await request.read() if request.can_read_body else None
        answers = await self._each_healthy("POST", request.path, body)
        if not answers:
            return json_error("no healthy worker", 503)
        for _, status, data in answers:
            if status != 200:
                return web.Response(body=data, status=status or 502,
                                    content_type="application/json")
        parsed = [(url, json_or_none(data)) for url, _, data in answers]
        if not all(isinstance(answer, dict) for _, answer in parsed):
            return web.Response(body=answers[0][2], status=200)
        return web.json_response({**parsed[0][1],
                                  "workers": [{"url": url, **answer} for url, answer in parsed]})

    async def abort_request(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        answers = await self._each_healthy("POST", "/abort_request", body)
        if not answers:
            return json_error("no healthy worker", 503)
        # A bad body gets the same 400 from every worker: pass the first one on.
        for _, status, data in answers:
            if status == 400:
                return web.Response(body=data, status=400, content_type="application/json")
        return web.Response(status=200)

    async def get_load(self, request: web.Request) -> web.StreamResponse:
        """Every healthy worker's entries, each worker's `dp_rank` its place in the worker list
        (each calls itself rank 0), so a rank keeps its number while another is down."""
        rank_of = {url: rank for rank, url in enumerate(self.pool.workers)}
        loads: list[Any] = []
        for url, status, data in await self._each_healthy("GET", "/get_load"):
            for load in load_entries(json_or_none(data)) if status == 200 else []:
                if "dp_rank" in load:
                    load["dp_rank"] = rank_of.get(url, load["dp_rank"])
                loads.append(load)
        return web.json_response(loads)

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        """The first worker's info, with every worker's `internal_states` and each worker's
        own answer under `workers`."""
        infos = []
        for url, status, data in await self._each_healthy("GET", "/get_server_info"):
            info = json_or_none(data) if status == 200 else None
            if isinstance(info, dict):
                infos.append({"url": url, **info})
        if not infos:
            return json_error("no healthy worker answered", 503)
        merged = {k: v for k, v in infos[0].items() if k != "url"}
        for key in SUMMED_INFO_KEYS:     # the deployment's totals, not the first worker's
            values = [i.get(key) for i in infos]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                merged[key] = sum(values)
        merged.update(self.info_overrides)
        merged["internal_states"] = [s for i in infos
                                     for s in (i.get("internal_states") or [])]
        merged["workers"] = infos
        return web.json_response(merged)

    # ------------------------------------------------------------------ the router's own

    async def health(self, request: web.Request) -> web.StreamResponse:
        if self.pool.healthy():
            return web.Response(text="OK")
        return json_error("no healthy worker", 503)

    async def metrics_text(self, request: web.Request) -> web.StreamResponse:
        own = self.metrics.render(list(self.pool.workers.values()))
        texts = [data.decode("utf-8", "replace")
                 for _, status, data in await self._each_healthy("GET", "/metrics")
                 if status == 200]
        return web.Response(body=own + merge_worker_metrics(texts),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


def run_router(args: RouterArgs, info_overrides: dict[str, Any] | None = None,
               engines: Sequence[subprocess.Popen] = ()) -> int:
    """Serve until SIGTERM / Ctrl-C; a second signal stops at once. The router alone drains:
    requests in flight get up to 5 s. With `engines` (`serve --dp-size`, which started them):
    a signal stops the engines first, so that their requests in flight end as one server's
    do (finish_reason abort, streams closed with [DONE], 503s) through the router, and then the
    router; an engine that exits by itself stops the whole server with exit code 1, as one
    server exits when a process of its engine dies (a supervisor restarts it)."""
    level = "WARNING" if args.log_level == "warn" else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    router = Router(args, info_overrides)
    print(f"radixlm router on http://{args.host}:{args.port}, policy {args.policy}, "
          f"{len(router.pool.workers)} workers", file=sys.stderr, flush=True)
    try:
        # (uvloop measured no faster here: aiohttp's own request handling dominates.)
        return asyncio.run(_serve(router, args, list(engines)))
    except OSError as e:        # the port: in use, or not ours to bind
        print(f"radixlm router: error: --port {args.port} on {args.host}: "
              f"{e.strerror or e}", file=sys.stderr, flush=True)
        return 1


async def _serve(router: Router, args: RouterArgs, engines: list[subprocess.Popen]) -> int:
    runner = web.AppRunner(router.app(), handle_signals=False, access_log=None,
                           handler_cancellation=True, shutdown_timeout=1 if engines else 5)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
        stop = asyncio.Event()
        signals: list[int] = []

        def on_signal(sig: int) -> None:
            signals.append(sig)
            if len(signals) > 1:        # the second: at once
                for proc in engines:
                    if proc.poll() is None:
                        proc.kill()
                os._exit(130)
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        code = 0
        while not stop.is_set():
            dead = [p for p in engines if p.poll() is not None]
            if dead:
                logger.error("an engine (pid %d) exited with code %s: stopping the server",
                             dead[0].pid, dead[0].returncode)
                code = 1
                break
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
        for proc in engines:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + ENGINE_STOP_TIMEOUT_S
        while any(p.poll() is None for p in engines) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)    # (their last answers pass through the router)
        return code
    finally:
        await runner.cleanup()
