"""Sending one client request to a worker, with retries, and its answer back.

- The policy picks a worker among the healthy ones this request has not failed on yet.
- Before any byte reached the client, a failure tries another worker, up to `--max-retries`
  more: a connection error or connect timeout, a body or stream cut short before its first
  byte (the worker is taken out), or a 502/503/504 answer (503 is radixlm's "engine dead":
  taken out too). The last worker's 502/503/504 is passed on as it is. Nothing is sent to the
  client twice: a JSON answer is read whole before it is passed on, and a stream is passed on
  only once its first chunk has arrived.
- A request that runs past `--request-timeout-secs` gets a 504; it is not run again elsewhere
  and the worker stays in (slow is not dead).
- A stream whose worker fails after its first chunk ends with an SSE error event and
  `data: [DONE]`.
- A client that goes away (aiohttp cancels the handler, or a write fails) closes the
  connection to the worker, which aborts the request there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from radixlm.entrypoints.errors import error_body
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policy import Choice, Policy, Worker, least_loaded
from radixlm.router.workers import LOOP_HEADER, WorkerPool

logger = logging.getLogger("radixlm.router")

RETRY_STATUSES = (502, 503, 504)
# Passed on from the client to the worker, and from the worker's answer to the client.
FORWARDED_REQUEST_HEADERS = ("Content-Type", "Accept", "Content-Encoding", "X-Request-Id")
FORWARDED_RESPONSE_HEADERS = ("Content-Type", "Content-Encoding", "Retry-After", "X-Request-Id")


def json_error(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


def json_or_none(data: bytes) -> Any:
    """A worker's JSON answer, or None if it is not JSON."""
    try:
        return json.loads(data)
    except ValueError:
        return None


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

    def _headers(self, request: web.Request, worker: Worker) -> dict[str, str]:
        headers = {h: request.headers[h] for h in FORWARDED_REQUEST_HEADERS
                   if h in request.headers}
        headers.update(self.pool.auth_headers(worker))   # its key or the router's, if any
        before = request.headers.get(LOOP_HEADER)          # (routers it came through)
        if before:
            headers[LOOP_HEADER] = f"{before},{self.pool.router_id}"
        return headers

    async def forward(self, request: web.Request, body: bytes | None, key: str | None,
                      routed: bool = True, pinned: bool = False) -> web.StreamResponse:
        """`routed`: the policy picks the worker; otherwise (model info, tokenize, ...) any
        healthy worker will do, and the least loaded one answers. `pinned`: always the same
        worker (the first healthy one by URL), no retry elsewhere: state that lives in one
        worker (OpenAI's files and batches)."""
        start = time.perf_counter()
        try:
            return await self._forward(request, body, key, routed, pinned)
        finally:
            self.metrics.observe_latency(request.path, time.perf_counter() - start)

    async def _forward(self, request: web.Request, body: bytes | None, key: str | None,
                       routed: bool, pinned: bool = False) -> web.StreamResponse:
        tried: set[Worker] = set()
        last_error = "no healthy worker"
        for attempt in range(1 if pinned else 1 + self.pool.args.max_retries):
            candidates = self.pool.healthy(exclude=tried)
            if pinned:
                candidates = sorted(candidates, key=lambda w: w.url)[:1]
            if not candidates:
                break
            if attempt:
                self.metrics.retries.inc()
            choice = (self.policy.choose(candidates, key) if routed
                      else Choice(least_loaded(candidates), "any"))
            worker = choice.worker
            tried.add(worker)
            last_try = (pinned or attempt == self.pool.args.max_retries
                        or not self.pool.healthy(exclude=tried))
            self.metrics.count_routed(worker.url, choice.decision)
            worker.requests_total += 1
            worker.in_flight += 1
            try:
                return await self._try_worker(request, worker, body, last_try)
            except _WorkerFailed as e:
                last_error = str(e)
                self.metrics.count_failure(worker.url)
            except asyncio.TimeoutError:
                return json_error(f"{worker.url} did not answer within --request-timeout-secs "
                                  f"({self.pool.args.request_timeout_secs:g} s)", 504)
            finally:
                worker.in_flight -= 1
        return json_error(f"no worker could serve the request ({last_error})", 503)

    def _failed(self, worker: Worker, what: str) -> _WorkerFailed:
        self.pool.mark_failed(worker, what)
        return _WorkerFailed(f"{worker.url}: {what}")

    async def _try_worker(self, request: web.Request, worker: Worker, body: bytes | None,
                          last_try: bool) -> web.StreamResponse:
        resp = await self._send(request, worker, body)
        done = False
        try:
            if resp.status in RETRY_STATUSES and not last_try:
                if resp.status == 503:   # radixlm: the engine is dead
                    self.pool.mark_failed(worker, "HTTP 503")
                raise _WorkerFailed(f"{worker.url}: HTTP {resp.status}")
            if resp.status == 503:
                self.pool.mark_failed(worker, "HTTP 503")
            if resp.content_type == "text/event-stream":
                out, done = await self._stream(request, worker, resp)
                return out
            try:
                data = await resp.read()
            except aiohttp.ClientError as e:
                raise self._failed(worker, f"body cut short ({type(e).__name__})") from None
            done = True
            return web.Response(body=data, status=resp.status, headers=_response_headers(resp))
        finally:
            # A fully read answer frees the connection for reuse; otherwise closing it tells
            # the worker that nobody waits for this request any more (it aborts it).
            if done:
                resp.release()
            else:
                resp.close()

    async def _send(self, request: web.Request, worker: Worker,
                    body: bytes | None) -> aiohttp.ClientResponse:
        """The worker's response head. A pooled keep-alive connection the worker closed
        meanwhile (POST is not retried by aiohttp) gets one fresh try before the worker is
        counted as failed."""
        assert self.pool.session is not None
        for fresh_try in (False, True):
            try:
                return await self.pool.session.request(
                    request.method, worker.url + request.path_qs, data=body,
                    headers=self._headers(request, worker), timeout=self.timeout,
                    skip_auto_headers=("Accept-Encoding",))
            except aiohttp.ServerDisconnectedError:
                if fresh_try:
                    raise self._failed(worker, "disconnected") from None
            except aiohttp.ConnectionTimeoutError:
                raise self._failed(worker, "connect timeout") from None
            except asyncio.TimeoutError:
                raise
            except aiohttp.ClientError as e:
                raise self._failed(worker, type(e).__name__) from None
        raise AssertionError("unreachable")

    async def _stream(self, request: web.Request, worker: Worker,
                      resp: aiohttp.ClientResponse) -> tuple[web.StreamResponse, bool]:
        """Pass an SSE stream through as it comes. Returns the response and whether the
        worker's stream was read to its end. Nothing goes to the client before the first
        chunk, so a worker that fails before it can still be replaced."""
        try:
            chunk = await resp.content.readany()
        except aiohttp.ClientError as e:
            raise self._failed(worker, f"stream cut short ({type(e).__name__})") from None
        out = web.StreamResponse(status=resp.status, headers={
            **_response_headers(resp), "Cache-Control": "no-cache"})
        await out.prepare(request)
        try:
            while chunk:
                await out.write(chunk)
                try:
                    chunk = await resp.content.readany()
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    if isinstance(e, asyncio.TimeoutError):   # slow, not dead
                        message = "the stream ran past --request-timeout-secs"
                    else:
                        self.pool.mark_failed(worker, f"stream cut short ({type(e).__name__})")
                        message = f"worker {worker.url} failed during the stream"
                    await out.write(f"data: {json.dumps(error_body(message, 502))}\n\n"
                                    "data: [DONE]\n\n".encode())
                    await out.write_eof()
                    return out, False
            await out.write_eof()
        except ConnectionResetError:   # the client left; closing resp aborts the request
            return out, False
        return out, True


def _response_headers(resp: aiohttp.ClientResponse) -> dict[str, str]:
    return {h: resp.headers[h] for h in FORWARDED_RESPONSE_HEADERS if h in resp.headers}
