"""Experiment: the FP8 one-row kernel with Triton's software pipelining (num_stages > 1) and
smaller K tiles, against its defaults (num_stages=1), Llama-3.1-8B shapes, L2 overflowed."""
import json, os, sys, itertools
import torch, triton
from radixlm.bench.gemv import copies_past_l2, timed_over_copies
from radixlm.bench.one_batch import copy_bandwidth
from radixlm.layers.quantization.fp8_kernels import quantize_fp8_per_channel, dequantize_fp8
from radixlm.layers.quantization import fp8_gemv as F8

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
bw = copy_bandwidth(torch.device("cuda"))
print(f"copy bandwidth {bw/1e12:.2f} TB/s", flush=True)

def launch(x, w, s, bn, chunk, chunks, warps, stages):
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    F8._fp8_gemv_kernel[(m, triton.cdiv(n, bn))](
        x, w, s, s, y, n, x.stride(0), w.stride(0), y.stride(0), 0, K=k,
        SCALE_BN=1, SCALE_BK=1, BLOCK_SCALES=False, HAS_BIAS=False, BLOCK_N=bn,
        CHUNKS=chunks, CHUNK=chunk, GATED=False, num_warps=warps, num_stages=stages)
    return y

out = {"copy_bw": bw, "shapes": {}}
total_default = total_best = 0.0
for name, (n, k) in SHAPES.items():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    wf = torch.randn(n, k, device="cuda", generator=gen).mul_(k ** -0.5)
    q, s = quantize_fp8_per_channel(wf)
    ref = x.float() @ dequantize_fp8(q, s, None, torch.float32).t()
    nbytes = q.numel() + s.numel() * 4
    copies = copies_past_l2(lambda: (q.clone(), s.clone()), nbytes)
    t = F8.fp8_gemv_tiles(n, k, None)
    base = timed_over_copies(lambda c: F8.fp8_gemv(x, c[0], c[1], None), copies)
    rows = []
    for bn, bk, warps, stages in itertools.product((2, 4, 8), (512, 1024, 2048, 4096), (4, 8), (1, 2, 3, 4)):
        if k % bk:
            continue
        try:
            y = launch(x, q, s, bn, bk, 1, warps, stages)
            err = (y.float() - ref).abs().max().item()
            if err > 0.05:
                print("BAD", name, bn, bk, warps, stages, err); continue
            us = timed_over_copies(lambda c: launch(x, c[0], c[1], bn, bk, 1, warps, stages), copies)
        except Exception as e:
            print("fail", name, bn, bk, warps, stages, type(e).__name__, str(e)[:80]); continue
        rows.append({"bn": bn, "bk": bk, "warps": warps, "stages": stages, "us": us, "of_bw": nbytes / (us * 1e-6) / bw})
    rows.sort(key=lambda r: r["us"])
    best_by_stage = {st: min((r for r in rows if r["stages"] == st), key=lambda r: r["us"]) for st in (1, 2, 3, 4) if any(r["stages"] == st for r in rows)}
    out["shapes"][name] = {"default_us": base, "default_of_bw": nbytes / (base * 1e-6) / bw, "default": vars(t) if hasattr(t, '__dict__') else str(t), "top": rows[:8], "best_by_stages": best_by_stage}
    total_default += base; total_best += rows[0]["us"]
    print(f"{name:8s} default {base:6.1f} us ({nbytes/(base*1e-6)/bw:4.0%})  best {rows[0]['us']:6.1f} us ({rows[0]['of_bw']:4.0%}) {rows[0]}", flush=True)
    for st, r in best_by_stage.items():
        print(f"          stages={st}: {r['us']:6.1f} us ({r['of_bw']:4.0%}) bn={r['bn']} bk={r['bk']} warps={r['warps']}", flush=True)
    del copies
print(f"sum of four: default {total_default:.1f} us, best {total_best:.1f} us ({total_default/total_best:.3f}x)")
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fp8_stages.json"), "w"), indent=1, default=str)
