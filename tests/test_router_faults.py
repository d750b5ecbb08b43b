"""The router against workers that fail in each way a real one can (bench/trivial_worker.py's
--fail modes): what the client gets, which worker is taken out, and that nothing hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from helpers import free_port, stop_server
from radixlm.utils.server_process import wait_healthy
from test_router import start_router

pytestmark = pytest.mark.slow
BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}


@pytest.fixture
def trivial_workers():
    """start(fail) -> url of a new trivial worker; start.kill(url) SIGKILLs it."""
    procs: dict[str, subprocess.Popen] = {}

    def start(fail: str = "none") -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "radixlm.bench.trivial_worker",
                                 "--port", str(port), "--fail", fail], start_new_session=True)
        procs[url] = proc
        wait_healthy(proc, url, 60, poll_s=0.1)
        return url

    def kill(url: str) -> None:
        os.killpg(procs[url].pid, signal.SIGKILL)
        procs[url].wait()

    start.kill = kill
    yield start
    for p in procs.values():
        stop_server(p)


def routed(*workers: str, flags: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    # A long health interval: a worker taken out stays out for the test.
    proc, url = start_router("--worker-urls", *workers, "--policy", "round_robin",
                             "--health-check-interval-secs", "600", *flags)
    return proc, url


def workers_state(url: str) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(url + "/list_workers").json()["workers"]}


@pytest.mark.parametrize("mode", ["503", "close", "truncate"])
def test_a_failed_request_is_retried_on_another_worker(trivial_workers, mode):
    bad, good = trivial_workers(mode), trivial_workers()
    proc, url = routed(bad, good)
    try:
        for _ in range(4):   # round robin: the bad worker is tried first at least once
            r = httpx.post(url + "/generate", json=BODY, timeout=30)
            assert r.status_code == 200 and r.json()["text"] == "ok"
        state = workers_state(url)
        assert not state[bad]["healthy"] and state[bad]["failures_total"] == 1
        assert state[good]["healthy"]
        assert "radixlm_router_retries_total 1.0" in httpx.get(url + "/metrics").text
    finally:
        stop_server(proc)


@pytest.mark.parametrize("stream", [False, True])
def test_a_killed_worker_is_taken_out_and_its_requests_go_elsewhere(trivial_workers, stream):
    # A killed engine (bench router --part failover): its port refuses connections, and the
    # router's kept-alive connections to it are dead.
    dead, good = trivial_workers(), trivial_workers()
    proc, url = routed(dead, good)
    try:
        for _ in range(2):   # a kept-alive connection to each
            assert httpx.post(url + "/generate", json=BODY, timeout=30).status_code == 200
        trivial_workers.kill(dead)
        for _ in range(4):
            if stream:
                assert json.loads(stream_lines(url)[0][6:])["text"] == "ok"
            else:
                r = httpx.post(url + "/generate", json=BODY, timeout=30)
                assert r.status_code == 200 and r.json()["text"] == "ok"
        state = workers_state(url)
        assert not state[dead]["healthy"] and state[dead]["failures_total"] == 1
        assert state[good]["healthy"] and state[good]["requests_total"] == 5
        assert "radixlm_router_retries_total 1.0" in httpx.get(url + "/metrics").text
    finally:
        stop_server(proc)


def test_the_last_workers_error_reaches_the_client(trivial_workers):
    bad = trivial_workers("503")
    proc, url = routed(bad, flags=("--max-retries", "0"))
    try:
        r = httpx.post(url + "/generate", json=BODY, timeout=30)
        assert r.status_code == 503 and r.json()["message"] == "engine dead"
        assert not workers_state(url)[bad]["healthy"]
        again = httpx.post(url + "/generate", json=BODY, timeout=30)   # none left
        assert again.status_code == 503 and "no worker" in again.json()["error"]["message"]
    finally:
        stop_server(proc)


def stream_lines(url: str) -> list[str]:
    with httpx.stream("POST", url + "/generate", json={**BODY, "stream": True},
                      timeout=30) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line.startswith("data: ")]


def test_a_stream_that_fails_before_its_first_byte_is_retried(trivial_workers):
    bad, good = trivial_workers("stream-head"), trivial_workers()
    proc, url = routed(bad, good)
    try:
        for _ in range(2):
            lines = stream_lines(url)
            assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["text"] == "ok"
        assert not workers_state(url)[bad]["healthy"]
    finally:
        stop_server(proc)


def test_a_stream_cut_midway_ends_with_an_error_event(trivial_workers):
    bad = trivial_workers("stream-cut")
    proc, url = routed(bad)
    try:
        lines = stream_lines(url)
        assert [json.loads(x[6:])["output_ids"] for x in lines[:2]] == [[1], [1, 1]]
        assert json.loads(lines[2][6:])["error"]["code"] == 502
        assert lines[3:] == ["data: [DONE]"]
        assert not workers_state(url)[bad]["healthy"]
    finally:
        stop_server(proc)


def test_flush_cache_when_a_worker_refuses(trivial_workers):
    """A worker that cannot flush (busy: 400): alone, its answer as it gave it; beside one that
    flushed, a 206 naming it and why (it was a 500 with a bytes dump)."""
    ok, busy = trivial_workers(), trivial_workers("busy")
    proc, url = routed(ok, busy)
    try:
        r = httpx.post(url + "/flush_cache", timeout=30)
        assert r.status_code == 206, r.text
        assert r.json()["failed_workers"] == [busy]
        assert "requests are running" in r.json()["details"][0]["message"]
    finally:
        stop_server(proc)
    proc, url = routed(busy)
    try:
        r = httpx.post(url + "/flush_cache", timeout=30)
        assert r.status_code == 400 and "requests are running" in r.json()["error"]["message"]
    finally:
        stop_server(proc)


def test_a_worker_url_that_leads_back_to_the_router_is_refused(trivial_workers):
    """The router's own address as a worker: its probe comes back to it and is answered 508,
    so the URL is not added (a request once forwarded itself until the file descriptors ran
    out)."""
    worker = trivial_workers()
    proc, url = routed(worker)
    try:
        r = httpx.post(url + "/add_worker", params={"url": url}, timeout=30)
        assert r.status_code != 200, r.text
        assert url not in workers_state(url)
        assert httpx.post(url + "/generate", json=BODY, timeout=30).status_code == 200
        looped = httpx.get(url + "/health", headers={"X-Radixlm-Routers": "x"}, timeout=30)
        assert looped.status_code == 200        # (another router's id: not a loop)
    finally:
        stop_server(proc)
