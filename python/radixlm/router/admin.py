"""The router's control plane: worker membership, loads and probes, in sglang-router's names.

- `/add_worker?url=`, `/remove_worker?url=`, `/list_workers`: the query-string forms;
- `POST /workers` (`{"url": ...}`), `GET /workers`, `GET /workers/{url}`,
  `DELETE /workers/{url}`: the REST forms (the URL in the path may be percent-encoded);
- `/get_loads`: each worker's requests, running and waiting, as its `/get_load` reports them
  (-1 for a worker that is unhealthy or did not answer);
- `/liveness` (the router answers) and `/readiness` (at least one healthy worker).

A worker added by `POST /workers` may bring its own `api_key`, which the router then sends it
instead of its own `--api-key`; prefill/decode workers are not supported (no disaggregation).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from aiohttp import web

from radixlm.router.policy import Worker
from radixlm.router.proxy import json_error, json_or_none
from radixlm.router.workers import WorkerPool

# How the admin asks every healthy worker: (method, path) -> [(url, HTTP status, body)]
# (Router._each_healthy; status 0 for a worker that did not answer)
FanOut = Callable[[str, str], Awaitable[list[tuple[str, int, bytes]]]]
# The fields of POST /workers this router acts on (sglang-router's WorkerConfigRequest has
# more: priority, cost, labels, ..., which would be accepted and then ignored here)
WORKER_FIELDS = ("url", "api_key", "worker_type")


def load_entries(answer: Any) -> list[dict]:
    """The entries of one worker's /get_load answer: a list with one per data-parallel rank
    (radixlm, SGLang), or one object; [] for anything else."""
    entries = answer if isinstance(answer, list) else [answer]
    return [e for e in entries if isinstance(e, dict)]


def _requests_in(answer: Any) -> int | None:
    """Running + waiting requests from one worker's /get_load answer, or None if it does not
    say."""
    entries = load_entries(answer)
    if not entries or not all(isinstance(e.get("num_reqs"), int) for e in entries):
        return None
    return sum(e["num_reqs"] for e in entries)


class WorkerAdmin:
    def __init__(self, pool: WorkerPool, fan_out: FanOut) -> None:
        self.pool = pool
        self.fan_out = fan_out

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_route("*", "/add_worker", self.add_worker)
        router.add_route("*", "/remove_worker", self.remove_worker)
        router.add_get("/list_workers", self.list_workers)
        router.add_post("/workers", self.create_worker)
        router.add_get("/workers", self.workers)
        router.add_get("/workers/{url:.+}", self.one_worker)
        router.add_delete("/workers/{url:.+}", self.delete_worker)
        router.add_get("/get_loads", self.get_loads)
        router.add_get("/liveness", self.liveness)
        router.add_get("/readiness", self.readiness)

    @staticmethod
    def entry(w: Worker) -> dict[str, Any]:
        """A worker as GET /workers shows it (sglang-router's fields, then the router's own
        counters; `load` is the requests the router has in flight on it)."""
        return {"url": w.url, "model_id": w.model_id, "worker_type": "regular",
                "is_healthy": w.healthy, "load": w.in_flight, "connection_mode": "Http",
                "requests_total": w.requests_total, "failures_total": w.failures_total,
                "tree_size": w.tree.size}

    @staticmethod
    def list_entry(w: Worker) -> dict[str, Any]:
        """A worker as /list_workers shows it (this router's shape since it had one)."""
        return {"url": w.url, "healthy": w.healthy, "in_flight": w.in_flight,
                "requests_total": w.requests_total, "failures_total": w.failures_total,
                "tree_size": w.tree.size}

    # ------------------------------------------------------------------ query-string forms

    @staticmethod
    def _url_param(request: web.Request) -> str:
        url = request.query.get("url")
        if not url:
            raise ValueError("the worker's URL is required: ?url=http://HOST:PORT")
        return url

    async def add_worker(self, request: web.Request) -> web.StreamResponse:
        try:
            worker = await self.pool.add(self._url_param(request))
        except ValueError as e:
            return json_error(str(e), 400)
        return web.json_response({"status": "ok", "url": worker.url,
                                  "message": f"worker {worker.url} added"})

    async def remove_worker(self, request: web.Request) -> web.StreamResponse:
        try:
            url = self._url_param(request)
            self.pool.remove(url)
        except ValueError as e:
            return json_error(str(e), 400)
        return web.json_response({"status": "ok", "url": url.rstrip("/"),
                                  "message": f"worker {url} removed"})

    async def list_workers(self, request: web.Request) -> web.StreamResponse:
        workers = list(self.pool.workers.values())
        return web.json_response({"urls": [w.url for w in workers],
                                  "workers": [self.list_entry(w) for w in workers]})

    # ------------------------------------------------------------------ REST forms

    def _worker_config_problem(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "the body must be a JSON object: {\"url\": \"http://HOST:PORT\"}"
        unknown = sorted(set(body) - set(WORKER_FIELDS))
        if unknown:
            return (f"{unknown[0]}: not supported by this router (it takes "
                    f"{', '.join(WORKER_FIELDS)})")
        if not isinstance(body.get("url"), str):
            return "url: required, a string (http://HOST:PORT)"
        if body.get("worker_type", "regular") != "regular":
            return (f"worker_type: {body['worker_type']!r} is not supported (only 'regular': "
                    f"no prefill/decode disaggregation)")
        if not isinstance(body.get("api_key", ""), (str, type(None))):
            return "api_key: a string, the worker's own API key"
        return None

    async def create_worker(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return json_error("the body is not valid JSON", 400)
        problem = self._worker_config_problem(body)
        if problem:
            return json_error(problem, 400)
        try:
            worker = await self.pool.add(body["url"], body.get("api_key") or None)
        except ValueError as e:
            return json_error(str(e), 400)
        return web.json_response({"success": True, "message": f"worker {worker.url} added",
                                  "worker": self.entry(worker)})

    async def workers(self, request: web.Request) -> web.StreamResponse:
        workers = list(self.pool.workers.values())
        return web.json_response({"workers": [self.entry(w) for w in workers],
                                  "total": len(workers),
                                  "stats": {"prefill_count": 0, "decode_count": 0,
                                            "regular_count": len(workers)}})

    def _path_worker(self, request: web.Request) -> Worker | None:
        return self.pool.workers.get(request.match_info["url"].rstrip("/"))

    async def one_worker(self, request: web.Request) -> web.StreamResponse:
        worker = self._path_worker(request)
        if worker is None:
            return json_error(f"worker {request.match_info['url']} is not registered", 404)
        return web.json_response(self.entry(worker))

    async def delete_worker(self, request: web.Request) -> web.StreamResponse:
        worker = self._path_worker(request)
        if worker is None:
            return json_error(f"worker {request.match_info['url']} is not registered", 404)
        self.pool.remove(worker.url)
        return web.json_response({"success": True, "message": f"worker {worker.url} removed"})

    # ------------------------------------------------------------------ loads and probes

    async def get_loads(self, request: web.Request) -> web.StreamResponse:
        answers = {url: _requests_in(json_or_none(data)) if status == 200 else None
                   for url, status, data in await self.fan_out("GET", "/get_load")}
        loads = [{"worker": w.url,
                  "load": -1 if answers.get(w.url) is None else answers[w.url]}
                 for w in self.pool.workers.values()]
        return web.json_response({"workers": loads})

    async def liveness(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="OK")

    async def readiness(self, request: web.Request) -> web.StreamResponse:
        healthy, total = len(self.pool.healthy()), len(self.pool.workers)
        if healthy:
            return web.json_response({"status": "ready", "healthy_workers": healthy,
                                      "total_workers": total})
        return web.json_response({"status": "not ready", "reason": "no healthy worker",
                                  "healthy_workers": 0, "total_workers": total}, status=503)
