"""radixlm workers behind SGLang's own router (the `sglang-router` package from PyPI): two
workers under its cache-aware policy; it discovers the model and tokenizer from /model_info and
routes native and OpenAI requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from helpers import free_port, start_server, stop_server

pytest.importorskip("sglang_router")
pytestmark = pytest.mark.slow


def launch_sglang_router(workers: list[str], policy: str, log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with open(log, "w") as out:
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers,
             "--policy", policy, "--port", str(port), "--host", "127.0.0.1",
             "--log-level", "info", "--prometheus-port", str(free_port())],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert router.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return router, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            router.kill()
            raise AssertionError(log.read_text())
        time.sleep(0.3)


def stop_router(router: subprocess.Popen) -> None:
    router.terminate()
    router.wait(timeout=30)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    servers = [start_server("--max-total-tokens", "4096") for _ in range(2)]
    workers = [url for _, url in servers]
    log = tmp_path_factory.mktemp("router") / "router.log"
    try:
        router, url = launch_sglang_router(workers, "cache_aware", log)
        yield url, workers, log
        stop_router(router)
    finally:
        for proc, _ in servers:
            stop_server(proc)


def test_router_registers_model_and_routes(routed):
    url, workers, log = routed
    body = {"text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    direct = httpx.post(workers[0] + "/generate", json=body, timeout=60).json()
    via = httpx.post(url + "/generate", json=body, timeout=60)
    assert via.status_code == 200, via.text
    assert via.json()["output_ids"] == direct["output_ids"]

    with httpx.stream("POST", url + "/generate", timeout=60,
                      json={**body, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["output_ids"] == direct["output_ids"]

    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    chat = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4, temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 4

    text = log.read_text()
    assert "No tokenizer_path or model_path found" not in text
    assert "SmolLM2-135M-Instruct" in text  # the worker's model was discovered by name


def test_every_worker_serves_through_the_real_router(routed, tmp_path):
    """Under its round_robin policy both workers answer; the worker endpoint the real router
    polls for its load-aware policies (/get_load) answers in its shape. (How its cache_aware
    policy spreads a few sequential misses is its own business: in one run all went to one
    worker.)"""
    _, workers, _ = routed
    router, url = launch_sglang_router(workers, "round_robin", tmp_path / "rr.log")
    try:
        before = [httpx.get(w + "/get_server_info").json()["generated_tokens_total"]
                  for w in workers]
        for i in range(4):
            r = httpx.post(url + "/generate", timeout=60, json={
                "text": f"Topic number {i}: tell me about it.",
                "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
            assert r.status_code == 200, r.text
        after = [httpx.get(w + "/get_server_info").json()["generated_tokens_total"]
                 for w in workers]
        assert all(a > b for a, b in zip(after, before))
    finally:
        stop_router(router)
    load = httpx.get(workers[0] + "/get_load").json()
    assert set(load[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
