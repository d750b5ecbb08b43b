"""`python -m radixlm.bench.decode_kernel`: the split-KV decode kernel alone, over tile sizes,
warps, pipeline stages and split counts, as achieved bandwidth (K/V bytes read / kernel time)
against the device's copy bandwidth. Kernel time is taken inside a CUDA graph, over copies of
the KV that together outgrow the L2 (events around one eager call measured the host's launch
at small batches: 67-73 us for kernels that take 9-43 us in a decode step). Used to pick the
kernel's defaults (CUDA only).

`--kv-cache-dtype fp8_e4m3` sweeps the same batch twice in one run, over a bf16 KV pool and over
an fp8 one (the same values, quantized), and reports the decode attention time of each at the
tiles the backend uses and at their best (the target: fp8 KV no slower than bf16)."""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Callable, Sequence

import torch

from radixlm.bench.common import (default_output_path, environment, graph_seconds_per_call,
                                  print_summary, require_positive, write_json)

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")


def main(argv: Sequence[str] | None = None) -> int:
    from radixlm.bench.one_batch import copy_bandwidth
    from radixlm.core.kv_quant import kv_storage_dtype, quantize
    from radixlm.layers.attention.kernels import (alloc_decode_buffers, build_kv_indices,
                                                  choose_max_kv_splits, decode_attention,
                                                  per_request_kv_splits)
    from radixlm.layers.attention.kernels.common import num_sms
    from radixlm.layers.attention.kernels.decode_attention import decode_block_n
    p = argparse.ArgumentParser(prog="python -m radixlm.bench.decode_kernel")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="fp8_e4m3: also sweep an fp8 KV pool and compare it with bf16")
    p.add_argument("--splits", default="1,2,4",
                   help="comma-separated max_kv_splits values to sweep")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = p.parse_args(argv)
    require_positive(p, ns, "batch_size", "context", "num_heads", "num_kv_heads", "head_dim")
    dev, dt = torch.device("cuda"), torch.bfloat16
    bs, ctx, hq, hk, d = ns.batch_size, ns.context, ns.num_heads, ns.num_kv_heads, ns.head_dim
    # As many copies of the batch's KV as it takes to pass 256 MB (the L2 holds a few tens of
    # MB): each call of a timed run reads a copy the previous calls did not, as each layer of a
    # model reads its own cache.
    copies = max(1, min(32, -(-(256 << 20) // (2 * bs * ctx * hk * d * 2))))
    slots = copies * bs * ctx + 1
    k_buf = torch.randn(slots, hk, d, dtype=dt, device=dev)
    v_buf = torch.randn(slots, hk, d, dtype=dt, device=dev)
    # Each request's slots are a shuffled range: contiguous runs like a real pool after churn.
    seq_lens = torch.full((bs,), ctx, dtype=torch.int64, device=dev)
    kv_indptr, indices = None, []
    for c in range(copies):
        table = (c * bs * ctx + torch.randperm(bs, device=dev)[:, None] * ctx
                 + torch.arange(ctx, device=dev)[None, :] + 1).to(torch.int32)
        kv_indptr, kv_indices = build_kv_indices(table, torch.arange(bs, device=dev), seq_lens,
                                                 bs * ctx)
        indices.append(kv_indices)
    q = torch.randn(bs, hq, d, dtype=dt, device=dev)
    out = torch.empty_like(q)
    bw = copy_bandwidth(dev)
    split_counts = tuple(int(x) for x in ns.splits.split(","))

    def run(kb: torch.Tensor, vb: torch.Tensor, block_n: int | None, warps: int | None,
            stages: int | None, splits: int) -> Callable[[], object]:
        """One call per KV copy; timed in a CUDA graph (`graph_seconds_per_call`), so host
        launch time is not counted, as in a captured decode step."""
        nsplit = per_request_kv_splits(seq_lens, splits)
        buffers = alloc_decode_buffers(bs, hq, d, splits, dev)

        def calls() -> None:
            for kv_indices in indices:
                decode_attention(q, kb, vb, out, kv_indptr, kv_indices, nsplit, splits,
                                 d ** -0.5, buffers, block_n=block_n, num_warps=warps,
                                 num_stages=stages)
        return calls

    def sweep(kb: torch.Tensor, vb: torch.Tensor) -> tuple[list[dict], list[dict], int]:
        kv_bytes = 2 * bs * ctx * hk * d * kb.element_size()
        rows = []
        for block_n, warps, stages, splits in itertools.product((32, 64, 128), (2, 4, 8),
                                                               (1, 2, 3), split_counts):
            call = run(kb, vb, block_n, warps, stages, splits)
            try:
                call()
            except Exception as e:  # e.g. out of shared memory for this tile
                rows.append({"block_n": block_n, "warps": warps, "stages": stages,
                             "splits": splits, "error": str(e)[:100]})
                continue
            t = graph_seconds_per_call(call, len(indices))
            rows.append({"block_n": block_n, "warps": warps, "stages": stages, "splits": splits,
                         "seconds": t, "fraction_of_copy_bw": kv_bytes / t / bw})
        ok = sorted((r for r in rows if "seconds" in r), key=lambda r: r["seconds"])
        for r in ok[:10]:
            print(r)
        return rows, ok, kv_bytes

    if ns.kv_cache_dtype != "auto":
        print("bf16 KV:")
    rows, ok, kv_bytes = sweep(k_buf, v_buf)
    # What TritonAttnBackend launches for this batch: its tile and split choice, 4 warps and
    # 2 stages for a 16-bit pool (missing from the table if its split count was not swept).
    backend_splits = choose_max_kv_splits(bs, hk, ctx, num_sms(dev))
    default = next((r for r in rows if (r["block_n"], r["warps"], r["stages"], r["splits"])
                    == (decode_block_n(d, dt), 4, 2, backend_splits)), {})
    result = {"shape": vars(ns), "copy_bandwidth_gb_s": bw / 1e9, "kv_bytes": kv_bytes,
              "best": ok[0], "current_default": default, "all": rows}
    summary = (f"decode kernel bs {bs} ctx {ctx}: best {ok[0]['fraction_of_copy_bw']:.0%} of "
               f"copy bandwidth {ok[0]}, default {default.get('fraction_of_copy_bw', 0):.0%}")
    if ns.kv_cache_dtype != "auto":
        kv_dt = kv_storage_dtype(ns.kv_cache_dtype, dt)
        # The same values, quantized as the pool stores them (scale 1: randn fits fp8's range).
        k8, v8 = quantize(k_buf, 1.0, kv_dt), quantize(v_buf, 1.0, kv_dt)
        print(f"{ns.kv_cache_dtype} KV:")
        rows8, ok8, kv_bytes8 = sweep(k8, v8)
        # What TritonAttnBackend launches: its split choice, and decode_attention's tile,
        # warps and stages for the pool's dtype (None: its own choice).
        splits = choose_max_kv_splits(bs, hk, ctx, num_sms(dev))
        backend = dict(block_n=None, warps=None, stages=None, splits=splits)
        t16 = graph_seconds_per_call(run(k_buf, v_buf, **backend), copies)
        t8 = graph_seconds_per_call(run(k8, v8, **backend), copies)
        result[ns.kv_cache_dtype] = {
            "kv_bytes": kv_bytes8, "best": ok8[0], "all": rows8,
            "backend_default": {**backend, "bf16_seconds": t16, "fp8_seconds": t8,
                                "fp8_over_bf16": t8 / t16}}
        summary = (f"decode attention bs {bs} ctx {ctx} hq {hq} hk {hk} d {d}, backend tiles "
                   f"{backend}: bf16 KV {t16 * 1e6:.1f} us, {ns.kv_cache_dtype} KV "
                   f"{t8 * 1e6:.1f} us ({t8 / t16:.2f}x); best {ok[0]['seconds'] * 1e6:.1f} vs "
                   f"{ok8[0]['seconds'] * 1e6:.1f} us ({ok8[0]['seconds'] / ok[0]['seconds']:.2f}x,"
                   f" fp8 best {ok8[0]})")
    result.update(environment(None), command="python -m radixlm.bench.decode_kernel " +
                  " ".join(argv))
    path = write_json(ns.output or default_output_path("decode_kernel"), result)
    print_summary(f"{summary} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
