"""`radixlm router` in front of real `radixlm serve` processes on the CPU (the bundled model):
every endpoint through it, prefix affinity, aborts by disconnect, the API key, bad input,
workers that die, come back, are added and removed at run time, and `serve --dp-size 2`."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers import free_port, is_alive, openai_client, start_server, stop_server
from radixlm.utils.server_process import wait_healthy

pytestmark = pytest.mark.slow
GREEDY = {"max_new_tokens": 6, "temperature": 0}


def start_router(*flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "router", "--port", str(port),
                             "--health-check-interval-secs", "1", "--log-level", "warning",
                             *flags], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:   # any answer will do: /health is a 503 until a worker is healthy
        assert proc.poll() is None, "the router exited during start-up"
        try:
            httpx.get(url + "/list_workers", timeout=2)
            return proc, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.2)


def worker_counts(url: str) -> dict[str, int]:
    return {w["url"]: w["requests_total"]
            for w in httpx.get(url + "/list_workers").json()["workers"]}


def wait_for(predicate, timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def workers():
    procs = [start_server("--max-total-tokens", "4096") for _ in range(2)]
    yield [url for _, url in procs]
    for proc, _ in procs:
        stop_server(proc)


@pytest.fixture(scope="module")
def router(workers):
    proc, url = start_router("--worker-urls", *workers)
    wait_for(lambda: httpx.get(url + "/health").status_code == 200, what="router health")
    yield url
    stop_server(proc)


def test_every_endpoint_through_the_router(router, workers):
    body = {"text": "The capital of France is", "sampling_params": GREEDY}
    direct = httpx.post(workers[0] + "/generate", json=body, timeout=60).json()
    via = httpx.post(router + "/generate", json=body, timeout=60)
    assert via.status_code == 200 and via.json()["output_ids"] == direct["output_ids"]

    batch = httpx.post(router + "/generate", timeout=60,
                       json={"text": ["The capital of France is", "1, 2, 3,"],
                             "sampling_params": GREEDY}).json()
    assert [b["output_ids"] for b in batch][0] == direct["output_ids"] and len(batch) == 2

    with httpx.stream("POST", router + "/generate", timeout=60,
                      json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(lines) == GREEDY["max_new_tokens"] + 1 and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["output_ids"] == direct["output_ids"]

    client = openai_client(router)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert chat.usage.completion_tokens == 4 and chat.choices[0].message.content
    pieces = [c.choices[0].text for c in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=4, temperature=0, stream=True)]
    assert len("".join(pieces)) > 0

    assert httpx.get(router + "/get_model_info").json()["model_path"]
    info = httpx.get(router + "/get_server_info").json()
    assert len(info["internal_states"]) == 2 and len(info["workers"]) == 2
    loads = httpx.get(router + "/get_load").json()
    assert len(loads) == 2 and all("num_reqs" in x for x in loads)
    assert httpx.post(router + "/tokenize", json={"prompt": "Hello"}).json()["count"] >= 1
    assert httpx.get(router + "/health").status_code == 200
    assert httpx.post(router + "/flush_cache").status_code == 200
    assert all(w["tree_size"] == 0 for w in httpx.get(router + "/list_workers").json()["workers"])
    metrics = httpx.get(router + "/metrics").text
    assert "radixlm_router_requests_total" in metrics
    assert 'radixlm_router_policy_decisions_total{decision="cache_miss"}' in metrics
    # SGLang's other names and the per-model route reach a worker; profiles fan out.
    assert client.models.retrieve(model).id == model
    assert httpx.post(router + "/v1/tokenize", json={"prompt": "Hello"}).json()["count"] >= 1
    started = httpx.post(router + "/start_profile", json={"activities": ["CPU"]})
    assert started.status_code == 200
    stopped = httpx.post(router + "/stop_profile", timeout=60)
    assert stopped.status_code == 200, stopped.text
    traces = [w["trace_path"] for w in stopped.json()["workers"]]   # each worker wrote one
    assert len(set(traces)) == len(workers) and all(os.path.exists(t) for t in traces)
    for t in traces:
        os.remove(t)
    missing = httpx.get(router + "/no_such_route")
    assert missing.status_code == 404 and "no_such_route" in missing.json()["message"]
    assert httpx.get(router + "/generate").status_code == 405


def test_files_batches_responses_through_the_router_stay_on_one_worker(router, workers):
    """OpenAI's files, batches and stored responses live in one worker: the router sends them
    all to the same one, so a file uploaded through it is found by the batch and its output
    read back, and a response continued by previous_response_id finds its conversation."""
    import io
    import time

    client = openai_client(router)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0}}
    data = io.BytesIO((json.dumps(line) + "\n").encode())
    data.name = "in.jsonl"
    upload = client.files.create(file=data, purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 1
    out = json.loads(client.files.content(batch.output_file_id).text)
    direct = openai_client(workers[0]).completions.create(**line["body"])
    assert out["response"]["body"]["choices"][0]["text"] == direct.choices[0].text
    assert [f.id for f in client.files.list(limit=100).data].count(upload.id) == 1
    # Stored responses too: a continuation through the router finds its conversation.
    first = client.responses.create(model="m", input="Hi", max_output_tokens=3)
    again = client.responses.create(model="m", input="And?", max_output_tokens=3,
                                    previous_response_id=first.id)
    assert again.previous_response_id == first.id
    assert client.responses.retrieve(again.id).output_text == again.output_text


def test_abort_all_through_the_router_aborts_and_keeps_the_workers(router, workers):
    client = openai_client(router)
    model = client.models.list().data[0].id
    long = dict(model=model, max_tokens=2000, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": "Tell me a long story."}])
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(client.chat.completions.create, **long) for _ in range(2)]
        wait_for(lambda: sum(x["num_reqs"] for x in httpx.get(router + "/get_load").json())
                 == 2, 30, "both requests to run")
        assert httpx.post(router + "/abort_request", json={"abort_all": True}).status_code == 200
        done = [f.result(timeout=60) for f in futures]
    # Ended where they were (not run again elsewhere): finish_reason "abort", as SGLang's.
    assert all(d.choices[0].finish_reason == "abort" for d in done)
    assert all(d.usage.completion_tokens < 2000 for d in done)
    state = httpx.get(router + "/list_workers").json()["workers"]
    assert all(w["healthy"] for w in state) and sum(w["failures_total"] for w in state) == 0


def test_requests_sharing_a_prefix_land_on_one_worker(router, workers):
    httpx.post(router + "/flush_cache")
    before = worker_counts(router)
    system = "You are a helpful assistant who answers questions about geography. " * 6
    outs = [httpx.post(router + "/generate", timeout=60,
                       json={"text": system + f"Question {i}: name a river.",
                             "sampling_params": GREEDY}).json() for i in range(4)]
    after = worker_counts(router)
    assert sorted(after[w] - before[w] for w in workers) == [0, 4]
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs[1:])


def test_client_disconnect_aborts_the_request_on_its_worker(router):
    long = {"text": "Tell me a long story.", "sampling_params": {"max_new_tokens": 4000,
                                                                  "ignore_eos": True}}
    with httpx.stream("POST", router + "/generate", json={**long, "stream": True},
                      timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    with pytest.raises(httpx.TimeoutException):
        httpx.post(router + "/generate", json=long, timeout=1.0)

    def idle() -> bool:
        return all(x["num_reqs"] == 0 for x in httpx.get(router + "/get_load").json())
    wait_for(idle, 20, "the workers to drop the abandoned requests")


def test_api_key_is_checked_and_sent_on(workers):
    proc, url = start_router("--worker-urls", *workers, "--api-key", "sekret")
    try:
        wait_for(lambda: httpx.get(url + "/health").status_code == 200, what="router health")
        body = {"text": "Hi", "sampling_params": GREEDY}
        denied = httpx.post(url + "/generate", json=body)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == 401
        assert httpx.get(url + "/metrics").status_code == 200    # Prometheus needs no key
        ok = httpx.post(url + "/generate", json=body, timeout=60,
                        headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
    finally:
        stop_server(proc)


class _NotAServer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_bad_input_gets_clear_errors(router):
    malformed = httpx.post(router + "/generate", content=b"{not json",
                           headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400 and "message" in malformed.json()  # the worker's 400
    bad_params = httpx.post(router + "/v1/completions", json={"model": "x", "prompt": "a",
                                                              "max_tokens": -3})
    assert bad_params.status_code == 400
    assert httpx.post(router + "/add_worker").status_code == 400
    assert httpx.post(router + "/remove_worker", params={"url": "http://nope:1"}).status_code == 400
    dead = httpx.post(router + "/add_worker", params={"url": f"http://127.0.0.1:{free_port()}"})
    assert dead.status_code == 400 and "cannot reach" in dead.json()["message"]
    assert httpx.post(router + "/add_worker", params={"url": "ftp://x"}).status_code == 400
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAServer)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        r = httpx.post(router + "/add_worker",
                       params={"url": f"http://127.0.0.1:{other.server_address[1]}"})
        assert r.status_code == 400 and "not a radixlm or SGLang server" in r.json()["message"]
    finally:
        other.shutdown()
    # The router still serves.
    assert httpx.post(router + "/generate", json={"text": "Hi", "sampling_params": GREEDY},
                      timeout=60).status_code == 200


def test_no_healthy_worker_is_a_503_and_a_worker_added_later_serves(workers):
    proc, url = start_router("--worker-urls", f"http://127.0.0.1:{free_port()}")
    try:
        r = httpx.post(url + "/generate", json={"text": "Hi", "sampling_params": GREEDY})
        assert r.status_code == 503 and r.json()["error"]["type"] == "internal_server_error"
        assert httpx.get(url + "/health").status_code == 503
        added = httpx.post(url + "/add_worker", params={"url": workers[0]})
        assert added.status_code == 200, added.text
        assert url and httpx.get(url + "/health").status_code == 200
        ok = httpx.post(url + "/generate", json={"text": "Hi", "sampling_params": GREEDY},
                        timeout=60)
        assert ok.status_code == 200
        assert httpx.post(url + "/remove_worker", params={"url": workers[0]}).status_code == 200
        assert workers[0] not in worker_counts(url)
    finally:
        stop_server(proc)


def _serve_on(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--device", "cpu",
                             "--log-level", "warning", "--max-total-tokens", "4096",
                             "--port", str(port)], start_new_session=True)
    wait_healthy(proc, f"http://127.0.0.1:{port}", 240)
    return proc


def test_worker_killed_mid_load_then_back(workers):
    port = free_port()
    victim, victim_url = _serve_on(port), f"http://127.0.0.1:{port}"
    proc, url = start_router("--worker-urls", workers[0], victim_url, "--policy", "round_robin")
    try:
        wait_for(lambda: all(w["healthy"] for w in
                             httpx.get(url + "/list_workers").json()["workers"]), what="health")
        n = 48
        body = {"sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}}

        def plain(i: int) -> httpx.Response:
            return httpx.post(url + "/generate", json={**body, "text": f"Story {i}:"},
                              timeout=180)

        def streamed(i: int) -> list[str]:
            with httpx.stream("POST", url + "/generate", timeout=180,
                              json={**body, "text": f"Tale {i}:", "stream": True}) as r:
                return [line for line in r.iter_lines() if line.startswith("data: ")]

        with ThreadPoolExecutor(12) as pool:
            plains = [pool.submit(plain, i) for i in range(8)]
            streams = [pool.submit(streamed, i) for i in range(4)]
            wait_for(lambda: httpx.get(victim_url + "/get_load").json()[0]["num_reqs"] > 0,
                     30, "the victim to be busy")
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            results = [f.result(timeout=240) for f in plains]
            streamed_lines = [f.result(timeout=240) for f in streams]
        # Nothing reached the client of a plain request before the failure: all were retried.
        assert all(r.status_code == 200 for r in results), [r.text for r in results]
        assert all(r.json()["meta_info"]["completion_tokens"] == n for r in results)
        # A stream ends: completely, or with an error event; always with [DONE].
        for lines in streamed_lines:
            assert lines[-1] == "data: [DONE]"
            last = json.loads(lines[-2][6:])
            assert ("error" in last) or last["meta_info"]["completion_tokens"] == n
        state = {w["url"]: w for w in httpx.get(url + "/list_workers").json()["workers"]}
        assert not state[victim_url]["healthy"]
        assert httpx.post(url + "/generate", json={**body, "text": "after"},
                          timeout=180).status_code == 200

        victim = _serve_on(port)     # back on the same address: taken in again
        wait_for(lambda: {w["url"]: w["healthy"] for w in httpx.get(
            url + "/list_workers").json()["workers"]}[victim_url], 30, "the worker to return")
        before = worker_counts(url)[victim_url]
        for i in range(2):
            assert httpx.post(url + "/generate", json={"text": f"x{i}", "sampling_params": GREEDY},
                              timeout=60).status_code == 200
        assert worker_counts(url)[victim_url] == before + 1
    finally:
        stop_server(proc)
        stop_server(victim)


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.split("\n"):
        if line.strip():
            p, pp = map(int, line.split())
            children.setdefault(pp, []).append(p)
    found, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            found.append(c)
            stack.append(c)
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
def test_dp_size_2_serves_and_leaves_no_orphans(stop_signal):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--dp-size", "2",
                             "--device", "cpu", "--log-level", "warning", "--port", str(port),
                             "--max-total-tokens", "4096", "--enable-metrics"],
                            start_new_session=True)
    try:
        wait_healthy(proc, url, 300)
        info = httpx.get(url + "/get_server_info").json()
        assert len(info["internal_states"]) == 2
        # The deployment's figures: its dp size and port, both engines' KV tokens.
        assert info["dp_size"] == 2 and info["port"] == port
        assert info["max_total_num_tokens"] == sum(
            w["max_total_num_tokens"] for w in info["workers"])
        assert [x["dp_rank"] for x in httpx.get(url + "/get_load").json()] == [0, 1]
        out = httpx.post(url + "/generate", json={"text": "The capital of France is",
                                                  "sampling_params": GREEDY}, timeout=60)
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 6
        # SGLang's metrics, summed over the engines, on the public port.
        metrics = httpx.get(url + "/metrics").text
        assert 'sglang:num_requests_total{model_name="SmolLM2-135M-Instruct"} 1.0' in metrics
        assert "sglang:time_to_first_token_seconds_count" in metrics
        family = _descendants(proc.pid)
        assert len(family) >= 6   # 2 engines, each with a scheduler and a detokenizer
        if stop_signal == signal.SIGKILL:
            os.kill(proc.pid, stop_signal)
            proc.wait(timeout=60)
            wait_for(lambda: not any(is_alive(p) for p in family), 30, "every engine to exit")
            return
        # A stream in flight at SIGTERM ends as one server's does: an abort, then [DONE]
        lines: list[str] = []
        with httpx.stream("POST", url + "/generate", timeout=60, json={
                "text": "Count to a thousand:", "stream": True,
                "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}) as r:
            for line in filter(None, r.iter_lines()):
                lines.append(line)
                if len(lines) == 6:
                    t0 = time.monotonic()
                    os.kill(proc.pid, stop_signal)
        assert lines[-1] == "data: [DONE]", lines[-3:]
        last = json.loads(lines[-2].removeprefix("data: "))
        assert last["meta_info"]["finish_reason"]["type"] == "abort", last
        proc.wait(timeout=60)
        assert time.monotonic() - t0 < 8
        wait_for(lambda: not any(is_alive(p) for p in family), 30, "every engine to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_dp_server_exits_when_an_engine_dies():
    """As one server exits when a process of its engine dies (for a supervisor to restart
    it): an engine of --dp-size killed, the server exits with code 1, the other engine too."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--dp-size", "2",
                             "--device", "cpu", "--log-level", "warning", "--port", str(port),
                             "--max-total-tokens", "2048"], start_new_session=True)
    try:
        wait_healthy(proc, url, 300)
        family = _descendants(proc.pid)
        engines = [p for p in family if b"serve" in open(f"/proc/{p}/cmdline", "rb").read()
                   and int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
                   == proc.pid]
        assert len(engines) == 2, engines
        os.kill(engines[0], signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        wait_for(lambda: not any(is_alive(p) for p in family), 30, "every engine to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
