"""The router's workers: membership, health checks and tree upkeep.

A worker counts as healthy once `/health` answers 200 and `/get_model_info` has shown it to be a
radixlm or SGLang server (a JSON object with `model_path`). A worker that fails a request or a
health check is taken out at once and its prefix tree dropped (its cache is gone or unknown);
the periodic check takes it back in when it answers again. Workers listed at start-up that are
not up yet are simply unhealthy until they are: the router starts and serves with the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import aiohttp

from radixlm.router.config import RouterArgs, check_worker_url
from radixlm.router.policy import Worker

logger = logging.getLogger("radixlm.router")


# Every request a router sends carries its id here (after those of the routers the request came
# through): a router that finds its own id in a request it receives is talking to itself, through
# a worker URL that leads back to it (its own address, or routers in a cycle).
LOOP_HEADER = "X-Radixlm-Routers"


class WorkerPool:
    def __init__(self, args: RouterArgs) -> None:
        self.args = args
        self.router_id = uuid.uuid4().hex[:16]
        self.workers: dict[str, Worker] = {}
        self.session: aiohttp.ClientSession | None = None   # set by the app at start-up
        self._probe_errors: dict[str, str] = {}   # why each unhealthy worker failed its probe
        for url in args.worker_urls:
            url = check_worker_url(url, "--worker-urls")
            self.workers.setdefault(url, Worker(url))

    def auth_headers(self, worker: Worker) -> dict[str, str]:
        """What the router sends a worker: its own API key (POST /workers with api_key), else
        the router's --api-key, if any; and the router's id (LOOP_HEADER)."""
        key = worker.api_key or self.args.api_key
        headers = {LOOP_HEADER: self.router_id}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def came_through_me(self, routers: str) -> bool:
        """Whether a request's LOOP_HEADER names this router."""
        return self.router_id in (r.strip() for r in routers.split(","))

    def healthy(self, exclude: set[Worker] | None = None) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy and w not in (exclude or ())]

    def mark_failed(self, worker: Worker, reason: str) -> None:
        if worker.healthy:
            worker.failures_total += 1
            logger.warning("worker %s taken out: %s", worker.url, reason)
        worker.healthy = False
        worker.tree.clear()

    async def _get(self, worker: Worker, path: str) -> tuple[int, bytes]:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.args.health_check_timeout_secs)
        async with self.session.get(worker.url + path, headers=self.auth_headers(worker),
                                    timeout=timeout) as r:
            return r.status, await r.read()

    async def identify(self, worker: Worker) -> None:
        """Raises ValueError unless the URL is a healthy radixlm / SGLang server."""
        try:
            status, _ = await self._get(worker, "/health")
            if status != 200:
                raise ValueError(f"{worker.url}/health answered HTTP {status}")
            status, body = await self._get(worker, "/get_model_info")
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            why = str(e) or (f"no answer within {self.args.health_check_timeout_secs:g} s "
                              f"(--health-check-timeout-secs)"
                              if isinstance(e, asyncio.TimeoutError) else type(e).__name__)
            raise ValueError(f"cannot reach {worker.url}: {why}") from None
        try:
            info = json.loads(body) if status == 200 else None
        except ValueError:
            info = None
        if status == 401:
            raise ValueError(f"{worker.url} refused the router's API key (GET /get_model_info: "
                             f"HTTP 401; start the router with the workers' --api-key, or add "
                             f"this worker with its own: POST /workers {{\"url\", \"api_key\"}})")
        if not isinstance(info, dict) or "model_path" not in info:
            raise ValueError(f"{worker.url} is not a radixlm or SGLang server "
                             f"(GET /get_model_info: HTTP {status}, no model_path)")
        worker.model_id = str(info["model_path"])

    async def probe(self, worker: Worker) -> None:
        try:
            await self.identify(worker)
        except ValueError as e:
            if worker.healthy:
                self.mark_failed(worker, str(e))
            elif self._probe_errors.get(worker.url) != str(e):   # (each new reason once)
                logger.warning("worker %s is unhealthy: %s", worker.url, e)
            self._probe_errors[worker.url] = str(e)
            return
        self._probe_errors.pop(worker.url, None)
        if not worker.healthy:
            logger.info("worker %s is healthy", worker.url)
        worker.healthy = True

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(w) for w in list(self.workers.values())))

    async def add(self, url: str, api_key: str | None = None) -> Worker:
        """`api_key`: the worker's own, instead of the router's --api-key."""
        url = check_worker_url(url)
        if url in self.workers:
            raise ValueError(f"worker {url} is already registered")
        worker = Worker(url, api_key=api_key)
        await self.identify(worker)
        if url in self.workers:   # added by a concurrent call while this one waited
            raise ValueError(f"worker {url} is already registered")
        worker.healthy = True
        self.workers[url] = worker
        logger.info("worker %s added", url)
        return worker

    def remove(self, url: str) -> None:
        url = url.rstrip("/")
        if url not in self.workers:
            raise ValueError(f"worker {url} is not registered")
        del self.workers[url]
        logger.info("worker %s removed", url)

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.args.health_check_interval_secs)
            await self.probe_all()

    async def eviction_loop(self) -> None:
        while True:
            await asyncio.sleep(self.args.eviction_interval_secs)
            for w in self.workers.values():
                w.tree.evict(self.args.max_tree_size)
