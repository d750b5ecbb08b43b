"""`radixlm bench router --part failover`: one engine SIGKILLed mid-run behind the radixlm
router (what it costs: requests lost, time to recover). See bench/router.py."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx

from radixlm.bench.router_common import (build_workload, client_session, engine_capacity,
                                        engines_running, generate_one, list_workers,
                                        sampling_params, start_router, warm_up, workload_record)
from radixlm.utils.server_process import stop_server


# ---------------------------------------------------------------------- failover

def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def kill_engine(proc: subprocess.Popen) -> None:
    """SIGKILL the engine's whole process group: its `radixlm serve` process, scheduler and
    detokenizer (engines_running starts each engine in a session of its own). The engines of
    a `--dp-size` server have sessions of their own, and exit with it through
    RADIXLM_DIE_WITH_PARENT."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:   # already gone
        pass


def wait_port_down(proc: subprocess.Popen, url: str, timeout_s: float = 30) -> float:
    """After kill_engine: wait until the engine's port refuses connections, then reap the
    process. Returns the seconds until the port was down; raises RuntimeError if it still
    accepts connections after timeout_s (a child that kept the listening socket would hold
    the router's requests until their timeout)."""
    start = time.perf_counter()
    port = int(url.rsplit(":", 1)[1])
    while _port_open(port):
        if time.perf_counter() - start > timeout_s:
            raise RuntimeError(f"{url} still accepts connections {timeout_s:g} s after SIGKILL")
        time.sleep(0.01)
    down = time.perf_counter() - start
    proc.wait()
    return down


def _arrivals(ns: argparse.Namespace, n: int) -> list[float]:
    """Send offsets in seconds: a Poisson process at --request-rate, else all at 0 (then
    --max-concurrency paces them)."""
    if ns.request_rate is None:
        return [0.0] * n
    rng = random.Random(ns.seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(ns.request_rate)
    return out


async def _failover_load(ns: argparse.Namespace, router: str, prompts: list[str],
                         engines: list[tuple[subprocess.Popen, str]]) -> dict[str, Any]:
    """Send the workload through the router, kill one engine --kill-after seconds after the
    first request, and watch the router take it out. Times are seconds from the first send."""
    params = sampling_params(ns.output_len)
    gate = asyncio.Semaphore(ns.max_concurrency or len(prompts))
    records: list[dict[str, Any]] = []
    kill: dict[str, Any] = {}
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    async with client_session() as session:
        async def one(i: int, prompt: str, at: float) -> None:
            await asyncio.sleep(max(0.0, at - now()))
            async with gate:
                rec: dict[str, Any] = {"index": i, "sent_s": now()}
                try:
                    out = await generate_one(session, router, prompt, params, ns.stream)
                    meta = out["meta_info"]
                    rec.update(ok=True, output_tokens=meta["completion_tokens"],
                               prompt_tokens=meta["prompt_tokens"],
                               cached_tokens=meta["cached_tokens"])
                except Exception as e:   # a failed request is a figure, not a crash
                    rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
                rec["end_s"] = now()
                records.append(rec)

        async def killer() -> None:
            await asyncio.sleep(ns.kill_after)
            async with session.get(router + "/list_workers") as r:
                by_url = {w["url"]: w for w in (await r.json())["workers"]}
            workers = [by_url[u] for _, u in engines]     # in engine order
            if ns.kill_engine is None:   # the one with the most requests in flight
                victim = max(range(len(engines)), key=lambda i: (workers[i]["in_flight"], -i))
            else:
                victim = ns.kill_engine
            proc, url = engines[victim]
            kill.update(engine=victim, url=url, pid=proc.pid, at_s=now(),
                        in_flight_on_engine=workers[victim]["in_flight"],
                        in_flight_total=sum(w["in_flight"] for w in workers),
                        requests_per_engine_before=[w["requests_total"] for w in workers])
            kill_engine(proc)
            port_down = asyncio.create_task(asyncio.to_thread(wait_port_down, proc, url))
            # Until the router marks it unhealthy it may still pick it (and retry elsewhere).
            while True:
                async with session.get(router + "/list_workers") as r:
                    state = {w["url"]: w for w in (await r.json())["workers"]}[url]
                if not state["healthy"]:
                    kill["taken_out_s"] = now() - kill["at_s"]
                    break
                await asyncio.sleep(0.02)
            kill["port_down_s"] = await port_down

        kill_task = asyncio.create_task(killer())
        await asyncio.gather(*(one(i, p, at) for i, (p, at) in
                               enumerate(zip(prompts, _arrivals(ns, len(prompts))))))
        wall = now()
        if "at_s" not in kill:           # the load ended first: nothing was measured
            kill_task.cancel()
        else:
            try:   # a dead worker nobody routes to is only found by the health check
                await asyncio.wait_for(kill_task, 30)
            except TimeoutError:
                kill["taken_out_s"] = None
    records.sort(key=lambda r: r["index"])
    return {"records": records, "kill": kill, "wall_s": wall}


def failover_summary(records: list[dict], kill_at: float, wall: float,
                     taken_out_s: float | None) -> dict[str, Any]:
    """Figures of a failover run from its per-request records (times in seconds from the first
    send; the engine was killed at `kill_at`).

    - Requests "sent before the kill" were in flight somewhere (or done) when it came; those
      "sent after" had not started: the target is that none of them fails.
    - `taken_out_s`: from the kill until the router listed the engine as unhealthy (polled
      every 20 ms): from then on it sends nothing to it (a request that reaches the dead
      engine before that fails there and is retried on another).
    - `last_failure_end_s`: from the kill until the last failed request ended (None: none
      failed).
    - `recover_s`: from the kill until the later of the two; every request that ended after
      that moment succeeded and none was sent to the dead engine.
    - Throughput (requests, and their output tokens, that ended successfully in a window,
      over its length), in the steady parts of the run: before = from the first request's end
      (the ramp-up has none) to the kill; after = from the kill to the last send (after it
      fewer requests are left than slots: the drain), or to the last end when every request
      was sent before the kill. `timeline` has the ends per second of the whole run.
    """
    ok = [r for r in records if r["ok"]]
    failed = [r for r in records if not r["ok"]]
    before = [r for r in records if r["sent_s"] < kill_at]
    last_failure = max((r["end_s"] for r in failed), default=None)
    last_failure_end_s = None if last_failure is None else max(0.0, last_failure - kill_at)
    recover = [x for x in (taken_out_s, last_failure_end_s) if x is not None]

    def rate(lo: float, hi: float) -> dict[str, float] | None:
        if hi <= lo:
            return None
        done = [r for r in ok if lo <= r["end_s"] < hi]
        tokens = sum(r["output_tokens"] for r in done)
        return {"from_s": lo, "to_s": hi, "requests": len(done),
                "requests_per_s": len(done) / (hi - lo), "output_tokens": tokens,
                "output_throughput": tokens / (hi - lo)}

    last_send = max(r["sent_s"] for r in records)
    pre = rate(min((r["end_s"] for r in records), default=kill_at), kill_at)
    post = rate(kill_at, last_send if last_send > kill_at else wall + 1e-9)
    timeline = []
    for b in range(int(wall) + 1):   # 1-second bins from the first send
        ended = [r for r in records if b <= r["end_s"] < b + 1]
        timeline.append({"t_s": b, "ended": len(ended),
                         "failed": sum(not r["ok"] for r in ended),
                         "output_tokens": sum(r.get("output_tokens", 0) for r in ended)})
    return {
        "total": len(records), "succeeded": len(ok), "failed": len(failed),
        "sent_before_kill": len(before), "sent_after_kill": len(records) - len(before),
        "in_flight_at_kill": sum(r["end_s"] > kill_at for r in before),
        "failed_sent_before_kill": sum(r["sent_s"] < kill_at for r in failed),
        "failed_sent_after_kill": sum(r["sent_s"] >= kill_at for r in failed),
        "errors": dict(collections.Counter(r["error"] for r in failed).most_common(5)),
        "taken_out_s": taken_out_s, "last_failure_end_s": last_failure_end_s,
        "recover_s": max(recover) if recover else None,
        "throughput_before_kill": pre, "throughput_after_kill": post,
        "throughput_after_vs_before": (post["output_throughput"] / pre["output_throughput"]
                                        if pre and post and pre["output_throughput"] else None),
        "timeline": timeline,
    }


def router_metrics(router_url: str) -> dict[str, Any]:
    """From the router's GET /metrics: retries (requests sent again to another worker), and
    per worker the requests routed to it and the requests that failed on it."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {"retries": 0.0, "requests": {}, "worker_failures": {}}
    text = httpx.get(router_url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "radixlm_router_retries_total":
                out["retries"] = s.value
            elif s.name == "radixlm_router_requests_total":
                out["requests"][s.labels["worker"]] = s.value
            elif s.name == "radixlm_router_worker_failures_total":
                out["worker_failures"][s.labels["worker"]] = s.value
    return out


def run_failover(ns: argparse.Namespace) -> dict[str, Any]:
    with engines_running(ns) as engines:
        workers = [url for _, url in engines]
        capacity = engine_capacity(workers)
        prompts = build_workload(ns)
        warm_up(workers, prompts)
        proc, url = start_router("radixlm", "cache_aware", workers)
        try:
            run = asyncio.run(_failover_load(ns, url, prompts, engines))
            by_url = {w["url"]: w for w in list_workers(url)}
            state = [by_url[u] for u in workers]      # in engine order
            metrics = router_metrics(url)
        finally:
            stop_server(proc)
    kill, records = run["kill"], run["records"]
    result: dict[str, Any] = {
        "workload": workload_record(ns, "request_rate", "stream"),
        "engines": {"count": ns.num_engines, "share_gpu": ns.share_gpu,
                    "engine_args": ns.engine_args, "kv_capacity_tokens": capacity},
        "router": {"kind": "radixlm", "policy": "cache_aware"},
        "kill_after_s": ns.kill_after, "wall_s": run["wall_s"],
        "kill": None, "summary": None, "router_metrics": metrics,
        "requests_per_engine": [w["requests_total"] for w in state],
        "healthy_at_end": [w["healthy"] for w in state],
        "requests": records,
    }
    if "at_s" not in kill:
        print(f"the load ended after {run['wall_s']:.1f} s, before --kill-after "
              f"{ns.kill_after:g}: no engine was killed", file=sys.stderr, flush=True)
        return result
    before = kill.pop("requests_per_engine_before")
    kill["requests_per_engine_after"] = [
        n - b for n, b in zip(result["requests_per_engine"], before)]
    kill["requests_to_others_after"] = sum(
        n for i, n in enumerate(kill["requests_per_engine_after"]) if i != kill["engine"])
    result["kill"] = kill
    result["summary"] = failover_summary(records, kill["at_s"], run["wall_s"],
                                         kill.get("taken_out_s"))
    return result


def failover_line(result: dict[str, Any]) -> str:
    kill, s = result["kill"], result["summary"]
    if kill is None:
        return (f"router failover: no engine killed (the load ended after "
                f"{result['wall_s']:.1f} s, before --kill-after {result['kill_after_s']:g} s)")

    def secs(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f} s"

    def tok_s(window: dict | None) -> str:
        return "n/a" if window is None else f"{window['output_throughput']:.0f}"

    ratio = s["throughput_after_vs_before"]
    return (f"router failover: engine {kill['engine']} of {result['engines']['count']} killed "
            f"at {kill['at_s']:.1f} s ({kill['in_flight_on_engine']} in flight on it); "
            f"{s['total']} requests, {s['succeeded']} ok, {s['failed']} failed "
            f"({s['failed_sent_before_kill']} sent before the kill, "
            f"{s['failed_sent_after_kill']} after: target 0); taken out in "
            f"{secs(s['taken_out_s'])}, recovered in {secs(s['recover_s'])}; "
            f"router retries {result['router_metrics']['retries']:.0f}; output "
            f"{tok_s(s['throughput_before_kill'])} -> {tok_s(s['throughput_after_kill'])} tok/s"
            + (f" ({ratio:.2f}x)" if ratio is not None else ""))
