"""Issue 12 experiment: the extend kernel with the cached-prefix loop compiled in (as before)
and out (plain prefills now), plus a few tiles / register caps for the no-prefix kernel.
Registers and spills of each compiled kernel on the device, TFLOP/s in three alternating rounds.
    python benchmarks/results/issue12/extend_no_prefix/variants.py OUT.json"""
import itertools
import json
import sys

import torch
import triton

from radixlm.bench.common import cuda_median_seconds, environment
from radixlm.bench.extend_kernel import causal_flops
import radixlm.layers.attention.kernels.extend_attention  # noqa: F401

# The package re-exports the function under the module's name.
ea = sys.modules["radixlm.layers.attention.kernels.extend_attention"]

dev, dt = torch.device("cuda"), torch.bfloat16
print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)


def launch(q, k, v, out, qo, kv_indptr, kv_indices, pool, max_len, lengths, *, has_prefix,
           tma=True, bm=64, bn=64, warps=4, stages=3, maxnreg=None):
    t, hq, d = q.shape
    hk = k.shape[1]
    qa, ka, va = q, k, v
    if tma:
        assert ea.tma_safe_lens(lengths, bn) and ea.tma_layout_fits(q, k, v)
        qa, ka, va = ea._descriptor(q, bm), ea._descriptor(k, bn), ea._descriptor(v, bn)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    grid = (hq, triton.cdiv(max_len, bm), len(lengths))
    return ea._extend_kernel[grid](
        qa, ka, va, out, pool, pool, qo, kv_indptr, kv_indices,
        d ** -0.5 * ea.LOG2E, d ** -0.5 * ea.LOG2E, 1.0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), pool.stride(0), pool.stride(1), pool.stride(0),
        pool.stride(1), GROUP=hq // hk, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn,
        DOT_PREC="tf32", TMA=tma, HAS_PREFIX=has_prefix, num_warps=warps, num_stages=stages,
        **extra)


VARIANTS = {
    "tma 64x64 w4 s3, prefix loop in (before)": dict(has_prefix=True),
    "tma 64x64 w4 s3, no prefix loop (now)": dict(has_prefix=False),
    "tma 64x64 w4 s2, no prefix": dict(has_prefix=False, stages=2),
    "tma 128x64 w8 s2, no prefix": dict(has_prefix=False, bm=128, warps=8, stages=2),
    "tma 128x64 w8 s3, no prefix": dict(has_prefix=False, bm=128, warps=8, stages=3),
    "tma 64x64 w4 s3, no prefix, maxnreg 168": dict(has_prefix=False, maxnreg=168),
    "tma 64x64 w4 s3, no prefix, maxnreg 128": dict(has_prefix=False, maxnreg=128),
    "gathered 128x64 w4 s3, prefix loop in": dict(has_prefix=True, tma=False, bm=128),
    "gathered 128x64 w4 s3, no prefix": dict(has_prefix=False, tma=False, bm=128),
}
results = []
for d, lengths in itertools.product((64, 128), ([4096] * 2, [4096] * 4, [16384])):
    hq, hk, t = 32, 8, sum(lengths)
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dt, device=dev, generator=g)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hk * d, hk * d], dim=1))
    out = torch.empty_like(q)
    pool = torch.empty(1, hk, d, dtype=dt, device=dev)
    qo = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
    kv_indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.zeros(1, dtype=torch.int32, device=dev)
    flops = causal_flops(lengths, hq, d)
    ref = None
    rows = {}
    for rnd in range(3):
        names = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
        for name in names:
            cfg = dict(VARIANTS[name])
            if d == 128 and cfg.get("warps") == 4 and not cfg.get("tma", True):
                cfg["warps"] = 8
            row = rows.setdefault(name, {"name": name, "cfg": cfg, "tflops": []})
            try:
                def call(cfg=cfg):
                    return launch(q, k, v, out, qo, kv_indptr, kv_indices, pool,
                                  max(lengths), lengths, **cfg)
                kern = call()
                torch.cuda.synchronize()
                if rnd == 0:
                    row["regs"], row["spills"] = kern.n_regs, kern.n_spills
                    row["shared"] = kern.metadata.shared
                    if ref is None:
                        ref = out.clone()
                    row["max_diff_vs_first"] = (out.float() - ref.float()).abs().max().item()
                s = cuda_median_seconds(call)
                row["tflops"].append(round(flops / s / 1e12, 1))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for r in rows.values():
        print(f"hd {d} {len(lengths)}x{lengths[0]} | {r['name']:45s} | regs {r.get('regs')} "
              f"spills {r.get('spills')} smem {r.get('shared')} | {r['tflops']} "
              f"{r.get('error', '')} diff {r.get('max_diff_vs_first')}", flush=True)
    results.append({"head_dim": d, "lengths": lengths, "rows": list(rows.values())})
json.dump({"results": results, **environment(None)}, open(sys.argv[1], "w"), indent=1)
