"""`radixlm bench serving`: online serving latency and throughput over HTTP, in the manner of
SGLang's bench_serving, against a radixlm server or any OpenAI-compatible one.

Requests come from the same synthetic datasets as `bench offline` (random, shared-prefix,
nano-vllm) and arrive as a Poisson process at `--request-rate` per second (inf: all at once),
with at most `--max-concurrency` in flight. Every request streams; per request we record the
time to the first token (TTFT), each gap between streamed chunks (ITL), the end-to-end latency
and the output token count; TPOT = (E2E - TTFT) / (output tokens - 1).

Backends: `radixlm` POSTs /generate (SGLang's native API) with `input_ids` (or the text with
`--prompt-format text`); `openai` POSTs /v1/completions with the prompt as text. A chunk can carry
several tokens (jump-forward), so output tokens come from the server's own count (meta_info /
usage) where it gives one, else from tokenizing the streamed text. Failed requests are counted,
never fatal. Prints one summary line last and writes JSON (`--output`).

    radixlm serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy \\
        --tokenizer-path TOKENIZER_DIR &
    radixlm bench serving --backend radixlm --dataset random --num-prompts 200 \\
        --request-rate 8 --max-input-len 1024 --max-output-len 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Sequence

import httpx
import numpy as np
from tqdm import tqdm

from radixlm.bench import common
from radixlm.bench.datasets import (BenchRequest, DatasetArgs, add_dataset_args, attach_text,
                                    dataset_args_from, make_requests, token_pool)

BACKENDS = ("radixlm", "openai")


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    requested_output_tokens: int = 0
    ttft: float = 0.0                 # seconds
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    token_count_source: str = ""      # "server" or "tokenizer"


@dataclass
class Settings:
    backend: str
    url: str
    model: str | None
    temperature: float
    ignore_eos: bool
    prompt_format: str                # ids | text
    headers: dict[str, str]


class _StreamError(Exception):
    """The server answered with an HTTP error status or sent an error event."""


async def _sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a server-sent-event stream (without the closing [DONE]). Raises
    _StreamError for an HTTP error status or an event that carries an error."""
    if response.status_code != 200:
        raise _StreamError(f"HTTP {response.status_code}: "
                           f"{(await response.aread()).decode()[:300]}")
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise _StreamError(json.dumps(event["error"])[:300])
        yield event


class _Clock:
    """Turns stream events into TTFT and ITL: each event that brings new tokens is one step."""

    def __init__(self, res: RequestResult):
        self.res, self.start, self.last = res, time.perf_counter(), None

    def tokens_arrived(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.res.ttft = now - self.start
        else:
            self.res.itl.append(now - self.last)
        self.last = now

    def done(self) -> None:
        self.res.e2e = time.perf_counter() - self.start


async def send_radixlm(client: httpx.AsyncClient, s: Settings, req: BenchRequest,
                       tokenizer: Any) -> RequestResult:
    res = RequestResult(requested_output_tokens=req.output_len)
    body: dict[str, Any] = {"sampling_params": {"max_new_tokens": req.output_len,
                                                "ignore_eos": s.ignore_eos,
                                                "temperature": s.temperature},
                            "stream": True}
    if s.prompt_format == "text":
        body["text"] = req.prompt
    else:
        body["input_ids"] = req.input_ids
    clock, seen, last = _Clock(res), 0, None
    try:
        async with client.stream("POST", s.url + "/generate", json=body,
                                 headers=s.headers) as resp:
            async for event in _sse(resp):
                last = event
                count = event["meta_info"]["completion_tokens"]
                if count > seen:   # the cumulative count: a chunk may hold several tokens
                    seen = count
                    clock.tokens_arrived()
    except _StreamError as e:
        res.error = str(e)
        return res
    clock.done()
    if last is None:
        res.error = "empty stream"
        return res
    meta = last["meta_info"]
    if (meta.get("finish_reason") or {}).get("type") == "abort":
        res.error = f"aborted: {meta['finish_reason'].get('message')}"
        return res
    res.input_tokens, res.output_tokens = meta["prompt_tokens"], meta["completion_tokens"]
    res.ok, res.token_count_source = True, "server"
    return res


async def send_openai(client: httpx.AsyncClient, s: Settings, req: BenchRequest,
                      tokenizer: Any) -> RequestResult:
    res = RequestResult(requested_output_tokens=req.output_len)
    body: dict[str, Any] = {"model": s.model, "prompt": req.prompt, "max_tokens": req.output_len,
                            "temperature": s.temperature, "stream": True,
                            "stream_options": {"include_usage": True}}
    if s.ignore_eos:
        body["ignore_eos"] = True   # an extension that SGLang, vLLM and radixlm accept
    clock, text, usage, finish = _Clock(res), [], None, None
    try:
        async with client.stream("POST", s.url + "/v1/completions", json=body,
                                 headers=s.headers) as resp:
            async for event in _sse(resp):
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    if choice.get("text"):
                        text.append(choice["text"])
                        clock.tokens_arrived()
                    finish = choice.get("finish_reason") or finish
    except _StreamError as e:
        res.error = str(e)
        return res
    clock.done()
    if finish is None:
        res.error = "the stream ended without a finish_reason"
        return res
    if usage:
        res.input_tokens, res.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
        res.token_count_source = "server"
    else:
        res.input_tokens = len(req.input_ids)
        res.output_tokens = len(tokenizer("".join(text), add_special_tokens=False).input_ids)
        res.token_count_source = "tokenizer"
    res.ok = res.output_tokens > 0
    if not res.ok:
        res.error = "no output tokens"
    return res


SENDERS = {"radixlm": send_radixlm, "openai": send_openai}


# ---------------------------------------------------------------------- load generation

@dataclass
class LoadOutcome:
    results: list[RequestResult]    # the finished requests (all of them unless interrupted)
    duration: float
    interrupted: bool = False       # Ctrl-C / SIGTERM: the figures cover what finished


async def run_load(s: Settings, requests: list[BenchRequest], tokenizer: Any, rate: float,
                   max_concurrency: int | None, seed: int, timeout_s: float) -> LoadOutcome:
    send = SENDERS[s.backend]
    limit = max_concurrency or len(requests)
    gate = asyncio.Semaphore(limit)
    rng = np.random.default_rng(seed)
    # httpx caps connections at 100 by default, which would cap the concurrency silently.
    limits = httpx.Limits(max_connections=limit + 8, max_keepalive_connections=limit + 8)
    timeout = httpx.Timeout(timeout_s, connect=60.0)
    done: list[RequestResult] = []
    progress = tqdm(total=len(requests), desc="requests", unit="req", file=sys.stderr,
                    mininterval=1.0, dynamic_ncols=True)
    # A run cut short (Ctrl-C, or SIGTERM from a time limit) still reports what finished.
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted.set)

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def one(req: BenchRequest, record: bool = True) -> RequestResult:
            async with gate:
                try:
                    result = await send(client, s, req, tokenizer)
                except Exception as e:   # a failed request is a figure, not a crash
                    result = RequestResult(error=f"{type(e).__name__}: {e}"[:300],
                                           requested_output_tokens=req.output_len)
            if record:
                done.append(result)
                progress.update(1)
            return result

        async def send_all() -> None:
            tasks = []
            for i, req in enumerate(requests):
                tasks.append(asyncio.create_task(one(req)))
                if math.isfinite(rate) and i + 1 < len(requests):
                    await asyncio.sleep(float(rng.exponential(1.0 / rate)))   # Poisson arrivals
            await asyncio.gather(*tasks)

        try:
            warm = await one(BenchRequest(requests[0].input_ids[:16], 4,
                                          prompt=(requests[0].prompt or "")[:64] or None),
                             record=False)
            if not warm.ok:
                raise WarmUpFailed(f"the warm-up request failed: {warm.error}")
            start = time.perf_counter()
            load = asyncio.ensure_future(send_all())
            stop = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait({load, stop}, return_when=asyncio.FIRST_COMPLETED)
            duration = time.perf_counter() - start
            # Requests still in flight after an interrupt: cancelled, their streams closed.
            pending = asyncio.all_tasks() - {asyncio.current_task()}
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            progress.close()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    if interrupted.is_set():
        print(f"interrupted: {len(done)} of {len(requests)} requests finished; reporting those",
              file=sys.stderr)
    return LoadOutcome(list(done), duration, interrupted.is_set())


def _dist(seconds: Sequence[float]) -> dict[str, float | None]:
    """mean / median / p90 / p99 / std in milliseconds (None when there is nothing)."""
    if not len(seconds):
        return {k: None for k in ("mean", "median", "p90", "p99", "std")}
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {"mean": float(ms.mean()), "median": float(np.median(ms)),
            "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)),
            "std": float(ms.std())}


def metrics(results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    inp = sum(r.input_tokens for r in ok)
    out = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "total_input_tokens": inp, "total_output_tokens": out,
        "output_tokens_requested": sum(r.requested_output_tokens for r in ok),
        "output_len_mismatches": sum(r.output_tokens != r.requested_output_tokens for r in ok),
        "request_throughput": len(ok) / duration,
        "input_throughput": inp / duration, "output_throughput": out / duration,
        "total_throughput": (inp + out) / duration,
        # Mean requests in flight (Little's law): how much concurrency the load really had.
        "concurrency": sum(r.e2e for r in ok) / duration,
        "ttft_ms": _dist([r.ttft for r in ok]), "tpot_ms": _dist(tpot),
        "itl_ms": _dist([g for r in ok for g in r.itl]), "e2e_ms": _dist([r.e2e for r in ok]),
        "token_count_sources": sorted({r.token_count_source for r in ok}),
    }


# ---------------------------------------------------------------------- server discovery

class WarmUpFailed(RuntimeError):
    """The first request, sent before the load, got no answer: nothing could be measured."""


def _served_models(url: str, headers: dict[str, str]) -> Any:
    """The server's /v1/models answer (None when it is not a 200 with JSON). Exits with a
    message naming the URL when nothing answers there (any HTTP answer, even an error, means
    a server is listening)."""
    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise SystemExit(f"radixlm bench serving: cannot reach {url} ({type(e).__name__}: {e}); "
                         f"is the server running there? (--host, --port or --base-url)") from None
    try:
        return r.json() if r.status_code == 200 else None
    except ValueError:
        return None


def _get_json(url: str, headers: dict[str, str]) -> Any:
    try:
        r = httpx.get(url, headers=headers, timeout=30)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _load_tokenizer(ns: argparse.Namespace, info: dict | None) -> tuple[Any, str]:
    from radixlm.model_executor.weight_source import load_tokenizer

    candidates = [ns.tokenizer] if ns.tokenizer else [
        p for p in ((info or {}).get("tokenizer_path"), (info or {}).get("model_path"),
                    ns.model) if p]
    errors = []
    for path in candidates:
        try:
            return load_tokenizer(path), path
        except Exception as e:   # try the next candidate
            errors.append(f"{path}: {type(e).__name__}: {e}")
    raise SystemExit("radixlm bench serving: no tokenizer could be loaded; pass --tokenizer "
                     "(a local HF tokenizer directory)" + "".join(f"\n  {e}" for e in errors))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench serving",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--backend", default="radixlm", choices=BACKENDS)
    p.add_argument("--base-url", default=None, help="default http://HOST:PORT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=None, help="sent as a Bearer token")
    p.add_argument("--model", default=None, help="the `model` field (default: from /v1/models)")
    p.add_argument("--tokenizer", default=None,
                   help="local HF tokenizer (default: the server's tokenizer_path or model path)")
    add_dataset_args(p)
    p.add_argument("--prompt-format", default=None, choices=("ids", "text"),
                   help="radixlm backend: send input_ids (default) or text; openai: always text")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most (default: no limit)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--disable-ignore-eos", action="store_true",
                   help="let requests stop at EOS (output lengths then differ from requested)")
    p.add_argument("--request-timeout", type=float, default=3600.0, help="seconds per request")
    p.add_argument("--output", default=None,
                   help="JSON results (default benchmarks/serving_<timestamp>.json)")
    return p


def _summary(backend: str, dataset: str, m: dict[str, Any]) -> str:
    def ms(d: dict, key: str) -> str:
        return "n/a" if d[key] is None else f"{d[key]:.1f}"
    return (f"serving {backend} {dataset}: {m['completed']}/{m['completed'] + m['failed']} ok, "
            f"{m['request_throughput']:.2f} req/s, in {m['input_throughput']:.1f} tok/s, "
            f"out {m['output_throughput']:.1f} tok/s; TTFT median {ms(m['ttft_ms'], 'median')} "
            f"p99 {ms(m['ttft_ms'], 'p99')} ms; TPOT median {ms(m['tpot_ms'], 'median')} ms; "
            f"ITL median {ms(m['itl_ms'], 'median')} p99 {ms(m['itl_ms'], 'p99')} ms; "
            f"E2E median {ms(m['e2e_ms'], 'median')} ms")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    try:
        dargs: DatasetArgs = dataset_args_from(ns)
    except ValueError as e:
        parser.error(str(e))
    if ns.max_concurrency is not None and ns.max_concurrency < 1:
        parser.error("--max-concurrency must be >= 1")
    if not ns.request_rate > 0:
        parser.error("--request-rate must be > 0 (inf: all at once)")
    if ns.backend == "openai" and ns.prompt_format == "ids":
        parser.error("--backend openai sends text prompts; --prompt-format ids is radixlm only")
    prompt_format = ns.prompt_format or ("text" if ns.backend == "openai" else "ids")
    url = (ns.base_url or f"http://{ns.host}:{ns.port}").rstrip("/")
    headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}

    models = _served_models(url, headers)
    output = ns.output or common.default_output_path("serving")
    common.check_writable(output, "--output")
    model_info = _get_json(url + "/get_model_info", headers)
    model = ns.model or ((models or {}).get("data") or [{}])[0].get("id") or "default"
    tokenizer, tokenizer_path = _load_tokenizer(ns, model_info)
    text = prompt_format == "text"
    pool = token_pool(len(tokenizer), tokenizer, text_safe=text)
    requests = make_requests(dargs, len(tokenizer), tokenizer)
    if text:
        attach_text(requests, tokenizer, pool, dargs.seed)

    settings = Settings(ns.backend, url, model, ns.temperature, not ns.disable_ignore_eos,
                        prompt_format, headers)
    try:
        outcome = asyncio.run(run_load(settings, requests, tokenizer, ns.request_rate,
                                       ns.max_concurrency, dargs.seed, ns.request_timeout))
    except WarmUpFailed as e:
        raise SystemExit(f"radixlm bench serving: {e}") from None
    results, duration = outcome.results, outcome.duration
    m = metrics(results, max(duration, 1e-9))
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"{len(errors)} requests failed, first: {errors[0]}", file=sys.stderr)
    server_info = _get_json(url + "/get_server_info", headers)
    line = _summary(ns.backend, dargs.dataset, m)
    if outcome.interrupted:
        line = f"(interrupted) {line}"
    result = {
        "benchmark": "serving", "summary": line, "interrupted": outcome.interrupted,
        "argv": list(sys.argv[1:] if argv is None else argv),
        # The client machine; the server's own device and settings are under server_info.
        **common.environment(None),
        "backend": ns.backend, "base_url": url, "model": model, "tokenizer": tokenizer_path,
        "settings": {"request_rate": ns.request_rate, "max_concurrency": ns.max_concurrency,
                     "temperature": ns.temperature, "ignore_eos": settings.ignore_eos,
                     "prompt_format": prompt_format, "stream": True},
        "dataset": {**dargs.to_json(), "num_requests": len(requests),
                    "input_tokens_sent": sum(len(r.input_ids) for r in requests)},
        "server_model_info": model_info, "server_info": server_info,
        **m,
        "errors": errors[:20],
        "requests": [{k: v for k, v in asdict(r).items() if k != "itl"} | {"chunks": len(r.itl)
                     + (1 if r.ok else 0)} for r in results],
    }
    path = common.write_json(output, result)
    print(f"results written to {path}", file=sys.stderr)
    common.print_summary(line)
    if outcome.interrupted:
        return 130
    return 0 if m["completed"] else 1   # nothing measured: a script must be able to tell


if __name__ == "__main__":
    sys.exit(main())
