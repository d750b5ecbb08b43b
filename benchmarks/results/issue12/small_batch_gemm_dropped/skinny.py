# Small-M GEMM (M = 16..128 rows, decode batches) as W-tile x X^T on tensor cores, against F.linear,
# each timed inside a CUDA graph over weight copies that overflow the L2 (bench/gemv.py's method).
import itertools, json, os, sys
import torch, triton, triton.language as tl
import torch.nn.functional as F
from radixlm.bench.gemv import copies_past_l2, timed_over_copies
from radixlm.bench.one_batch import copy_bandwidth
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from skinny_k import skinny

SHAPES = {"qwen3-0.6b": {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)},
          "llama-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)},
          "llama-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}}
bw = copy_bandwidth(torch.device("cuda"))
rows = []
for model, shapes in SHAPES.items():
    for name, (n, k) in shapes.items():
        nbytes = n * k * 2
        gen = torch.Generator(device="cuda").manual_seed(0)
        ws = copies_past_l2(lambda: torch.randn(n, k, device="cuda", generator=gen).mul_(k ** -0.5).to(torch.bfloat16), nbytes)
        for m in (32, 64):
            x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
            ref_us = timed_over_copies(lambda w: F.linear(x, w), ws)
            best = None
            for bn, bk, split, warps, stages in itertools.product((32, 64, 128), (64, 128, 256), (1, 2, 4), (4,), (4,)):
                if k % (bk * split):
                    continue
                bm = max(16, m)
                try:
                    want = F.linear(x, ws[0]).float()
                    out = torch.zeros(m, n, dtype=torch.float32, device="cuda") if split > 1 else None
                    got = skinny(x, ws[0], bm, bn, bk, split, warps, stages, out).float()
                    err = (got - want).abs().max().item()
                    if split > 1:   # atomics accumulate: time with a fresh fp32 buffer kept (values grow, time does not)
                        buf = torch.zeros(m, n, dtype=torch.float32, device="cuda")
                        us = timed_over_copies(lambda w: skinny(x, w, bm, bn, bk, split, warps, stages, buf), ws)
                    else:
                        us = timed_over_copies(lambda w: skinny(x, w, bm, bn, bk, split, warps, stages), ws)
                except Exception as e:
                    print("fail", model, name, m, bn, bk, split, stages, type(e).__name__, str(e)[:100], flush=True)
                    continue
                r = dict(model=model, layer=name, n=n, k=k, m=m, bn=bn, bk=bk, split=split, warps=warps, stages=stages,
                         us=us, cublas_us=ref_us, err=err)
                rows.append(r)
                if best is None or us < best["us"]:
                    best = r
            print(f"{model:10s} {name:8s} M={m:4d} cuBLAS {ref_us:6.2f} us ({nbytes / ref_us / 1e3 / (bw / 1e9) * 100:3.0f}% bw) "
                  f"best {best['us']:6.2f} us ({nbytes / best['us'] / 1e3 / (bw / 1e9) * 100:3.0f}%) x{ref_us / best['us']:.2f} "
                  f"bn {best['bn']} bk {best['bk']} split {best['split']} st {best['stages']} err {best['err']:.3g}", flush=True)
        del ws
        torch.cuda.empty_cache()
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(dict(copy_bandwidth_gb_s=bw / 1e9, rows=rows), open(os.path.join(os.environ.get("OUT", "/tmp"), "skinny.json"), "w"))
