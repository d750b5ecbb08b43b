"""Aborts a client asks for (/abort_request by rid or abort_all; OpenAI requests carrying
SGLang's `rid`), what /health says when the engine has died, and the metrics those touch.
A real `radixlm serve` on the bundled model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from helpers import child_pids, free_port, is_alive, openai_client, start_server, stop_server
from radixlm.utils.server_process import wait_healthy

LONG = {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def url():
    proc, url = start_server("--enable-metrics", "--max-total-tokens", "16384")
    yield url
    stop_server(proc)


def _running(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=30).json()["num_running_reqs"]


def _in_background(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=fn()))
    t.start()
    return t, out


def _wait_running(url: str, n: int) -> None:
    deadline = time.time() + 60
    while _running(url) < n:
        assert time.time() < deadline, "the requests did not start"
        time.sleep(0.05)


def test_abort_by_rid_reaches_a_batch_and_n_samples(url):
    t, out = _in_background(lambda: httpx.post(url + "/generate", timeout=120, json={
        "text": ["Tell a long story.", "Tell another long story."], "rid": "job",
        "sampling_params": {**LONG, "n": 2}}).json())
    _wait_running(url, 4)
    # The rid the client gave reaches the sequences made from it (job_0-0, ..., job_1-1).
    assert httpx.post(url + "/abort_request", json={"rid": "job"}).status_code == 200
    t.join(timeout=60)
    results = out["r"]
    assert len(results) == 4
    assert all(r["meta_info"]["finish_reason"]["type"] == "abort" for r in results)
    assert all(r["meta_info"]["completion_tokens"] < 3000 for r in results)


def test_abort_by_rid_does_not_touch_another_rid_that_starts_alike(url):
    t1, out1 = _in_background(lambda: httpx.post(url + "/generate", timeout=120, json={
        "text": "Tell a long story.", "rid": "run1", "sampling_params": LONG}).json())
    t2, out2 = _in_background(lambda: httpx.post(url + "/generate", timeout=120, json={
        "text": "Tell a long story.", "rid": "run10",
        "sampling_params": {**LONG, "max_new_tokens": 40}}).json())
    _wait_running(url, 2)
    httpx.post(url + "/abort_request", json={"rid": "run1"})
    t1.join(timeout=60)
    t2.join(timeout=60)
    assert out1["r"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert out2["r"]["meta_info"]["finish_reason"] == {"type": "length", "length": 40}


def test_openai_rid_abort_and_abort_all_end_with_finish_reason_abort(url):
    client = openai_client(url)
    messages = [{"role": "user", "content": "Tell me a long story."}]
    t, out = _in_background(lambda: client.chat.completions.create(
        model="m", messages=messages, max_tokens=3000, extra_body={"rid": "chat-7",
                                                                   "ignore_eos": True}))
    _wait_running(url, 1)
    httpx.post(url + "/abort_request", json={"rid": "chat-7"})
    t.join(timeout=60)
    chat = out["r"]
    # As SGLang: a 200 whose choice ends with finish_reason "abort", and the rid as its id.
    assert chat.id == "chat-7" and chat.choices[0].finish_reason == "abort"
    assert chat.usage.completion_tokens < 3000

    t, out = _in_background(lambda: list(client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=3000, stream=True,
        extra_body={"ignore_eos": True})))
    _wait_running(url, 1)
    assert httpx.post(url + "/abort_request", json={"abort_all": True}).status_code == 200
    t.join(timeout=60)
    chunks = out["r"]
    assert chunks[-1].choices[0].finish_reason == "abort"
    # The server goes on serving (abort_all is not a shutdown).
    done = client.completions.create(model="m", prompt="Hi", max_tokens=2)
    assert done.choices[0].finish_reason == "length"
    bad = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "rid": ["a", "b"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"


def test_metrics_leave_out_health_probes_and_count_aborts(url):
    def metric(name: str) -> float:
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = metric("sglang:num_requests_total")
    assert httpx.get(url + "/health_generate", timeout=60).status_code == 200
    assert metric("sglang:num_requests_total") == before
    httpx.post(url + "/generate", json={"text": "Hi", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "n": 3}}, timeout=60)
    assert metric("sglang:num_requests_total") == before + 3      # (not 4: the shared prompt)
    assert metric("sglang:time_per_output_token_seconds_count") >= 3
    assert metric("sglang:num_aborted_requests_total") >= 1        # (the tests above)
    # A batch refused as a whole (its second prompt fails after the first was sent): a 400,
    # and neither a request served nor an abort in the metrics.
    counts = (metric("sglang:num_requests_total"), metric("sglang:num_aborted_requests_total"))
    bad = httpx.post(url + "/generate", json={"input_ids": [[1, 2, 3], [10 ** 9]],
                                              "sampling_params": {"max_new_tokens": 4}})
    assert bad.status_code == 400, bad.text
    assert (metric("sglang:num_requests_total"),
            metric("sglang:num_aborted_requests_total")) == counts
    assert "sglang:num_used_tokens" in httpx.get(url + "/metrics").text
    # SGLang's /v1/ names of tokenize and detokenize.
    ids = httpx.post(url + "/v1/tokenize", json={"prompt": "Hello"}).json()["tokens"]
    assert httpx.post(url + "/v1/detokenize", json={"tokens": ids}).json()["text"] == "Hello"


def test_a_dead_engine_fails_health_and_the_server_exits():
    proc, url = start_server("--max-total-tokens", "2048")
    try:
        children = child_pids(proc.pid)
        scheduler = next(pid for pid in children
                         if b"scheduler" in open(f"/proc/{pid}/cmdline", "rb").read())
        os.kill(scheduler, signal.SIGKILL)
        codes = set()
        deadline = time.time() + 30
        while proc.poll() is None and time.time() < deadline:
            try:
                codes.add(httpx.get(url + "/health", timeout=2).status_code)
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        # The server exits, code 1, as SGLang's does, so that a supervisor restarts it; until
        # then /health answers 503 (or, before the death is noticed, 200).
        assert proc.wait(timeout=30) == 1
        assert codes <= {200, 503}
        assert not any(is_alive(pid) for pid in children)   # none left, none a zombie
    finally:
        stop_server(proc, signal.SIGKILL)


def test_health_is_503_once_the_engine_is_dead():
    import asyncio
    from types import SimpleNamespace

    from radixlm.entrypoints.native_api import health

    def request(dead_reason):
        manager = SimpleNamespace(dead_reason=dead_reason)
        return SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(
            engine=SimpleNamespace(tokenizer_manager=manager))))

    assert asyncio.run(health(request(None))).status_code == 200
    dead = asyncio.run(health(request("the scheduler process exited with code -9")))
    assert dead.status_code == 503 and b"exited with code -9" in dead.body


def test_python_m_launch_server_is_radixlm_serve():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", "--device", "cpu",
                             "--port", str(port), "--log-level", "warning",
                             "--max-total-tokens", "2048"])
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", 240)
        info = httpx.get(f"http://127.0.0.1:{port}/get_model_info").json()
        assert info["model_path"]
    finally:
        stop_server(proc)


def test_watchdog_fires_only_when_stuck_with_work():
    from radixlm.scheduler.watchdog import StepWatchdog

    now, work, fired = [0.0], [False], []
    dog = StepWatchdog(10.0, lambda: work[0], fired.append, clock=lambda: now[0])
    now[0] = 100.0
    assert not dog.check() and not fired          # idle for 100 s: not a stall
    work[0] = True
    now[0] = 105.0
    assert not dog.check()
    dog.beat()
    now[0] = 114.0
    assert not dog.check()                        # 9 s since the loop went round
    now[0] = 116.0
    assert dog.check() and fired == [pytest.approx(11.0)]


def test_a_step_longer_than_the_watchdog_timeout_ends_the_server():
    """--watchdog-timeout 0.05: the first long prefill (over a second on the CPU) counts as a
    stuck scheduler, which exits; the request gets a 503 and the server exits with code 1.
    The request's only step is that prefill (one new token): the batch being launched counts
    as work while its forward runs, though its request is in neither queue then (a stuck
    forward of the only batch was never timed)."""
    proc, url = start_server("--max-total-tokens", "8192", "--watchdog-timeout", "0.05")
    try:
        r = httpx.post(url + "/generate", timeout=60, json={
            "text": "word " * 1500, "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 503 and "exited with code 1" in r.text
        assert proc.wait(timeout=30) == 1
    finally:
        stop_server(proc, signal.SIGKILL)


def test_constraint_errors_name_their_field_on_v1():
    from radixlm.entrypoints.openai.serving_base import engine_error

    assert engine_error(ValueError("invalid regex: unbalanced parenthesis")).param == "regex"
    assert engine_error(ValueError("json_schema is not valid JSON: x")).param == "json_schema"
    assert engine_error(ValueError("invalid ebnf: rule x undefined")).param == "ebnf"
    assert engine_error(ValueError("the prompt is empty")).param is None
    # The sampling checks' messages start with the field (named as the OpenAI request does)
    from radixlm.sampling.params import SamplingParams
    for fields, param in (({"top_k": 0}, "top_k"), ({"min_p": 1.5}, "min_p"),
                          ({"repetition_penalty": 0}, "repetition_penalty"),
                          ({"stop": [""]}, "stop"),
                          ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_tokens")):
        with pytest.raises(ValueError) as e:
            SamplingParams.from_dict(fields).validate()
        assert engine_error(e.value).param == param, (fields, str(e.value))


def test_health_generate_busy_is_healthy_and_stuck_is_a_503(monkeypatch):
    """/health_generate answers 200 for an engine busy enough that its probe waits in (or is
    refused by) a full queue, because outputs keep coming; and 503 within
    RADIXLM_HEALTH_CHECK_TIMEOUT for a scheduler that produces nothing (stopped), 200 again
    once it runs."""
    monkeypatch.setenv("RADIXLM_HEALTH_CHECK_TIMEOUT", "8")
    proc, url = start_server("--max-total-tokens", "4096", "--max-running-requests", "1",
                             "--max-queued-requests", "1")
    try:
        busy = [_in_background(lambda: httpx.post(url + "/generate", json={
            "text": "Hi", "sampling_params": {**LONG, "max_new_tokens": 400}}, timeout=300))
            for _ in range(2)]
        while _running(url) < 1:
            time.sleep(0.2)
        t0 = time.monotonic()
        assert httpx.get(url + "/health_generate", timeout=60).status_code == 200
        assert time.monotonic() - t0 < 8
        httpx.post(url + "/abort_request", json={"abort_all": True})
        for t, _ in busy:
            t.join(timeout=120)
        scheduler = [p for p in child_pids(proc.pid)
                     if b"scheduler" in open(f"/proc/{p}/cmdline", "rb").read()][0]
        os.kill(scheduler, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            r = httpx.get(url + "/health_generate", timeout=60)
            assert r.status_code == 503 and "nothing" in r.json()["message"], r.text
            assert 7 < time.monotonic() - t0 < 30
            assert httpx.get(url + "/health", timeout=10).status_code == 200
        finally:
            os.kill(scheduler, signal.SIGCONT)
        # Healthy again once it runs (on a loaded machine the first probe after the stall
        # may still time out while the scheduler catches up)
        deadline = time.monotonic() + 90
        while httpx.get(url + "/health_generate", timeout=60).status_code != 200:
            assert time.monotonic() < deadline, "still 503 90 s after SIGCONT"
    finally:
        stop_server(proc)
