"""`radixlm bench one-batch`: a static batch through the model runner, no scheduler (in the
manner of SGLang's bench_one_batch), against the plain-PyTorch floor in the same run.

Reports prefill latency and throughput, median decode step latency and throughput, engine /
floor ratios, and the decode memory-bandwidth roofline: bytes one decode step must read
(weights + KV) / copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from radixlm.bench.common import (default_output_path, environment, median, print_summary,
                                  require_positive, sync_device, write_json)
from radixlm.bench.floor import check_floor_supports, measure_floor
from radixlm.config import ServerArgs
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.core.forward_batch import ForwardMode
from radixlm.model_executor.model_runner import ModelRunner, create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.scheduler.request import Req
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.schedule_batch import ScheduleBatch


def _groups(n: int, per: int) -> list[range]:
    return [range(i, min(i + per, n)) for i in range(0, n, per)]


def copy_bandwidth(device: torch.device, gib: float = 2.0, repeats: int = 5) -> float:
    """Device memory bandwidth in bytes/s from timed copies (read + write counted)."""
    x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(repeats):
        sync_device(device)
        t = time.perf_counter()
        y.copy_(x)
        sync_device(device)
        times.append(time.perf_counter() - t)
    return 2 * x.numel() / median(times)


class EngineRun:
    """Prefill and decode of a static batch through ModelRunner + ScheduleBatch."""

    def __init__(self, runner: ModelRunner, kv: KVCacheManager, prompts: torch.Tensor,
                 output_len: int, prefill_group: int):
        self.runner = runner
        self.kv = kv
        self.reqs = [Req(f"r{i}", p.tolist(), SamplingParams(max_new_tokens=output_len), seed=0)
                     for i, p in enumerate(prompts)]
        self.prefill_group = prefill_group

    def prefill(self) -> None:
        for g in _groups(len(self.reqs), self.prefill_group):
            batch = [self.reqs[i] for i in g]
            for r in batch:
                r.extend_input_len = r.prompt_len
            fb = ScheduleBatch(batch, ForwardMode.EXTEND).prepare_extend(self.kv, self.runner.device)
            out = self.runner.forward(fb)
            ids = out.next_token_logits.argmax(-1)
            self.runner.last_token_ids[fb.req_pool_indices] = ids
            for r, t in zip(batch, ids.tolist()):
                r.output_ids.append(t)

    def decode_step(self) -> None:
        fb = ScheduleBatch(self.reqs, ForwardMode.DECODE).prepare_decode(self.kv, self.runner.last_token_ids)
        out = self.runner.forward(fb)
        ids = out.next_token_logits.argmax(-1)
        self.runner.last_token_ids[fb.req_pool_indices] = ids
        for r, t in zip(self.reqs, ids.tolist()):
            r.output_ids.append(t)

    def release(self) -> None:
        for r in self.reqs:
            self.kv.prefix_cache.cache_finished_req(r)


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter once, except the input
    embedding table, of which a step reads only the looked-up rows (a table tied to the LM
    head is read whole, as the LM head). Before 2026-11-29 the rooflines here counted the
    table too: 1.05 GB more for Llama-3.1-8B, which made their fractions ~7% higher."""
    from radixlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    heads = {id(m.weight) for m in model.modules() if isinstance(m, ParallelLMHead)}
    tables = {id(m.weight) for m in model.modules()
              if type(m) is VocabParallelEmbedding and id(m.weight) not in heads}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in tables)


def decode_step_bytes(runner: ModelRunner, batch_size: int, context: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode step of `batch_size` requests at `context` tokens
    must read: every weight once (`decode_weight_bytes`), except that of a mixture-of-experts
    layer's routed experts only the expected distinct ones the batch routes to count
    (E * (1 - (1 - k/E)^bs): k at batch 1), and the batch's KV cache as the pool stores it
    (K and V, or the MLA latent; fp8 pools 1 byte a value)."""
    from radixlm.layers.moe.layer import FusedMoE
    mc = runner.model_config
    weights = decode_weight_bytes(runner.model)
    e, k = mc.num_experts, mc.num_experts_per_tok
    if e:
        touched = e * (1 - (1 - k / e) ** batch_size)
        for m in runner.model.modules():
            if isinstance(m, FusedMoE):
                per_expert = sum(p[0].numel() * p.element_size()
                                 for p in (m.w13_weight, m.w2_weight))
                weights -= int((e - touched) * per_expert)
    kv = batch_size * context * runner.kv_spec.bytes_per_token(runner.kv_dtype)
    return weights, kv


def profile_step(step, device: torch.device) -> dict | None:
    """One decode step under the torch profiler: device time per kernel and how much of the
    step's wall time the GPU was busy (the gap is host overhead)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    sync_device(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        step()
        sync_device(device)
        wall = time.perf_counter() - t
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0
               and e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: -e.device_time_total)
    busy_us = sum(e.device_time_total for e in kernels)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    return {"wall_s": wall, "gpu_busy_s": busy_us / 1e6,
            "kernels": [{"name": e.key[:80], "count": e.count, "device_us": e.device_time_total}
                        for e in kernels[:15]]}


def run(args: argparse.Namespace) -> dict:
    bs, n_in, n_out = args.batch_size, args.input_len, args.output_len
    server_args = ServerArgs(model_path=args.model_path, load_format=args.load_format,
                             dtype=args.dtype, device=args.device,
                             # +1 token per request: the optional profiled extra step
                             max_total_tokens=bs * (n_in + n_out + 1) + 64,
                             max_running_requests=bs, context_length=n_in + n_out + 8,
                             attention_backend=args.attention_backend,
                             disable_cuda_graph=args.disable_cuda_graph,
                             cuda_graph_max_bs=bs,
                             enable_torch_compile=args.enable_torch_compile,
                             torch_compile_max_bs=bs)
    runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(server_args), radix=False)
    check_floor_supports(runner.model_config)   # before the timed engine run, not after
    dev = runner.device
    vocab = runner.model_config.vocab_size
    prompts = torch.randint(0, vocab, (bs, n_in), generator=torch.Generator().manual_seed(0))
    per_group = max(1, args.max_prefill_tokens // n_in)

    def timed(fn) -> float:
        sync_device(dev)
        t = time.perf_counter()
        fn()
        sync_device(dev)
        return time.perf_counter() - t

    # Engine: one warm-up pass of the whole workload, then the timed one.
    for attempt in range(2):
        run_ = EngineRun(runner, kv, prompts, n_out, per_group)
        prefill_s = timed(run_.prefill)
        steps = [timed(run_.decode_step) for _ in range(n_out - 1)]
        if attempt == 1 and args.profile:
            profile = profile_step(run_.decode_step, dev)
        run_.release()
    engine_decode = median(steps) if steps else 0.0
    if not args.profile:
        profile = None

    # Floor: the same batch, the same prefill grouping, static KV tensors.
    fl = measure_floor(runner, prompts, n_out, per_group)
    floor_prefill_s, floor_steps, floor_first = fl.prefill_s, fl.decode_steps_s, fl.first_tokens
    floor_decode = median(floor_steps) if floor_steps else 0.0
    mc = runner.model_config

    # Roofline of one decode step at the final context length.
    weight_bytes, kv_bytes = decode_step_bytes(runner, bs, n_in + n_out)
    bw = copy_bandwidth(dev) if dev.type == "cuda" else None
    roofline_s = (weight_bytes + kv_bytes) / bw if bw else None
    engine_first = [r.output_ids[0] for r in run_.reqs]
    agreement = sum(a == b for a, b in zip(engine_first, floor_first)) / bs
    total_engine = prefill_s + sum(steps)
    total_floor = floor_prefill_s + sum(floor_steps)
    return {
        "batch_size": bs, "input_len": n_in, "output_len": n_out,
        "prefill_group_requests": per_group,
        # Same weights, same greedy rule: the first sampled token should mostly agree (bf16
        # rounding differs between the two attention implementations, so not always).
        "first_token_agreement": agreement,
        "engine": {"prefill_s": prefill_s, "prefill_tok_s": bs * n_in / prefill_s,
                   "decode_step_s": engine_decode,
                   "decode_tok_s": bs / engine_decode if engine_decode else None,
                   "total_s": total_engine},
        "floor": {"prefill_s": floor_prefill_s, "prefill_tok_s": bs * n_in / floor_prefill_s,
                  "decode_step_s": floor_decode,
                  "decode_tok_s": bs / floor_decode if floor_decode else None,
                  "total_s": total_floor},
        "ratio_engine_over_floor": {
            "prefill": prefill_s / floor_prefill_s,
            "decode_step": engine_decode / floor_decode if floor_decode else None,
            "total": total_engine / total_floor},
        "roofline": {"copy_bandwidth_gb_s": bw / 1e9 if bw else None,
                     "weight_bytes": weight_bytes, "kv_bytes_final_step": kv_bytes,
                     "decode_step_s": roofline_s,
                     "engine_fraction_of_roofline": (roofline_s / engine_decode
                                                     if roofline_s and engine_decode else None)},
        "engine_args": {k: v for k, v in vars(server_args).items()},
        "decode_step_profile": profile,
        "model": {"architecture": mc.architecture, "layers": mc.num_layers,
                  "hidden": mc.hidden_size, "dtype": str(runner.dtype)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench one-batch", description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--enable-torch-compile", action="store_true",
                   help="the decode forward compiled by torch.compile (captured in the graphs)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--max-prefill-tokens", type=int, default=16384,
                   help="prefill whole requests in groups of at most this many tokens")
    p.add_argument("--profile", action="store_true",
                   help="also profile one decode step (kernel times, GPU busy fraction)")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    require_positive(p, args, "batch_size", "input_len", "output_len", "max_prefill_tokens")
    result = run(args)
    result.update(environment(args.device), command="radixlm bench one-batch " + " ".join(argv))
    path = write_json(args.output or default_output_path("one_batch"), result)
    e, r = result["engine"], result["ratio_engine_over_floor"]
    roof = result["roofline"]["engine_fraction_of_roofline"]
    print_summary(
        f"one-batch bs {args.batch_size} in {args.input_len} out {args.output_len}: prefill "
        f"{e['prefill_s']:.3f}s ({r['prefill']:.2f}x floor), decode step "
        f"{e['decode_step_s'] * 1e3:.2f}ms ({(r['decode_step'] or 0):.2f}x floor"
        + (f", {roof:.0%} of roofline" if roof else "") + f"), total {r['total']:.2f}x floor "
        f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
