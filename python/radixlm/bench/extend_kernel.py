"""`python -m radixlm.bench.extend_kernel`: the extend (prefill) attention kernel alone, in
TFLOP/s of causal attention, over tile sizes, warps and pipeline stages, next to PyTorch's own
SDPA (FlashAttention backend) on the same shapes. Used to pick the kernel's defaults and to
report issue 12's target (>= 450 TFLOP/s for 4k causal prefill at head dims 64 and 128).

Shapes: `--requests` prompts of `--length` new tokens each, no cached prefix (a plain
prefill: the headline workload's batches are 2-4 prompts of 4096), plus one prompt of 16k.
FLOPs counted: 4 * d * heads * sum over requests of L(L+1)/2 (QK^T and PV, causal half).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Sequence

import torch
import torch.nn.functional as F

from radixlm.bench.common import cuda_median_seconds as _median_seconds
from radixlm.bench.common import default_output_path, environment, print_summary, write_json


def causal_flops(lengths: list[int], heads: int, d: int) -> float:
    return 4.0 * d * heads * sum(n * (n + 1) / 2 for n in lengths)


def one_shape(lengths: list[int], hq: int, hk: int, d: int, sweep: bool) -> dict:
    from radixlm.layers.attention.kernels.common import max_shared_memory
    from radixlm.layers.attention.kernels.extend_attention import (extend_attention,
                                                                   extend_config, uses_tma)
    dev, dt = torch.device("cuda"), torch.bfloat16
    t = sum(lengths)
    g = torch.Generator(device=dev).manual_seed(0)
    # q, k, v as views of one fused QKV projection's output, as the model hands them over.
    qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dt, device=dev, generator=g)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hk * d, hk * d], dim=1))
    out = torch.empty_like(q)
    empty_pool = torch.empty(1, hk, d, dtype=dt, device=dev)
    qo = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
    kv_indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.zeros(1, dtype=torch.int64, device=dev)
    flops = causal_flops(lengths, hq, d)

    def run(**cfg):
        return extend_attention(q, k, v, out, empty_pool, empty_pool, qo, kv_indptr, kv_indices,
                                max(lengths), d ** -0.5, extend_lens=lengths, **cfg)

    # Correctness of the default tiles against SDPA, request by request.
    run()
    ref_parts, sdpa_inputs = [], []
    for b, n in enumerate(lengths):
        rows = slice(int(qo[b]), int(qo[b + 1]))
        qb, kb, vb = (x[rows].transpose(0, 1)[None].contiguous() for x in (q, k, v))
        sdpa_inputs.append((qb, kb, vb))
        ref_parts.append(F.scaled_dot_product_attention(qb, kb, vb, is_causal=True,
                                                        enable_gqa=True)[0].transpose(0, 1))
    err = (out.float() - torch.cat(ref_parts).float()).abs().max().item()

    def sdpa():
        for qb, kb, vb in sdpa_inputs:
            F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)

    # SDPA with K/V expanded per head (its flash kernel takes no GQA): the floor's usual call.
    expanded = [(qb, kb.repeat_interleave(hq // hk, 1), vb.repeat_interleave(hq // hk, 1))
                for qb, kb, vb in sdpa_inputs]

    def sdpa_expanded():
        for qb, kb, vb in expanded:
            F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)

    tma = uses_tma(q, k, v, max(lengths), lengths)
    default = extend_config(d, dt, max_shared_memory(dev), tma=tma)
    s_default = _median_seconds(run)
    # The same kernel with every tile gathered row by row (its defaults for that path): what
    # the TMA copies gain, in the same run.
    s_gathered = _median_seconds(lambda: run(tma=False))
    result = {"lengths": lengths, "hq": hq, "hk": hk, "head_dim": d, "max_abs_err": err,
              "tma": tma, "default_config": default, "default_us": s_default * 1e6,
              "default_tflops": flops / s_default / 1e12,
              "gathered_config": extend_config(d, dt, max_shared_memory(dev)),
              "gathered_tflops": flops / s_gathered / 1e12,
              "sdpa_gqa_tflops": flops / _median_seconds(sdpa) / 1e12,
              "sdpa_expanded_tflops": flops / _median_seconds(sdpa_expanded) / 1e12}
    if sweep:
        rows = []
        for use_tma, bm, bn, w, st in itertools.product(sorted({False, tma}), (64, 128),
                                                        (32, 64, 128), (4, 8), (2, 3, 4)):
            if bm % bn:
                continue
            tiles = {"tma": use_tma, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                     "num_stages": st}
            try:
                s = _median_seconds(lambda: run(block_m=bm, block_n=bn, num_warps=w,
                                                num_stages=st, tma=use_tma))
            except Exception as e:  # out of shared memory or registers for this tile
                rows.append({**tiles, "error": type(e).__name__})
                continue
            rows.append({**tiles, "us": s * 1e6, "tflops": flops / s / 1e12})
        ok = [r for r in rows if "tflops" in r]
        result["sweep"] = rows
        result["best"] = max(ok, key=lambda r: r["tflops"]) if ok else None
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m radixlm.bench.extend_kernel", description=__doc__)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--no-sweep", action="store_true", help="default tiles and SDPA only")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = p.parse_args(argv)
    results = []
    for d in (int(x) for x in ns.head_dims.split(",")):
        for lengths in ([ns.length] * ns.requests, [16384]):
            r = one_shape(lengths, ns.num_heads, ns.num_kv_heads, d, not ns.no_sweep)
            results.append(r)
            best = r.get("best")
            print(f"hd {d} {len(lengths)}x{lengths[0]}: default {r['default_tflops']:.0f} "
                  f"TFLOP/s (tma {r['tma']}; gathered tiles {r['gathered_tflops']:.0f}), "
                  f"SDPA {r['sdpa_gqa_tflops']:.0f} / {r['sdpa_expanded_tflops']:.0f}"
                  + (f", best {best['tflops']:.0f} at {best}" if best else "")
                  + f", max err {r['max_abs_err']:.3g}", flush=True)
    out = {"shapes": results, **environment(None),
           "command": "python -m radixlm.bench.extend_kernel " + " ".join(argv)}
    path = write_json(ns.output or default_output_path("extend_kernel"), out)
    print_summary(f"extend kernel -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
