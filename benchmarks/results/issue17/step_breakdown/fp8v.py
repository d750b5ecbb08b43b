"""Experiment: register use of the one-row FP8 kernel, and a variant whose accumulator is
reduced inside each thread every tile ([BN, BK/V, V] -> sum over V, V = 16 fp8 per 16-byte load)
so that more weight bytes can be in flight per SM (more rows a program / deeper tiles)."""
import json, os, itertools
import torch, triton, triton.language as tl
from radixlm.bench.gemv import copies_past_l2, timed_over_copies
from radixlm.bench.one_batch import copy_bandwidth
from radixlm.layers.quantization.fp8_kernels import quantize_fp8_per_channel, dequantize_fp8
from radixlm.layers.quantization import fp8_gemv as F8


@triton.jit
def _fp8_gemv_v(x_ptr, w_ptr, s_ptr, y_ptr, N, stride_wn, K: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, V: tl.constexpr, UNROLL: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)
    offs_g = tl.arange(0, BLOCK_K // V)
    offs_v = tl.arange(0, V)
    offs_k = offs_g[:, None] * V + offs_v[None, :]                       # [BK/V, V]
    w_ptrs = w_ptr + rows[:, None, None].to(tl.int64) * stride_wn + offs_k[None, :, :]
    x_ptrs = x_ptr + offs_k
    acc = tl.zeros((BLOCK_N, BLOCK_K // V), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K * UNROLL):
        for u in tl.static_range(UNROLL):
            w = tl.load(w_ptrs + k0 + u * BLOCK_K)
            x = tl.load(x_ptrs + k0 + u * BLOCK_K).to(tl.float32)
            acc += tl.sum(w.to(tl.float32) * x[None, :, :], axis=2)
    y = tl.sum(acc, axis=1) * tl.load(s_ptr + rows)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


def launch_v(x, w, s, bn, bk, warps, unroll, v=16):
    n, k = w.shape
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _fp8_gemv_v[(triton.cdiv(n, bn),)](x, w, s, y, n, w.stride(0), K=k, BLOCK_N=bn, BLOCK_K=bk,
                                       V=v, UNROLL=unroll, num_warps=warps, num_stages=1)
    return y


def launch_d(x, w, s, t):
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    h = F8._fp8_gemv_kernel[(m, triton.cdiv(n, t.block_n))](
        x, w, s, s, y, n, x.stride(0), w.stride(0), y.stride(0), 0, K=k,
        SCALE_BN=1, SCALE_BK=1, BLOCK_SCALES=False, HAS_BIAS=False, BLOCK_N=t.block_n,
        CHUNKS=t.chunks, CHUNK=t.chunk, GATED=False, num_warps=t.num_warps, num_stages=1)
    return y, h


SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
bw = copy_bandwidth(torch.device("cuda"))
print(f"copy bandwidth {bw/1e12:.2f} TB/s", flush=True)
out = {"copy_bw": bw, "shapes": {}}
tot_d = tot_v = 0.0
for name, (n, k) in SHAPES.items():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    wf = torch.randn(n, k, device="cuda", generator=gen).mul_(k ** -0.5)
    q, s = quantize_fp8_per_channel(wf)
    ref = x.float() @ dequantize_fp8(q, s, None, torch.float32).t()
    nbytes = q.numel() + s.numel() * 4
    copies = copies_past_l2(lambda: (q.clone(), s.clone()), nbytes)
    t = F8.fp8_gemv_tiles(n, k, None)
    _, h = launch_d(x, q, s, t)
    d_us = timed_over_copies(lambda c: launch_d(x, c[0], c[1], t), copies)
    info = {"default_tiles": [t.block_n, t.chunk, t.chunks, t.num_warps], "default_regs": h.n_regs,
            "default_spills": h.n_spills, "default_us": d_us}
    print(f"{name:8s} default bn={t.block_n} bk={t.chunk} w={t.num_warps}: {d_us:6.1f} us "
          f"({nbytes/(d_us*1e-6)/bw:4.0%}) regs {h.n_regs} spills {h.n_spills}", flush=True)
    rows = []
    for bn, bk, warps, unroll in itertools.product((2, 4, 8, 16), (512, 1024, 2048, 4096), (4, 8), (1, 2)):
        if k % (bk * unroll):
            continue
        try:
            y = launch_v(x, q, s, bn, bk, warps, unroll)
            err = (y.float() - ref).abs().max().item()
            if err > 0.05:
                print("BAD", bn, bk, warps, unroll, err); continue
            us = timed_over_copies(lambda c: launch_v(x, c[0], c[1], bn, bk, warps, unroll), copies)
        except Exception as e:
            print("fail", bn, bk, warps, unroll, type(e).__name__, str(e)[:100]); continue
        rows.append({"bn": bn, "bk": bk, "warps": warps, "unroll": unroll, "us": us,
                     "of_bw": nbytes / (us * 1e-6) / bw})
    rows.sort(key=lambda r: r["us"])
    info["variant_top"] = rows[:6]
    out["shapes"][name] = info
    tot_d += d_us; tot_v += rows[0]["us"]
    for r in rows[:3]:
        print(f"          variant {r}", flush=True)
    del copies
print(f"sum of four (no PDL): default {tot_d:.1f} us, variant best {tot_v:.1f} us ({tot_d/tot_v:.3f}x)")
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fp8_variant.json"), "w"), indent=1)
