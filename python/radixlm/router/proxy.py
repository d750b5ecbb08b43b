"""Sending one client request to a worker, with retries, and its answer back.

- The policy picks a worker among the healthy ones this request has not failed on yet.
- A connection error, a timeout, a 502/503/504, or a body cut short, before any byte reached the
  client, takes the worker out (connection errors and cut bodies) and tries another one, up to
  `--max-retries` more. Nothing is sent to the client twice: a JSON answer is read whole
  before it is passed on; a stream is passed on chunk by chunk only once its status is known.
- A stream whose worker fails mid-way ends with an SSE error event and `data: [DONE]`.
- A client that goes away (aiohttp cancels the handler, or a write fails) closes the
  connection to the worker, which aborts the request there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
from aiohttp import web

from radixlm.entrypoints.errors import error_body
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policy import Choice, Policy, Worker, least_loaded
from radixlm.router.workers import WorkerPool

logger = logging.getLogger("radixlm.router")

RETRY_STATUSES = (502, 503, 504)
HOP_HEADERS = ("Content-Type", "Accept")


def json_error(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


class _WorkerFailed(Exception):
    pass


class Forwarder:
    def __init__(self, pool: WorkerPool, policy: Policy, metrics: RouterMetrics) -> None:
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        args = pool.args
        self.timeout = aiohttp.ClientTimeout(total=args.request_timeout_secs,
                                             sock_connect=args.health_check_timeout_secs)

    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = {h: request.headers[h] for h in HOP_HEADERS if h in request.headers}
        if self.pool.args.api_key:
            headers.update(self.pool.auth_headers)
        elif "Authorization" in request.headers:   # the workers' own key, passed through
            headers["Authorization"] = request.headers["Authorization"]
        return headers

    async def forward(self, request: web.Request, body: bytes | None, key: str | None,
                      routed: bool = True) -> web.StreamResponse:
        """`routed`: the policy picks the worker; otherwise (model info, tokenize, ...) any
        healthy worker will do, and the least loaded one answers."""
        start = time.perf_counter()
        try:
            return await self._forward(request, body, key, routed)
        finally:
            self.metrics.observe_latency(request.path, time.perf_counter() - start)

    async def _forward(self, request: web.Request, body: bytes | None, key: str | None,
                       routed: bool) -> web.StreamResponse:
        tried: set[Worker] = set()
        last_error = "no healthy worker"
        for attempt in range(1 + self.pool.args.max_retries):
            candidates = self.pool.healthy(exclude=tried)
            if not candidates:
                break
            if attempt:
                self.metrics.retries.inc()
            choice = (self.policy.choose(candidates, key) if routed
                      else Choice(least_loaded(candidates), "any"))
            worker = choice.worker
            tried.add(worker)
            self.metrics.count_routed(worker.url, choice.decision)
            worker.requests_total += 1
            worker.in_flight += 1
            try:
                return await self._try_worker(request, worker, body,
                                              last_try=attempt == self.pool.args.max_retries)
            except _WorkerFailed as e:
                last_error = str(e)
                self.metrics.failures.labels(worker.url).inc()
            finally:
                worker.in_flight -= 1
        return json_error(f"no worker could serve the request ({last_error})", 503)

    async def _try_worker(self, request: web.Request, worker: Worker, body: bytes | None,
                          last_try: bool) -> web.StreamResponse:
        url = worker.url + request.path_qs
        assert self.pool.session is not None
        try:
            resp = await self.pool.session.request(request.method, url, data=body,
                                                   headers=self._headers(request),
                                                   timeout=self.timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            self.pool.mark_failed(worker, f"{type(e).__name__}: {e}")
            raise _WorkerFailed(f"{worker.url}: {type(e).__name__}") from None
        done = False
        try:
            if resp.status in RETRY_STATUSES and not last_try:
                await resp.read()
                done = True
                if resp.status == 503:   # radixlm: the engine is dead
                    self.pool.mark_failed(worker, "HTTP 503")
                raise _WorkerFailed(f"{worker.url}: HTTP {resp.status}")
            if resp.content_type == "text/event-stream":
                out, done = await self._stream(request, worker, resp)
                return out
            try:
                data = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self.pool.mark_failed(worker, f"body cut short: {type(e).__name__}")
                raise _WorkerFailed(f"{worker.url}: body cut short") from None
            done = True
            return web.Response(body=data, status=resp.status,
                                headers={"Content-Type": resp.headers.get(
                                    "Content-Type", "application/json")})
        finally:
            # A fully read answer frees the connection for reuse; otherwise closing it tells
            # the worker that nobody waits for this request any more (it aborts it).
            resp.release() if done else resp.close()

    async def _stream(self, request: web.Request, worker: Worker,
                      resp: aiohttp.ClientResponse) -> tuple[web.StreamResponse, bool]:
        """Pass an SSE stream through as it comes. Returns the response and whether the
        worker's stream was read to its end (once started there is no error status to set: the
        client already has the 200)."""
        out = web.StreamResponse(status=resp.status, headers={
            "Content-Type": resp.headers.get("Content-Type", "text/event-stream"),
            "Cache-Control": "no-cache"})
        await out.prepare(request)
        while True:
            try:
                chunk = await resp.content.readany()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self.pool.mark_failed(worker, f"stream cut short: {type(e).__name__}")
                message = f"worker {worker.url} failed during the stream"
                await out.write(f"data: {json.dumps(error_body(message, 502))}\n\n"
                                "data: [DONE]\n\n".encode())
                await out.write_eof()
                return out, False
            if not chunk:
                break
            await out.write(chunk)   # ConnectionResetError if the client left: resp is closed
        await out.write_eof()
        return out, True
