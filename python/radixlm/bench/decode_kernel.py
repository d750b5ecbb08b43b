"""`python -m radixlm.bench.decode_kernel`: the split-KV decode kernel alone, over tile sizes,
warps, pipeline stages and split counts, as achieved bandwidth (K/V bytes read / kernel time)
against the device's copy bandwidth. Used to pick the kernel's defaults (CUDA only)."""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Sequence

import torch

from radixlm.bench.common import default_output_path, environment, print_summary, write_json


def main(argv: Sequence[str] | None = None) -> int:
    from radixlm.bench.one_batch import copy_bandwidth
    from radixlm.layers.attention.kernels import (alloc_decode_buffers, build_kv_indices,
                                                  decode_attention, per_request_kv_splits)
    p = argparse.ArgumentParser(prog="python -m radixlm.bench.decode_kernel")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = p.parse_args(argv)
    dev, dt = torch.device("cuda"), torch.bfloat16
    bs, ctx, hq, hk, d = ns.batch_size, ns.context, ns.num_heads, ns.num_kv_heads, ns.head_dim
    slots = bs * ctx + 1
    k_buf = torch.randn(slots, hk, d, dtype=dt, device=dev)
    v_buf = torch.randn(slots, hk, d, dtype=dt, device=dev)
    # Each request's slots are a shuffled range: contiguous runs like a real pool after churn.
    table = (torch.randperm(bs, device=dev)[:, None] * ctx
             + torch.arange(ctx, device=dev)[None, :] + 1).to(torch.int32)
    seq_lens = torch.full((bs,), ctx, dtype=torch.int64, device=dev)
    kv_indptr, kv_indices = build_kv_indices(table, torch.arange(bs, device=dev), seq_lens,
                                             bs * ctx)
    q = torch.randn(bs, hq, d, dtype=dt, device=dev)
    out = torch.empty_like(q)
    kv_bytes = 2 * bs * ctx * hk * d * 2
    bw = copy_bandwidth(dev)
    rows = []
    for block_n, warps, stages, splits in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3),
                                                           (1, 2, 4)):
        nsplit = per_request_kv_splits(seq_lens, splits)
        mid_o, mid_lse = alloc_decode_buffers(bs, hq, d, splits, dev)

        def call():
            decode_attention(q, k_buf, v_buf, out, kv_indptr, kv_indices, nsplit, splits,
                             d ** -0.5, mid_o, mid_lse, block_n=block_n, num_warps=warps,
                             num_stages=stages)
        try:
            call()
        except Exception as e:  # e.g. out of shared memory for this tile
            rows.append({"block_n": block_n, "warps": warps, "stages": stages, "splits": splits,
                         "error": str(e)[:100]})
            continue
        times = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        t = sorted(times)[len(times) // 2]
        rows.append({"block_n": block_n, "warps": warps, "stages": stages, "splits": splits,
                     "seconds": t, "fraction_of_copy_bw": kv_bytes / t / bw})
    ok = sorted((r for r in rows if "seconds" in r), key=lambda r: r["seconds"])
    for r in ok[:10]:
        print(r)
    default = next(r for r in rows if (r["block_n"], r["warps"], r["stages"], r["splits"])
                   == (64 if d <= 64 else 32, 4, 2, 1))
    result = {"shape": vars(ns), "copy_bandwidth_gb_s": bw / 1e9, "kv_bytes": kv_bytes,
              "best": ok[0], "current_default": default, "all": rows}
    result.update(environment(None), command="python -m radixlm.bench.decode_kernel " +
                  " ".join(argv))
    path = write_json(ns.output or default_output_path("decode_kernel"), result)
    print_summary(f"decode kernel bs {bs} ctx {ctx}: best {ok[0]['fraction_of_copy_bw']:.0%} of "
                  f"copy bandwidth {ok[0]}, default {default.get('fraction_of_copy_bw', 0):.0%}"
                  f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
