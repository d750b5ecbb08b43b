"""The router's control plane in sglang-router's names (router/admin.py): workers added,
listed, looked up and removed by REST, /get_loads, /liveness and /readiness, against trivial
workers (bench/trivial_worker.py)."""

from __future__ import annotations

import socket
import time
from urllib.parse import quote

import httpx
import pytest

from helpers import stop_server
from test_router import start_router
from test_router_faults import trivial_workers  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow


def _wait(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_workers_rest_loads_and_probes(trivial_workers):  # noqa: F811
    w1, w2, w3 = trivial_workers(), trivial_workers(), trivial_workers()
    proc, url = start_router("--worker-urls", w1, "--policy", "round_robin",
                             "--health-check-timeout-secs", "1")
    try:
        _wait(lambda: httpx.get(url + "/readiness").status_code == 200, "readiness")
        live = httpx.get(url + "/liveness")
        assert live.status_code == 200 and live.text == "OK"
        assert httpx.get(url + "/readiness").json() == {
            "status": "ready", "healthy_workers": 1, "total_workers": 1}

        r = httpx.post(url + "/workers", json={"url": w2})
        assert r.status_code == 200, r.text
        assert r.json()["success"] is True and r.json()["worker"]["url"] == w2
        listed = httpx.get(url + "/workers").json()
        assert listed["total"] == 2 and listed["stats"]["regular_count"] == 2
        assert {w["url"]: (w["model_id"], w["is_healthy"], w["worker_type"])
                for w in listed["workers"]} == {w1: ("trivial", True, "regular"),
                                                w2: ("trivial", True, "regular")}
        # The worker's URL in the path, percent-encoded or not
        for path in (quote(w2, safe=""), w2):
            one = httpx.get(f"{url}/workers/{path}")
            assert one.status_code == 200 and one.json()["url"] == w2, path

        # Fields this router cannot act on are refused, naming the field; nothing is added
        for body, field in (({"url": w3, "priority": 5}, "priority"),
                            ({"url": w3, "worker_type": "prefill"}, "worker_type"),
                            ({"url": w3, "api_key": 5}, "api_key"),
                            ({"url": 5}, "url"), ({"nope": 1}, "nope"), ([w3], "JSON object")):
            r = httpx.post(url + "/workers", json=body)
            assert r.status_code == 400 and field in r.json()["error"]["message"], (body, r.text)
        assert httpx.post(url + "/workers", content=b"{not json").status_code == 400
        with socket.socket() as silent:     # takes the connection, never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            r = httpx.post(url + "/workers", timeout=30,
                           json={"url": f"http://127.0.0.1:{silent.getsockname()[1]}"})
        assert r.status_code == 400 and "no answer within 1 s" in r.json()["error"]["message"]
        r = httpx.post(url + "/workers", json={"url": w2})
        assert r.status_code == 400 and "already registered" in r.json()["error"]["message"]
        assert httpx.get(url + "/workers").json()["total"] == 2

        assert httpx.get(url + "/get_loads").json() == {
            "workers": [{"worker": w1, "load": 0}, {"worker": w2, "load": 0}]}
        trivial_workers.kill(w2)      # an unhealthy worker's load is unknown: -1
        _wait(lambda: {x["worker"]: x["load"] for x in
                       httpx.get(url + "/get_loads").json()["workers"]}.get(w2) == -1,
              "the killed worker's load to read -1")

        r = httpx.delete(f"{url}/workers/{quote(w2, safe='')}")
        assert r.status_code == 200 and r.json()["success"] is True
        assert httpx.get(f"{url}/workers/{quote(w2, safe='')}").status_code == 404
        assert httpx.delete(f"{url}/workers/{quote(w2, safe='')}").status_code == 404
        assert [w["url"] for w in httpx.get(url + "/workers").json()["workers"]] == [w1]

        trivial_workers.kill(w1)      # no healthy worker left: not ready, still alive
        _wait(lambda: httpx.get(url + "/readiness").status_code == 503, "not ready")
        assert httpx.get(url + "/readiness").json()["status"] == "not ready"
        assert httpx.get(url + "/liveness").status_code == 200
    finally:
        stop_server(proc)


def test_probes_are_open_and_the_control_plane_takes_the_key(trivial_workers):  # noqa: F811
    w1 = trivial_workers()
    proc, url = start_router("--worker-urls", w1, "--api-key", "k")
    try:
        for path in ("/liveness", "/readiness"):
            _wait(lambda: httpx.get(url + path).status_code == 200, path)
        for path in ("/workers", "/get_loads", f"/workers/{quote(w1, safe='')}"):
            assert httpx.get(url + path).status_code == 401, path
            assert httpx.get(url + path, headers={"Authorization": "Bearer k"}).status_code \
                == 200, path
    finally:
        stop_server(proc)


def _worker_wanting_key(key: str):
    """A trivial worker (in a thread) that answers only requests bearing `key`: (url, stop)."""
    import asyncio
    import threading

    from aiohttp import web

    from radixlm.bench.trivial_worker import app as trivial_app

    @web.middleware
    async def need_key(request, handler):
        if request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "no key"}, status=401)
        return await handler(request)

    app = trivial_app()
    app.middlewares.append(need_key)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def stop():
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    return f"http://127.0.0.1:{port}", stop


def test_a_worker_added_with_its_own_key_gets_that_key(trivial_workers):  # noqa: F811
    """POST /workers {"url", "api_key"} (sglang-router's): the router sends that worker its own
    key, not the router's --api-key."""
    w1 = trivial_workers()
    keyed, stop = _worker_wanting_key("wkey")
    proc, url = start_router("--worker-urls", w1, "--api-key", "k", "--policy", "round_robin")
    auth = {"Authorization": "Bearer k"}
    try:
        r = httpx.post(url + "/workers", headers=auth, json={"url": keyed})
        assert r.status_code == 400 and "401" in r.json()["error"]["message"], r.text
        r = httpx.post(url + "/workers", headers=auth, json={"url": keyed, "api_key": "wkey"})
        assert r.status_code == 200, r.text
        httpx.post(url + "/remove_worker", params={"url": w1}, headers=auth)
        out = httpx.post(url + "/generate", headers=auth,
                         json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
        assert out.status_code == 200 and out.json()["text"] == "ok", out.text
    finally:
        stop_server(proc)
        stop()
