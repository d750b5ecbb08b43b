"""`radixlm bench tp`: tensor-parallel decode speed, TP1 vs TP2/4/8 in the same run.

For each --tp-sizes entry (and, with --compare-custom-all-reduce, each TP > 1 again with the
symmetric-memory all-reduce paths off; with --compare-fused-norm, again with the fused
all-reduce + RMSNorm kernel off, RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM=1; with --compare-gemv,
each TP size again with the batch-1 GEMV kernel off, RADIXLM_DISABLE_GEMV=1), an in-process
`Engine` with `--tp-size N` (random weights by default) and, for each --batch-sizes entry,
`batch` random prompts of --input-len tokens on an empty cache, sent at once and streamed
(ignore_eos, --output-len tokens each). The decode step time is taken while the whole batch
runs: from the last request's first token to the first request's end (decode_step_ms). Reported
per run: decode ms/step, tok/s per request and in all, the memory roofline (bytes one rank reads
a step: its weight shard plus its KV heads of the batch's context, over the copy bandwidth of
GPU 0 measured in the same run) and its fraction, the speed-up over TP1, start-up seconds, and
(batch 1, --profile) rank 0's GPU kernel time a step from the engine's profiler, which shows
host overhead directly, and where it goes by kernel (--kernel-table).

    python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-8b --load-format dummy \\
        --dtype bfloat16 --tokenizer-path TOK --tp-sizes 1 2 4
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shlex
import sys
import tempfile
import time
from typing import Any, Sequence

from radixlm.bench.common import default_output_path, environment, print_summary, write_json
from radixlm.utils.gc_freeze import freeze_startup_heap


def decode_bytes_per_rank(config: dict[str, Any], tp: int, batch: int, context: int,
                          dtype_bytes: int = 2) -> float:
    """Bytes one rank reads in one decode step of a dense Llama-like model: its shard of every
    weight matrix (the LM head too; the embedding only gathers rows) plus the K and V of its
    heads for the batch's context. KV heads are replicated when there are fewer than ranks."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or h // heads
    kv_per_rank = max(kv_heads // tp, 1)
    layer = (h * heads * head_dim / tp              # q
             + 2 * h * kv_per_rank * head_dim        # k, v
             + heads * head_dim * h / tp             # o
             + 3 * h * inter / tp                    # gate, up, down
             + 2 * h)                                # the two norms (every rank)
    weights = config["num_hidden_layers"] * layer + config["vocab_size"] * h / tp + h
    kv = config["num_hidden_layers"] * 2 * kv_per_rank * head_dim * batch * context
    return (weights + kv) * dtype_bytes


def torch_gpu_count() -> int:
    import torch
    return torch.cuda.device_count()


def copy_bandwidth_gpu0() -> float:
    """GPU 0's copy bandwidth (bytes/s, read + write), measured before any engine starts."""
    import torch

    from radixlm.bench.one_batch import copy_bandwidth
    bw = copy_bandwidth(torch.device("cuda", 0))
    torch.cuda.empty_cache()
    return bw


def _dtype_bytes(dtype: str) -> int:
    """Bytes a weight and a KV element take in --dtype (an fp8 KV cache or quantized weights
    given through --engine-args are not counted smaller: the roofline is then generous)."""
    return 4 if dtype in ("float32", "float", "fp32") else 2


def _prompts(rng: random.Random, batch: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(batch)]


def _stream_batch(engine, prompts: list[list[int]], new_tokens: int
                  ) -> list[list[tuple[float, int]]]:
    """Each request's (time, tokens so far) at every streamed chunk, all sent at once."""
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0}

    async def one(ids: list[int]) -> list[tuple[float, int]]:
        seen = []
        async for chunk in await engine.async_generate(input_ids=ids, sampling_params=params,
                                                       stream=True):
            seen.append((time.perf_counter(), chunk["meta_info"]["completion_tokens"]))
        return seen

    async def all_of() -> list[list[tuple[float, int]]]:
        return list(await asyncio.gather(*(one(p) for p in prompts)))

    engine.flush_cache()
    return asyncio.run(all_of())


def _tokens_at(seen: list[tuple[float, int]], t: float) -> int:
    done = [n for when, n in seen if when <= t]
    return done[-1] if done else 0


def decode_step_ms(engine, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """The decode step time with the whole batch running: between the moment the last request
    got its first token (every prefill done) and the moment the first request finished, every
    request gains one token a step; steps = the median request's gain in that window. (Timing
    a run of 1 token against one of 1 + N is wrong for big batches: the scheduler runs decode
    steps for the first requests between the others' prefill chunks.)"""
    start = time.perf_counter()
    streams = _stream_batch(engine, prompts, new_tokens)
    if any(s[-1][1] != new_tokens for s in streams):
        raise RuntimeError(f"asked for {new_tokens} tokens a request, got "
                           f"{sorted({s[-1][1] for s in streams})}")
    all_started = max(next(when for when, n in s if n >= 1) for s in streams)
    first_done = min(s[-1][0] for s in streams)
    gains = sorted(_tokens_at(s, first_done) - _tokens_at(s, all_started) for s in streams)
    steps = gains[len(gains) // 2]
    if steps < 8:
        raise RuntimeError(f"only {steps} decode steps with the whole batch running: raise "
                           f"--output-len")
    return {"decode_ms_per_step": (first_done - all_started) / steps * 1000,
            "full_batch_steps": steps, "all_prefilled_s": all_started - start}


def _kernel_totals_us(trace_path: str) -> dict[str, float]:
    """Microseconds of GPU time per kernel name in a Chrome trace the profiler wrote."""
    import gzip
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    totals: dict[str, float] = collections.defaultdict(float)
    for ev in events:
        if ev.get("cat") == "kernel":
            totals[ev["name"][:100]] += ev.get("dur", 0.0)
    return totals


def kernel_profile(engine, rng: random.Random, length: int, vocab: int, steps: int,
                   top: int) -> dict[str, Any] | None:
    """Rank 0's GPU time per decode step from the engine's profiler: a request of 1 + `steps`
    tokens minus one of 1 token (its prefill), over `steps`; in all (busy time, overlapping
    kernels counted once) and, for the `top` kernels, by name."""
    busy, totals = [], []
    for new_tokens in (1, 1 + steps):
        engine.flush_cache()
        with tempfile.TemporaryDirectory() as trace_dir:
            engine.start_profile(output_dir=trace_dir)
            engine.generate(input_ids=_prompts(rng, 1, length, vocab),
                            sampling_params={"max_new_tokens": new_tokens, "ignore_eos": True})
            result = engine.stop_profile()
            if not result.gpu_busy_s or not result.trace_path:
                return None
            busy.append(result.gpu_busy_s)
            totals.append(_kernel_totals_us(result.trace_path) if top else {})
    per_step = {name: (us - totals[0].get(name, 0.0)) / steps
                for name, us in totals[1].items()}
    biggest = sorted(per_step.items(), key=lambda kv: -kv[1])[:top]
    return {"kernel_ms_per_step": (busy[1] - busy[0]) / steps * 1000,
            "top_kernels_us_per_step": dict(biggest)}


def engine_overrides(ns: argparse.Namespace) -> dict[str, Any]:
    """The fields --engine-args names (only those: the benchmark's own settings stand)."""
    from radixlm.config import ServerArgs
    tokens = shlex.split(ns.engine_args)
    parser = argparse.ArgumentParser(prog="--engine-args")
    ServerArgs.add_cli_args(parser)
    parsed = vars(parser.parse_args(tokens))
    named = {t.lstrip("-").split("=")[0].replace("-", "_") for t in tokens if t.startswith("--")}
    return {k: v for k, v in parsed.items() if k in named}


# (read by the ranks, which inherit the environment)
_VARIANT_ENV = ("RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM", "RADIXLM_DISABLE_GEMV")


def run_one(ns: argparse.Namespace, tp: int, custom_all_reduce: bool, bandwidth: float | None,
            config: dict[str, Any], fused_norm: bool = True, gemv: bool = True
            ) -> dict[str, Any]:
    for name in _VARIANT_ENV:
        os.environ.pop(name, None)
    if not fused_norm:
        os.environ["RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM"] = "1"
    if not gemv:
        os.environ["RADIXLM_DISABLE_GEMV"] = "1"
    try:
        result = _run_engine(ns, tp, custom_all_reduce, bandwidth, config, fused_norm, gemv)
    finally:
        for name in _VARIANT_ENV:
            os.environ.pop(name, None)
    result["gemv"] = gemv
    return result


def _run_engine(ns: argparse.Namespace, tp: int, custom_all_reduce: bool,
                bandwidth: float | None, config: dict[str, Any], fused_norm: bool,
                gemv: bool) -> dict[str, Any]:
    from radixlm.entrypoints.engine import Engine

    kwargs = dict(model_path=ns.model_path, load_format=ns.load_format, dtype=ns.dtype,
                  tokenizer_path=ns.tokenizer_path, tp_size=tp, log_level="warning",
                  disable_custom_all_reduce=not custom_all_reduce)
    kwargs.update(engine_overrides(ns))
    start = time.perf_counter()
    engine = Engine(**kwargs)
    freeze_startup_heap()   # (this process's: no full collection pass inside a timing)
    startup_s = time.perf_counter() - start
    rng = random.Random(tp)
    rows = []
    try:
        vocab = min(engine.ready.vocab_size, len(engine.tokenizer))
        engine.generate(input_ids=_prompts(rng, 2, 16, vocab),
                        sampling_params={"max_new_tokens": 8, "ignore_eos": True})
        for batch in ns.batch_sizes:
            row: dict[str, Any] = {"batch": batch, **decode_step_ms(
                engine, _prompts(rng, batch, ns.input_len, vocab), ns.output_len)}
            step_s = row["decode_ms_per_step"] / 1000
            row.update(tok_s_per_request=1 / step_s, tok_s_total=batch / step_s)
            if bandwidth:
                context = ns.input_len + ns.output_len // 2
                roof_s = decode_bytes_per_rank(config, tp, batch, context,
                                               _dtype_bytes(ns.dtype)) / bandwidth
                row.update(roofline_ms=roof_s * 1000, fraction_of_roofline=roof_s / step_s)
            if ns.profile and batch == 1:
                row.update(kernel_profile(engine, rng, ns.input_len, vocab,
                                          min(64, ns.output_len), ns.kernel_table) or {})
            rows.append(row)
            label = ("" if tp == 1 else " (NCCL only)" if not custom_all_reduce
                     else " (fused norm off)" if not fused_norm else "")
            label += "" if gemv else " (gemv off)"
            print(f"TP{tp}{label} "
                  f"bs {batch}: {row['decode_ms_per_step']:.2f} ms/step, "
                  f"{row['tok_s_total']:.0f} tok/s"
                  + (f", {row['fraction_of_roofline']:.0%} of roofline" if bandwidth else ""),
                  flush=True)
    finally:
        engine.shutdown()
    return {"tp_size": tp, "custom_all_reduce": custom_all_reduce and tp > 1,
            "fused_all_reduce_norm": fused_norm and custom_all_reduce and tp > 1,
            "startup_s": startup_s, "batches": rows}


def run(ns: argparse.Namespace) -> dict[str, Any]:
    with open(os.path.join(ns.model_path, "config.json")) as f:
        config = json.load(f)
    bandwidth = copy_bandwidth_gpu0() if ns.roofline else None
    runs = []
    skipped = []
    for tp in ns.tp_sizes:
        if 0 < torch_gpu_count() < tp:   # (on the CPU every rank shares it)
            print(f"TP{tp}: skipped, {torch_gpu_count()} GPUs visible", flush=True)
            skipped.append(tp)
            continue
        # (custom all-reduce, fused norm, gemv); the GEMV-off run goes first, so that
        # speedup_vs_first is on vs off at TP1 and the first engine's start is not on one side.
        variants = [(True, True, False), (True, True, True)] if ns.compare_gemv else \
            [(True, True, True)]
        if tp > 1 and ns.compare_fused_norm:
            variants.append((True, False, True))
        if tp > 1 and ns.compare_custom_all_reduce:
            variants.append((False, False, True))
        for custom, fused, gemv in variants:
            runs.append(run_one(ns, tp, custom, bandwidth, config, fused, gemv))
    base = {r["batch"]: r["decode_ms_per_step"] for r in runs[0]["batches"]} if runs else {}
    for r in runs:
        for row in r["batches"]:
            if row["batch"] in base:
                row["speedup_vs_first"] = base[row["batch"]] / row["decode_ms_per_step"]
    return {"benchmark": "tp", "environment": environment("cuda"),
            "args": {k: v for k, v in vars(ns).items() if k != "output"},
            "copy_bandwidth_gb_s": bandwidth / 1e9 if bandwidth else None, "runs": runs,
            "skipped_tp_sizes": skipped}


def _table(res: dict[str, Any]) -> str:
    lines = ["tp  custom_ar  fused_norm  gemv   batch  ms/step  tok/s  roofline  speedup  "
             "kernel_ms  startup_s"]
    for r in res["runs"]:
        for b in r["batches"]:
            frac = b.get("fraction_of_roofline")
            kern = b.get("kernel_ms_per_step")
            fused = str(r.get("fused_all_reduce_norm", False))
            lines.append(f"{r['tp_size']:>2}  {str(r['custom_all_reduce']):>9}  {fused:>10}  "
                         f"{str(r.get('gemv', True)):>5}  {b['batch']:>5}  "
                         f"{b['decode_ms_per_step']:>7.2f}  {b['tok_s_total']:>5.0f}  "
                         f"{(f'{frac:.0%}' if frac else '-'):>8}  "
                         f"{b.get('speedup_vs_first', 0):>6.2f}x  "
                         f"{(f'{kern:.2f}' if kern else '-'):>9}  {r['startup_s']:>9.1f}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench tp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="a directory with config.json")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--compare-custom-all-reduce", action="store_true",
                   help="run each TP > 1 also with --disable-custom-all-reduce")
    p.add_argument("--compare-fused-norm", action="store_true",
                   help="run each TP > 1 also with the fused all-reduce + RMSNorm off")
    p.add_argument("--compare-gemv", action="store_true",
                   help="run each TP size also with the batch-1 Triton GEMV off "
                        "(RADIXLM_DISABLE_GEMV=1: cuBLAS for every linear layer)")
    p.add_argument("--no-roofline", dest="roofline", action="store_false")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip rank 0's GPU kernel time a step (batch 1, engine profiler)")
    p.add_argument("--kernel-table", type=int, default=20,
                   help="with the profile: this many kernels by GPU time a step (0: none)")
    p.add_argument("--engine-args", default="",
                   help="more `radixlm serve` flags for every engine, e.g. "
                        "'--mem-fraction-static 0.9'")
    p.add_argument("--output", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    res = run(ns)
    path = write_json(ns.output or default_output_path("tp"), res)
    print(_table(res))
    one = [(r["tp_size"], b["tok_s_per_request"]) for r in res["runs"] for b in r["batches"]
           if b["batch"] == 1 and (r["tp_size"] == 1 or r.get("fused_all_reduce_norm"))]
    print_summary("batch-1 decode: " + ", ".join(f"TP{t} {s:.0f} tok/s" for t, s in one)
                  + f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
