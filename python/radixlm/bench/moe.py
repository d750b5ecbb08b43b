"""`radixlm bench moe`: mixture-of-experts and MLA, kernels and whole models (GPU).

Three parts, each a same-run comparison:

  kernel  the fused MoE (layers/moe: grouped Triton GEMMs) against the per-expert PyTorch
          loop (experts.experts_reference: for each expert with tokens, gather, gate_up,
          SiLU-and-mul, down, weighted index_add) at several batch sizes, on the expert shapes
          of Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V2-Lite; also the bandwidth the fused
          path reaches on the weights of the experts it touches, against copy bandwidth.
  mla     the MLA decode kernel alone on a latent cache (bs x context latents of 576 values):
          bytes read / time against copy bandwidth (a small tile and split sweep).
  mla-extend  the MLA extend kernel on fresh 4k prompts: TFLOP/s for a small tile sweep.
  model   a model config with random weights through the model runner (CUDA graphs): prefill
          of bs x input_len, decode step time at each batch size, and the batch-1 step as a
          fraction of its roofline: the bytes it must read (every non-expert weight, the
          experts the batch routes to, the KV cache) / copy bandwidth.

    radixlm bench moe --parts kernel,mla
    radixlm bench moe --parts model --model-path benchmarks/configs/deepseek-v2-lite
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from radixlm.bench.common import (default_output_path, environment, median, print_summary,
                                  require_positive, sync_device, write_json)
from radixlm.bench.moe_common import EXPERT_SHAPES, fp8_copy, graphed, time_fn

# ---------------------------------------------------------------------- kernel

# Batch sizes up to which both kernel paths (per-pair GEMVs, grouped GEMMs) are timed.
BOTH_PATHS_MAX_BS = 16


def kernel_part(batch_sizes: list[int], shapes: list[str], device: torch.device,
                bandwidth: float, fp8: bool = False) -> list[dict]:
    from radixlm.layers.moe.experts import experts_reference, fused_experts
    from radixlm.layers.moe.topk import RoutingConfig, select_experts

    rows = []
    dt = torch.bfloat16
    for name in shapes:
        experts, top_k, hidden, inter = EXPERT_SHAPES[name]
        g = torch.Generator(device=device).manual_seed(0)
        w13 = (torch.randn(experts, 2 * inter, hidden, device=device, generator=g) * 0.02).to(dt)
        w2 = (torch.randn(experts, hidden, inter, device=device, generator=g) * 0.02).to(dt)
        per_expert_bytes = (w13[0].numel() + w2[0].numel()) * dt.itemsize
        for bs in batch_sizes:
            x = torch.randn(bs, hidden, device=device, generator=g).to(dt)
            logits = torch.randn(bs, experts, device=device, generator=g)
            w, ids = select_experts(logits, RoutingConfig(top_k, renormalize=True))
            touched = int(ids.unique().numel())
            fused = lambda: fused_experts(x, w13, w2, w, ids)  # noqa: E731
            loop = lambda: experts_reference(x, w13, w2, w, ids)  # noqa: E731
            err = ((fused().float() - loop().float()).abs().max()
                   / loop().float().abs().max()).item()
            fused_s = time_fn(fused, device)
            graph_s = time_fn(graphed(fused, device), device)
            loop_s = time_fn(loop, device)
            bytes_read = touched * per_expert_bytes
            rows.append({
                "shape": name, "experts": experts, "top_k": top_k, "hidden": hidden,
                "intermediate": inter, "batch_size": bs, "experts_touched": touched,
                "loop_ms": loop_s * 1e3, "fused_ms": fused_s * 1e3,
                "fused_graph_ms": graph_s * 1e3,
                "speedup_vs_loop": loop_s / fused_s,
                "speedup_graph_vs_loop": loop_s / graph_s,
                "fused_graph_weight_gb_s": bytes_read / graph_s / 1e9,
                "fraction_of_copy_bandwidth": bytes_read / graph_s / bandwidth,
                "max_rel_error_vs_loop": err})
            r = rows[-1]
            fp8_weights = fp8_copy(w13, w2) if fp8 else None
            if bs <= BOTH_PATHS_MAX_BS:     # each kernel path forced, graphed
                variants = [("bf16", w13, w2, None)]
                if fp8_weights:
                    variants.append(("fp8", *fp8_weights))
                for label, a, b, sc in variants:
                    for path, forced in (("grouped", False), ("pair_gemv", True)):
                        fn = (lambda a=a, b=b, sc=sc, forced=forced: fused_experts(  # noqa: E731
                            x, a, b, w, ids, scales=sc, pair_gemv=forced))
                        r[f"{label}_{path}_graph_ms"] = time_fn(graphed(fn, device),
                                                                device) * 1e3
                    print(f"moe {name:17s} bs {bs:4d}: {label} grouped "
                          f"{r[f'{label}_grouped_graph_ms']:.3f} ms, pair gemv "
                          f"{r[f'{label}_pair_gemv_graph_ms']:.3f} ms", flush=True)
            if fp8_weights:
                q13, q2, sc = fp8_weights
                if bs > BOTH_PATHS_MAX_BS:  # FP8 inputs (W8A8) on and off, forced
                    for label, forced in (("weight_only", False), ("w8a8", True)):
                        fn = (lambda forced=forced: fused_experts(  # noqa: E731
                            x, q13, q2, w, ids, scales=sc, fp8_activations=forced))
                        r[f"fp8_{label}_graph_ms"] = time_fn(graphed(fn, device), device) * 1e3
                    print(f"moe {name:17s} bs {bs:4d}: fp8 weight-only "
                          f"{r['fp8_weight_only_graph_ms']:.3f} ms, w8a8 "
                          f"{r['fp8_w8a8_graph_ms']:.3f} ms", flush=True)
                fp8_fn = lambda: fused_experts(x, q13, q2, w, ids, scales=sc)  # noqa: E731
                fp8_s = time_fn(graphed(fp8_fn, device), device)
                r.update(fp8_graph_ms=fp8_s * 1e3, fp8_speedup_vs_bf16_graph=graph_s / fp8_s,
                         fp8_weight_gb_s=bytes_read / 2 / fp8_s / 1e9,
                         fp8_fraction_of_copy_bandwidth=bytes_read / 2 / fp8_s / bandwidth,
                         fp8_max_rel_error_vs_bf16_loop=(
                             (fp8_fn().float() - loop().float()).abs().max()
                             / loop().float().abs().max()).item())
                print(f"moe {name:17s} bs {bs:4d}: fp8 graphed {r['fp8_graph_ms']:.3f} ms "
                      f"(x{r['fp8_speedup_vs_bf16_graph']:.2f} vs bf16), "
                      f"{r['fp8_weight_gb_s']:.0f} GB/s "
                      f"({r['fp8_fraction_of_copy_bandwidth']:.0%} of copy)", flush=True)
            print(f"moe {name:17s} bs {bs:4d}: loop {r['loop_ms']:.3f} ms, fused "
                  f"{r['fused_ms']:.3f} ms ({r['speedup_vs_loop']:.1f}x), graphed "
                  f"{r['fused_graph_ms']:.3f} ms ({r['speedup_graph_vs_loop']:.1f}x), "
                  f"{r['fused_graph_weight_gb_s']:.0f} GB/s on {touched} experts "
                  f"({r['fraction_of_copy_bandwidth']:.0%} of copy)", flush=True)
        del w13, w2
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------- MLA decode kernel

def mla_part(batch_size: int, context: int, heads_list: list[int], device: torch.device,
             bandwidth: float, tile_sweep: bool = False) -> list[dict]:
    from radixlm.layers.attention.kernels import (alloc_decode_buffers, build_kv_indices,
                                                  choose_max_kv_splits, per_request_kv_splits)
    from radixlm.layers.attention.kernels.common import num_sms
    from radixlm.layers.attention.kernels.mla_attention import (
        MLA_MIN_TOKENS_PER_SPLIT, mla_block_h, mla_decode_attention,
        mla_decode_programs_per_request)

    lora, rope, dt = 512, 64, torch.bfloat16
    tokens = batch_size * context
    kv = torch.randn(tokens + 1, 1, lora + rope, device=device).to(dt)
    table = (torch.randperm(tokens, device=device) + 1).to(torch.int32).view(batch_size, context)
    seq_lens = torch.full((batch_size,), context, device=device)
    kv_indptr, kv_indices = build_kv_indices(table, torch.arange(batch_size, device=device),
                                             seq_lens, tokens)
    rows = []
    for heads in heads_list:
        q = torch.randn(batch_size, heads, lora + rope, device=device).to(dt)
        out = torch.empty(batch_size, heads, lora, device=device, dtype=dt)
        # As the backend picks them (the programs of one request: its head blocks).
        max_splits = choose_max_kv_splits(batch_size, mla_decode_programs_per_request(heads),
                                          context, num_sms(device), MLA_MIN_TOKENS_PER_SPLIT)
        splits = per_request_kv_splits(seq_lens, max_splits, MLA_MIN_TOKENS_PER_SPLIT)
        buffers = alloc_decode_buffers(batch_size, heads, lora, max_splits, device)
        read = tokens * (lora + rope) * dt.itemsize
        # The default launch, then a small sweep (what the defaults should become).
        sweep = [(n, w, st) for n in (32, 64) for w in (4, 8) for st in (1, 2, 3)]
        for block_n, warps, stages in [(None, None, 2)] + (sweep if tile_sweep else []):
            run = lambda: mla_decode_attention(  # noqa: E731
                q, kv, out, lora, kv_indptr, kv_indices, splits, max_splits, 0.1, buffers,
                block_n=block_n, num_warps=warps, num_stages=stages)
            try:
                s = time_fn(graphed(run, device), device)
            except Exception as e:     # a tile that does not fit: skip it
                print(f"mla decode block_n {block_n} warps {warps} stages {stages}: {e!r:.80}")
                continue
            # The default's warps as mla_decode_attention picks them.
            warps = warps or (8 if mla_block_h(heads) >= 32 else 4)
            rows.append({"batch_size": batch_size, "context": context, "heads": heads,
                         "block_n": block_n, "num_warps": warps, "num_stages": stages,
                         "default": block_n is None, "kernel_ms": s * 1e3,
                         "latent_gb_s": read / s / 1e9,
                         "fraction_of_copy_bandwidth": read / s / bandwidth})
            print(f"mla decode bs {batch_size} ctx {context} heads {heads} block_n {block_n} "
                  f"warps {warps} stages {stages}: {s * 1e3:.3f} ms, {read / s / 1e9:.0f} GB/s "
                  f"({read / s / bandwidth:.0%} of copy)", flush=True)
        if heads != heads_list[0]:
            continue
        # Splits per request: more, shorter splits shrink the last wave's idle SMs.
        for forced in (8, 16, 32):
            forced_splits = torch.full_like(splits, forced)
            forced_buffers = alloc_decode_buffers(batch_size, heads, lora, forced, device)
            run = lambda: mla_decode_attention(  # noqa: E731
                q, kv, out, lora, kv_indptr, kv_indices, forced_splits, forced, 0.1,
                forced_buffers)
            s = time_fn(graphed(run, device), device)
            rows.append({"batch_size": batch_size, "context": context, "heads": heads,
                         "forced_splits": forced, "kernel_ms": s * 1e3,
                         "latent_gb_s": read / s / 1e9,
                         "fraction_of_copy_bandwidth": read / s / bandwidth})
            print(f"mla decode bs {batch_size} ctx {context} heads {heads} splits {forced} "
                  f"(default {max_splits}): {s * 1e3:.3f} ms, {read / s / 1e9:.0f} GB/s "
                  f"({read / s / bandwidth:.0%} of copy)", flush=True)
    return rows


def mla_extend_part(device: torch.device, seqs: int = 4, length: int = 4096,
                    heads: int = 16) -> list[dict]:
    """The MLA extend kernel on `seqs` fresh prompts of `length` tokens: TFLOP/s (causal,
    score and output products over the 576 / 512-wide latent) for a small tile sweep."""
    from radixlm.layers.attention.kernels import build_kv_indices
    from radixlm.layers.attention.kernels.mla_attention import mla_extend_attention

    lora, rope, dt = 512, 64, torch.bfloat16
    tokens = seqs * length
    kv = torch.randn(tokens + 1, 1, lora + rope, device=device).to(dt)
    q = torch.randn(tokens, heads, lora + rope, device=device).to(dt)
    out = torch.empty(tokens, heads, lora, device=device, dtype=dt)
    table = (torch.arange(tokens, device=device) + 1).to(torch.int32).view(seqs, length)
    lens = torch.full((seqs,), length, device=device)
    kv_indptr, kv_indices = build_kv_indices(table, torch.arange(seqs, device=device), lens,
                                             tokens)
    qo_indptr = kv_indptr.clone()
    flops = seqs * heads * length * length / 2 * 2 * (lora + rope + lora)
    rows = []
    for bm, bn, warps, stages in [(None, None, None, 1), (64, 32, 8, 1), (64, 32, 4, 2),
                                  (32, 64, 8, 2), (64, 64, 8, 1), (128, 32, 8, 1),
                                  (32, 32, 4, 2)]:
        run = lambda: mla_extend_attention(  # noqa: E731
            q, kv, out, lora, qo_indptr, kv_indptr, kv_indices, length, 0.1, block_m=bm,
            block_n=bn, num_warps=warps, num_stages=stages)
        try:
            s = time_fn(run, device, iters=5)
        except Exception as e:
            print(f"mla extend {bm}x{bn} warps {warps} stages {stages}: {e!r:.80}")
            continue
        rows.append({"seqs": seqs, "length": length, "heads": heads, "block_m": bm,
                     "block_n": bn, "num_warps": warps, "num_stages": stages,
                     "kernel_ms": s * 1e3, "tflop_s": flops / s / 1e12})
        print(f"mla extend {seqs}x{length} heads {heads} tiles {bm}x{bn} warps {warps} stages "
              f"{stages}: {s * 1e3:.2f} ms, {flops / s / 1e12:.0f} TFLOP/s", flush=True)
    return rows


# ---------------------------------------------------------------------- whole model

def active_bytes_per_step(runner, batch_size: int, context: int) -> int:
    """Bytes one decode step of `batch_size` requests at `context` tokens must read: every
    weight outside the routed experts, the expected distinct experts per MoE layer
    (E * (1 - (1 - k/E)^bs)), and the KV cache (`one_batch.decode_step_bytes`)."""
    from radixlm.bench.one_batch import decode_step_bytes
    return sum(decode_step_bytes(runner, batch_size, context))


def model_part(args, device: torch.device, bandwidth: float) -> dict:
    from radixlm.bench.one_batch import EngineRun
    from radixlm.config import ServerArgs
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig

    bs_max = max(args.batch_sizes)
    n_in, n_out = args.input_len, args.output_len
    server_args = ServerArgs(model_path=args.model_path, load_format="dummy", dtype="bfloat16",
                             max_total_tokens=bs_max * (n_in + n_out + 1) + 64,
                             max_running_requests=bs_max, context_length=n_in + n_out + 8,
                             cuda_graph_max_bs=bs_max, mem_fraction_static=0.9,
                             # bench quant times quantized models through this part too
                             quantization=getattr(args, "quantization", None))
    t0 = time.perf_counter()
    runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(server_args), radix=False)
    startup_s = time.perf_counter() - t0
    vocab = runner.model_config.vocab_size
    result = {"model": runner.model_config.architecture, "startup_s": startup_s,
              "weight_gb": runner.weight_bytes / 1e9, "input_len": n_in, "output_len": n_out,
              "batches": []}
    for bs in args.batch_sizes:
        prompts = torch.randint(0, vocab, (bs, n_in), generator=torch.Generator().manual_seed(0))
        for attempt in range(2):        # the first pass compiles and warms up
            run = EngineRun(runner, kv, prompts, n_out, max(1, 16384 // n_in))
            sync_device(device)
            t = time.perf_counter()
            run.prefill()
            sync_device(device)
            prefill_s = time.perf_counter() - t
            steps = []
            for _ in range(n_out - 1):
                sync_device(device)
                t = time.perf_counter()
                run.decode_step()
                sync_device(device)
                steps.append(time.perf_counter() - t)
            run.release()
        step = median(steps)
        profile = None
        if args.profile and bs == args.batch_sizes[0]:
            from radixlm.bench.one_batch import profile_step
            run = EngineRun(runner, kv, prompts, 2, max(1, 16384 // n_in))
            run.prefill()
            profile = profile_step(run.decode_step, device)
            run.release()
        roof = active_bytes_per_step(runner, bs, n_in + n_out) / bandwidth
        result["batches"].append({
            "batch_size": bs, "prefill_s": prefill_s, "prefill_tok_s": bs * n_in / prefill_s,
            "decode_step_ms": step * 1e3, "decode_tok_s": bs / step,
            "roofline_step_ms": roof * 1e3, "fraction_of_roofline": roof / step,
            "decode_step_profile": profile})
        b = result["batches"][-1]
        print(f"{result['model']} bs {bs}: prefill {bs}x{n_in} {prefill_s:.3f} s "
              f"({b['prefill_tok_s']:.0f} tok/s), decode step {b['decode_step_ms']:.2f} ms "
              f"({b['decode_tok_s']:.0f} tok/s), roofline {b['roofline_step_ms']:.2f} ms "
              f"-> {b['fraction_of_roofline']:.0%}", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench moe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="kernel,mla",
                   help="kernel, gemv-sweep, w8a8-sweep, mla, mla-extend, model (comma list)")
    p.add_argument("--batch-sizes", default="1,64,256")
    p.add_argument("--shapes", default=",".join(EXPERT_SHAPES))
    p.add_argument("--mla-batch-size", type=int, default=64)
    p.add_argument("--mla-context", type=int, default=4096)
    p.add_argument("--mla-heads", default="16,128")
    p.add_argument("--mla-tile-sweep", action="store_true",
                   help="mla part: also time a grid of decode tiles")
    p.add_argument("--fp8", action="store_true",
                   help="kernel part: also the fused path on FP8 experts (128x128 block scales)")
    p.add_argument("--model-path", default=None, help="a config dir (random weights)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--profile", action="store_true",
                   help="model part: profile one decode step at the first batch size")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    require_positive(p, args, "mla_batch_size", "mla_context", "input_len", "output_len")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = set(parts) - {"kernel", "gemv-sweep", "w8a8-sweep", "mla", "mla-extend",
                            "model"}
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}")
    if "model" in parts and not args.model_path:
        p.error("--parts model needs --model-path")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    unknown_shapes = set(args.shapes.split(",")) - set(EXPERT_SHAPES)
    if unknown_shapes:
        p.error(f"--shapes: unknown {sorted(unknown_shapes)}; choose from {sorted(EXPERT_SHAPES)}")
    from radixlm.bench.one_batch import copy_bandwidth
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    result: dict = {"copy_bandwidth_gb_s": bandwidth / 1e9}
    if "kernel" in parts:
        result["kernel"] = kernel_part(args.batch_sizes, args.shapes.split(","), device,
                                       bandwidth, fp8=args.fp8)
    if "gemv-sweep" in parts:
        from radixlm.bench.moe_sweeps import gemv_sweep_part
        result["gemv_sweep"] = gemv_sweep_part(args.shapes.split(","), device)
    if "w8a8-sweep" in parts:
        from radixlm.bench.moe_sweeps import w8a8_sweep_part
        result["w8a8_sweep"] = w8a8_sweep_part(args.shapes.split(","), args.batch_sizes,
                                               device)
    if "mla-extend" in parts:
        result["mla_extend"] = mla_extend_part(device)
    if "mla" in parts:
        result["mla"] = mla_part(args.mla_batch_size, args.mla_context,
                                 [int(h) for h in args.mla_heads.split(",")], device, bandwidth,
                                 tile_sweep=args.mla_tile_sweep)
    if "model" in parts:
        result["model"] = model_part(args, device, bandwidth)
    result.update(environment(None), command="radixlm bench moe " + " ".join(argv))
    path = write_json(args.output or default_output_path("moe"), result)
    print_summary(f"bench moe ({', '.join(parts)}) -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
