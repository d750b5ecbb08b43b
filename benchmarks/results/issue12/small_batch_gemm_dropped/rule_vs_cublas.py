"""The small-batch GEMM's rule (layers/kernels/small_batch_gemm.py) against F.linear at the
shapes it takes and at rows 2-64: each call timed inside a CUDA graph over weight copies that
overflow the L2 (bench/gemv.py's method). Run on the GPU machine:

    (with small_batch_gemm.py copied to python/radixlm/layers/kernels/)
    OUT=dir python benchmarks/results/issue12/small_batch_gemm_dropped/rule_vs_cublas.py
"""
import json
import os

import torch
import torch.nn.functional as F

from radixlm.bench.gemv import copies_past_l2, timed_over_copies
from radixlm.bench.one_batch import copy_bandwidth
from radixlm.layers.kernels import small_batch_gemm as sbg

SHAPES = {"qwen3-0.6b o": (1024, 2048), "qwen3-0.6b down": (1024, 3072),
          "llama-3.2-1b qkv": (3072, 2048), "llama-3.2-1b o": (2048, 2048),
          "llama-3.2-1b down": (2048, 8192), "llama-3.1-8b o": (4096, 4096),
          "llama-3.1-8b down": (4096, 14336)}
bw = copy_bandwidth(torch.device("cuda"))
rows = []
for name, (n, k) in SHAPES.items():
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = copies_past_l2(lambda: torch.randn(n, k, device="cuda", generator=gen)
                        .mul_(k ** -0.5).to(torch.bfloat16), n * k * 2)
    sbg.reserve_scratch_for(ws[0].device, n)
    for m in (2, 8, 16, 32, 48, 64):
        x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        tiles = sbg.small_batch_tiles(m, n, k)
        cublas = timed_over_copies(lambda w: F.linear(x, w), ws)
        kernel = timed_over_copies(lambda w: sbg.small_batch_gemm(x, w, None, tiles), ws)
        r = dict(shape=name, n=n, k=k, m=m, tiles=str(tiles), cublas_us=cublas, kernel_us=kernel,
                 speedup=cublas / kernel, kernel_of_copy_bw=n * k * 2 / kernel / 1e3 / (bw / 1e9))
        rows.append(r)
        print(f"{name:18s} M={m:3d} cuBLAS {cublas:6.2f} us  kernel {kernel:6.2f} us  "
              f"x{cublas / kernel:.2f}  ({r['kernel_of_copy_bw']:.0%} of copy bw)", flush=True)
    del ws
    torch.cuda.empty_cache()
out = os.environ.get("OUT", "/tmp")
json.dump(dict(copy_bandwidth_gb_s=bw / 1e9, device=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(out, "rule_vs_cublas.json"), "w"), indent=1)
