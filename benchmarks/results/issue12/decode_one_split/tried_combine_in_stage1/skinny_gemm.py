"""Exploration: the FP8 tensor-core split-K kernel run on bf16 weights (scale 1) against
F.linear for decode batches of 16-64 rows, L2 overflowed, in CUDA graphs."""
import itertools, json, sys, time
import torch
import torch.nn.functional as F
from radixlm.bench.gemv import copies_past_l2, timed_over_copies
from radixlm.bench.one_batch import copy_bandwidth
from radixlm.layers.quantization.fp8_kernels import GemmTiles, fp8_weight_gemm
from radixlm.layers.quantization.split_k import SplitKScratch

SHAPES = {"qwen3 qkv": (4096, 1024), "qwen3 o": (1024, 2048), "qwen3 gate_up": (6144, 1024),
          "qwen3 down": (1024, 3072), "1b qkv": (3072, 2048), "1b o": (2048, 2048),
          "1b gate_up": (16384, 2048), "1b down": (2048, 8192), "8b qkv": (6144, 4096),
          "8b o": (4096, 4096), "8b gate_up": (28672, 4096), "8b down": (4096, 14336)}
dev = torch.device("cuda")
bw = copy_bandwidth(dev)
rows = []
deadline = time.time() + float(sys.argv[2])
for name, (n, k) in SHAPES.items():
    if time.time() > deadline:
        break
    ws = copies_past_l2(lambda: (torch.randn(n, k, device=dev) * k ** -0.5).to(torch.bfloat16),
                        n * k * 2)
    ones = torch.ones(n, device=dev)
    scratch = SplitKScratch.for_layer(64, n, dev)
    for m in (16, 32, 64):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        cub = timed_over_copies(lambda w: F.linear(x, w), ws)
        best = None
        for bn, bk, sk in itertools.product((32, 64, 128), (64, 128, 256), (1, 2, 4, 8)):
            t = GemmTiles(max(16, m), bn, bk, 4, 3, split_k=sk)
            try:
                us = timed_over_copies(lambda w: fp8_weight_gemm(x, w, ones, None, t, scratch), ws)
            except Exception as e:
                continue
            if best is None or us < best[0]:
                best = (us, t)
        ref = F.linear(x.float(), ws[0].float())
        err = (fp8_weight_gemm(x, ws[0], ones, None, best[1], scratch).float() - ref).abs().max().item()
        cerr = (F.linear(x, ws[0]).float() - ref).abs().max().item()
        cub2 = timed_over_copies(lambda w: F.linear(x, w), ws)
        row = dict(shape=name, n=n, k=k, m=m, cublas_us=cub, cublas_again_us=cub2,
                   triton_us=best[0], tiles=best[1].__dict__, speedup=min(cub, cub2) / best[0],
                   triton_of_bw=n * k * 2 / best[0] / 1e6 / bw, cublas_of_bw=n * k * 2 / cub / 1e6 / bw,
                   err=err, cublas_err=cerr)
        rows.append(row)
        print(f"{name:14s} m={m:3d} cuBLAS {cub:6.1f}/{cub2:6.1f} us ({row['cublas_of_bw']:.0%}) "
              f"triton {best[0]:6.1f} us ({row['triton_of_bw']:.0%}) x{row['speedup']:.2f} "
              f"{best[1].block_n}x{best[1].block_k} s{best[1].split_k} err {err:.1e}/{cerr:.1e}",
              flush=True)
    ws.clear()
    torch.cuda.empty_cache()
json.dump(dict(bandwidth=bw, rows=rows), open(sys.argv[1], "w"), indent=1)
