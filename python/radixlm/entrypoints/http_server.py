"""The HTTP server: a thin FastAPI layer over Engine.

Routes live with their API: native_api.py (SGLang's /generate and friends) and openai/ (the
OpenAI-compatible /v1 endpoints). This module builds the app (auth, error shapes, request
logging), and runs it with uvicorn, shutting the engine down cleanly on SIGTERM / Ctrl-C.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.config import ServerArgs
from radixlm.entrypoints.errors import error_response, validation_error_response
from radixlm.entrypoints.server_info import model_name
from radixlm.utils.gc_freeze import freeze_startup_heap
from radixlm.utils.sampling_defaults import parse_preferred

logger = logging.getLogger("radixlm.server")


def create_app(engine, args: ServerArgs) -> FastAPI:
    from radixlm.entrypoints import native_api, parse_api, score_api
    from radixlm.entrypoints.openai import batches, files, responses
    from radixlm.entrypoints.openai import routes as openai_routes

    app = FastAPI(title="radixlm", version="0.1.0")
    app.state.engine = engine
    app.state.server_args = args
    # (parsed once: /v1 reads max_new_tokens from it for every prompt without max_tokens)
    app.state.preferred_sampling_params = parse_preferred(args.preferred_sampling_params)
    app.include_router(native_api.router)
    app.include_router(parse_api.router)
    app.include_router(score_api.router)
    app.include_router(openai_routes.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(responses.router)
    if args.enable_metrics:
        from radixlm.managers.metrics import MetricsCollector
        app.state.metrics = MetricsCollector(model_name(args))
        engine.tokenizer_manager.metrics = app.state.metrics

    app.add_middleware(AuthAndLogMiddleware, api_key=args.api_key,
                       log_requests=args.log_requests)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        return validation_error_response(exc.errors())

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        # (with the exception's headers: a 405's Allow)
        return error_response(str(exc.detail), exc.status_code, headers=exc.headers)

    @app.exception_handler(json.JSONDecodeError)
    async def on_json_error(request: Request, exc: json.JSONDecodeError):
        return error_response(f"malformed JSON body: {exc}", 400)

    return app


# Answered without the API key (the router keeps the same list)
OPEN_PATHS = ("/health", "/health_generate", "/metrics")


class AuthAndLogMiddleware:
    """Bearer-key check (all but /health) and one log line per request, as plain ASGI: unlike
    FastAPI's @app.middleware("http") it does not wrap the body stream, so handlers still see
    client disconnects."""

    def __init__(self, app, api_key: str | None, log_requests: bool):
        self.app = app
        self.api_key = api_key
        self.log_requests = log_requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        # Probes stay open, as in SGLang: /health* (load balancers') and /metrics
        # (Prometheus'); CORS preflights carry no key.
        if self.api_key and path not in OPEN_PATHS and scope.get("method") != "OPTIONS":
            headers = dict(scope.get("headers") or [])
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(),
                                                                        self.api_key):
                response = error_response(
                    "invalid or missing API key (Authorization: Bearer KEY)", 401)
                if self.log_requests:
                    logger.info("%s %s -> 401 (no valid API key)", scope.get("method"), path)
                return await response(scope, receive, send)
        if not self.log_requests:
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def send_logged(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            logger.info("%s %s -> %d in %.1f ms", scope.get("method"), path, status[0],
                        (time.perf_counter() - start) * 1e3)


def serve(args: ServerArgs) -> int:
    import uvicorn

    from radixlm.entrypoints.engine import Engine
    from radixlm.utils.server_process import check_port_free

    check_port_free(args.host, args.port)
    started = time.perf_counter()
    try:
        engine = Engine(**vars(args))
    except RuntimeError as e:     # the engine's own start-up failure, already logged by it
        print(f"radixlm serve: error: {e}", file=sys.stderr, flush=True)
        return 1
    app = create_app(engine, args)
    freeze_startup_heap()     # (this process is the server's own: utils/gc_freeze.py)
    ready = engine.ready
    print(f"radixlm serving {ready.model_path} on http://{args.host}:{args.port} "
          f"(device {ready.device}, dtype {ready.dtype}, KV cache {ready.max_total_num_tokens} "
          f"tokens, context {ready.context_len}; started in {time.perf_counter() - started:.1f} s)",
          file=sys.stderr, flush=True)
    # In-flight requests end within a step of abort_all(); the grace period only bounds a
    # handler that does not.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5, access_log=False)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # SIGTERM / Ctrl-C: stop accepting (uvicorn) and end in-flight requests now with
            # finish_reason abort, so open streams close instead of running to completion.
            # This runs as a signal handler, between any two bytecodes of the main thread, so it
            # must not block: the abort is sent from a thread of its own. (Sent here, a second
            # signal arriving while the first handler held the engine's send lock deadlocked
            # the server for good; `timeout` and systemd send a SIGTERM to every process.)
            threading.Thread(target=engine.abort_all, kwargs={"shutdown": True},
                             name="radixlm-abort-all", daemon=True).start()
            super().handle_exit(sig, frame)

    server = Server(config)
    died: list[str] = []

    def on_dead(reason: str, asked: bool) -> None:
        # A child process died: requests already get 503 and /health says so; the server
        # exits (code 1) so that a supervisor or orchestrator restarts it, as SGLang's does.
        # (Children stopped by a SIGTERM sent to every process: a shutdown, exit code 0.)
        print(f"radixlm: the engine stopped ({reason}); the server exits", file=sys.stderr,
              flush=True)
        if not asked:
            died.append(reason)
        server.should_exit = True

    engine.on_dead = on_dead
    # uvicorn re-raises the signal it caught once it has shut down; with these handlers in place
    # that only ends up here, and the engine still gets to stop its children cleanly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()  # handles SIGINT/SIGTERM: stops accepting, then returns
    finally:
        stopping = time.perf_counter()

        def stop_now(sig, frame) -> None:  # a second SIGTERM / Ctrl-C while stopping
            print("radixlm: stopping now", file=sys.stderr, flush=True)
            engine.kill()
            os._exit(128 + sig)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop_now)
        engine.shutdown()  # aborts in-flight requests (finish_reason abort) and stops children
        print(f"radixlm stopped ({time.perf_counter() - stopping:.1f} s to stop the engine)",
              file=sys.stderr, flush=True)
    return 1 if died else 0
