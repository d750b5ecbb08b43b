"""`radixlm bench quant --parts gemv, gemv-sweep`: batch-1 quantized linear layers.

For one row of x, each Llama-3.1-8B layer shape (qkv, o, gate_up, down) as bf16 (the engine's
path: the bf16 GEMV where it takes the shape, else F.linear), as FP8 (channel scales and
128 x 128 block scales; `_old` fp8_kernels.py's small-M kernel, `_new` fp8_gemv.py) and as
4-bit (group 128; `_old` int4_kernels.py's small-M kernel, `_new` int4_gemv.py). As in
`bench gemv`, every call of a timed CUDA graph reads another copy of the weight, so that the
copies together overflow the L2 cache: a decode step reads each weight once. Reported:
microseconds, speed-up over bf16, and the bytes each reads (weight, scales, zero points) per
microsecond against the copy bandwidth measured in the same run. `gemv-sweep` also times a
grid of one-row tiles and reports the fastest three (how the defaults were chosen).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from radixlm.bench.gemv import copies_past_l2, timed_over_copies
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}              # (N, K) of Llama-3.1-8B's linear layers
BLOCK = (128, 128)
GROUP = 128


def _fp8_grid(block: tuple[int, int] | None) -> list:
    from radixlm.layers.quantization.fp8_gemv import Fp8GemvTiles
    if block:
        return [Fp8GemvTiles(bn, 128, c, w) for bn in (2, 4, 8) for c in (8, 16, 32)
                for w in (4, 8)]
    return [Fp8GemvTiles(bn, bk, 1, w) for bn in (2, 4, 8, 16) for bk in (1024, 2048, 4096)
            for w in (4, 8)]


def _w4_grid(n: int, k: int) -> list:
    from radixlm.layers.quantization.int4_gemv import W4GemvTiles
    groups = -(-k // GROUP)
    return [W4GemvTiles(bn, max(1, min(groups, programs // -(-n // bn))), w)
            for bn in (256, 512, 1024) for programs in (264, 528, 1056, 2112) for w in (4, 8)]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run_shape(name: str, n: int, k: int, sweep: bool, bandwidth: float, m: int = 1) -> dict:
    from radixlm.layers.kernels import gemv_kernels
    from radixlm.layers.quantization.fp8_kernels import (dequantize_fp8, fp8_weight_gemm,
                                                         quantize_fp8_per_channel)
    from radixlm.layers.quantization.int4_kernels import (quantize_int4_rtn, w4_dequantize_torch,
                                                          w4a16_gemm)
    from radixlm.layers.quantization.fp8_gemv import fp8_gemv
    from radixlm.layers.quantization.int4_gemv import w4_gemv
    from radixlm.layers.quantization.split_k import SCRATCH_ROWS, SplitKScratch
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    w_full = torch.randn(n, k, device="cuda", generator=gen).mul_(k ** -0.5)
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "m": m}

    def report(label: str, us: float, nbytes: int, ref: torch.Tensor | None = None,
               got: torch.Tensor | None = None) -> None:
        row[f"{label}_us"] = us
        row[f"{label}_of_copy_bw"] = nbytes / (us * 1e-6) / bandwidth
        if "bf16_us" in row:
            row[f"{label}_speedup"] = row["bf16_us"] / us
        if ref is not None and got is not None:
            row[f"{label}_max_err"] = (got.float() - ref).abs().max().item()
        print(f"{name:8s} M={m} {label:22s} {us:8.1f} us  {row[f'{label}_of_copy_bw']:5.0%} "
              f"x{row.get(f'{label}_speedup', 1.0):.2f}", flush=True)

    # bf16, as the engine runs it.
    bf16 = copies_past_l2(lambda: (w_full.to(torch.bfloat16),), n * k * 2)
    tiles = gemv_kernels.gemv_tiles(m, n, k)
    if tiles is not None:
        report("bf16", timed_over_copies(lambda c: gemv_kernels.gemv(x, c[0], None, tiles),
                                         bf16), n * k * 2)
    else:
        report("bf16", timed_over_copies(lambda c: F.linear(x, c[0]), bf16), n * k * 2)
    del bf16

    # FP8, channel and block scales.
    q, s = quantize_fp8_per_channel(w_full)
    sb = torch.rand(-(-n // BLOCK[0]), -(-k // BLOCK[1]), device="cuda", generator=gen) / 100
    for label, scale, block in (("fp8", s, None), ("fp8_block", sb, BLOCK)):
        ref = x.float() @ dequantize_fp8(q, scale, block, torch.float32).t()
        nbytes = _nbytes((q, scale))
        copies = copies_past_l2(lambda: (q.clone(), scale.clone()), nbytes)
        report(f"{label}_old",
               timed_over_copies(lambda c: fp8_weight_gemm(x, c[0], c[1], block), copies),
               nbytes, ref, fp8_weight_gemm(x, q, scale, block))
        report(f"{label}_new", timed_over_copies(lambda c: fp8_gemv(x, c[0], c[1], block), copies),
               nbytes, ref, fp8_gemv(x, q, scale, block))
        if sweep:
            row[f"{label}_sweep"] = _sweep(
                lambda c, t: fp8_gemv(x, c[0], c[1], block, None, t), copies, _fp8_grid(block),
                nbytes, bandwidth, f"{name} {label}", ref)
        del copies

    # 4-bit, group 128, as the layers run it.
    qw, s4, z4 = quantize_int4_rtn(w_full, GROUP)
    ref = x.float() @ w4_dequantize_torch(qw, s4, z4, GROUP, k, torch.float32)
    nbytes = _nbytes((qw, s4, z4))
    copies = copies_past_l2(lambda: (qw.clone(), s4.clone(), z4.clone()), nbytes)
    report("w4_old",
           timed_over_copies(lambda c: w4a16_gemm(x, c[0], c[1], c[2], GROUP), copies),
           nbytes, ref, w4a16_gemm(x, qw, s4, z4, GROUP))
    if m == 1:
        scratch = SplitKScratch.for_layer(SCRATCH_ROWS, n, x.device)
        report("w4_new",
               timed_over_copies(lambda c: w4_gemv(x, c[0], c[1], c[2], GROUP, scratch), copies),
               nbytes, ref, w4_gemv(x, qw, s4, z4, GROUP, scratch))
        if sweep:
            row["w4_sweep"] = _sweep(
                lambda c, t: w4_gemv(x, c[0], c[1], c[2], GROUP, scratch, None, t), copies,
                _w4_grid(n, k), nbytes, bandwidth, f"{name} w4", ref)
    del copies
    torch.cuda.empty_cache()
    return row


def _sweep(call: Callable[[tuple, Any], Any], copies: list[tuple], grid: list, nbytes: int,
           bandwidth: float, label: str, ref: torch.Tensor) -> list[dict]:
    """Time every tile of `grid`; a tile whose product is off from `ref` (fp32) by more than
    2% of its largest value is reported and left out."""
    timed = []
    for t in grid:
        try:
            err = (call(copies[0], t).float() - ref).abs().max().item()
            if err > 0.02 * ref.abs().max().item():
                print(f"  {label} {t}: WRONG (max error {err:.3g})", flush=True)
                continue
            timed.append((timed_over_copies(lambda c, t=t: call(c, t), copies), t))
        except Exception as e:          # a tile the compiler cannot fit
            print(f"  {label} {t}: {type(e).__name__}", flush=True)
    timed.sort(key=lambda p: p[0])
    for us, t in timed[:3]:
        print(f"  sweep {label:18s} {us:8.1f} us {nbytes / (us * 1e-6) / bandwidth:5.0%} {t}",
              flush=True)
    return [{"us": us, "of_copy_bw": nbytes / (us * 1e-6) / bandwidth, "tiles": vars(t)}
            for us, t in timed]


def gemv_part(sweep: bool, ms: list[int]) -> dict:
    from radixlm.bench.one_batch import copy_bandwidth
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    rows = [run_shape(name, n, k, sweep and m == 1, bandwidth, m) for m in ms
            for name, (n, k) in SHAPES.items()]
    return {"copy_bandwidth_gb_s": bandwidth / 1e9, "rows": rows}
