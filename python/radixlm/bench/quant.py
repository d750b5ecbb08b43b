"""`radixlm bench quant`: FP8 and 4-bit weights against bf16, kernels and whole models.

Parts, each a same-run comparison:
  kernel    one linear layer of each Llama-3.1-8B shape (qkv, o, gate_up, down) at several
            batch sizes M, inside CUDA graphs: bf16 F.linear against --quantization fp8 and
            w4a16 as the layers run them (the weight-only Triton kernels up to M = 64, then
            FP8 tensor-core GEMMs / dequantize + cuBLAS), with the weight bytes each reads per
            microsecond; torch's own small-M int4 kernel as a second reference.
  sweep     tiles of the two weight-only kernels at small M (the table in fp8_kernels.py).
  gemv      batch-1 layers, L2 cache overflowed: bf16 vs FP8 (channel and block scales; the
            earlier small-M kernel and the one-row kernel) vs 4-bit (bench/quant_gemv.py);
  gemv-sweep  the same, plus a grid of one-row tiles.
  model     a model config with random weights through the model runner, once per
            quantization (bf16, fp8, w4a16): prefill and decode step times, the batch-1 step
            against its roofline (bytes of the weights and KV it reads / copy bandwidth).
  accuracy  the bundled model (or --model-path) on a fixed text: per-token KL divergence of
            the quantized logits from full precision, and greedy agreement over 8 prompts x 32
            tokens (runs on the CPU too).

    radixlm bench quant --parts kernel,sweep
    radixlm bench quant --parts model --model-path benchmarks/configs/llama-3.1-8b
    radixlm bench quant --parts accuracy
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
import triton

from radixlm.bench.common import (default_output_path, environment, print_summary, require_positive,
                                  write_json)

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}              # (N, K) of Llama-3.1-8B's linear layers
QUANTS = ("fp8", "w4a16")


def _layer(flag: str | None, n: int, k: int, w: torch.Tensor):
    from radixlm.layers.linear import RowParallelLinear
    from radixlm.layers.quantization import linear_method_for, resolve_quant_spec
    method = linear_method_for(resolve_quant_spec(flag, None)) if flag else None
    with torch.device("cuda"):
        layer = RowParallelLinear(k, n, linear_method=method).to(torch.bfloat16)
    layer.weight.weight_loader(layer.weight, w)
    layer.process_weights_after_loading()
    return layer


def _weight_bytes(layer) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def _timed(fn: Callable[[], Any], calls: int = 20) -> float:
    from radixlm.bench.fused_ops import time_graph_us
    return time_graph_us(fn, iters=20, calls=calls)


def kernel_part(ms: list[int]) -> list[dict]:
    rows = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.bfloat16)
        layers = {flag: _layer(flag, n, k, w) for flag in QUANTS}
        packed = None
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bf16_us = _timed(lambda: F.linear(x, w))
            row: dict[str, Any] = {"shape": name, "n": n, "k": k, "m": m, "bf16_us": bf16_us,
                                   "bf16_tb_s": n * k * 2 / bf16_us / 1e6}
            for flag, layer in layers.items():
                us = _timed(lambda: layer(x))
                row[f"{flag}_us"] = us
                row[f"{flag}_speedup"] = bf16_us / us
                row[f"{flag}_tb_s"] = _weight_bytes(layer) / us / 1e6
            if m <= 64:     # torch's tinygemm int4 kernel, a reference for small M
                try:
                    packed = packed or _torch_int4(w)
                    row["torch_int4_us"] = _timed(lambda: torch._weight_int4pack_mm(
                        x, packed[0], 128, packed[1]))
                except (RuntimeError, AttributeError) as e:     # not in every torch build
                    row["torch_int4_error"] = str(e)[:200]
            rows.append(row)
            print(f"{name:8s} M={m:<5d} bf16 {bf16_us:8.1f} us ({row['bf16_tb_s']:.2f} TB/s)  "
                  f"fp8 {row['fp8_us']:8.1f} us x{row['fp8_speedup']:.2f} "
                  f"({row['fp8_tb_s']:.2f} TB/s)  w4a16 {row['w4a16_us']:8.1f} us "
                  f"x{row['w4a16_speedup']:.2f} ({row['w4a16_tb_s']:.2f} TB/s)"
                  + (f"  torch int4 {row['torch_int4_us']:.1f} us" if "torch_int4_us" in row
                     else ""), flush=True)
        del layers, w
        torch.cuda.empty_cache()
    return rows


def _torch_int4(w: torch.Tensor):
    """torch's packed int4 weight (tinygemm layout) of w's shape, random values: for the
    reference timing only."""
    n, k = w.shape
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
    packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
    scales_zeros = torch.ones(k // 128, n, 2, dtype=torch.bfloat16, device="cuda")
    return packed, scales_zeros


def _sweep_grid(kind: str, m: int) -> list:
    """Candidate tiles: for one or two rows the one-row-per-program kernels (the tensor-core
    tiles never won there), else tensor-core tiles with and without split-K."""
    from radixlm.layers.quantization.fp8_kernels import GemmTiles
    if m <= 2:
        bks = (256, 512, 1024) if kind == "w4a16" else (512, 1024, 2048)
        return [GemmTiles(1, bn, bk, warps, 3, split, gemv=True) for bn in (8, 16, 32, 64)
                for bk in bks for warps in (4, 8) for split in (1, 2, 4, 8)]
    bm = max(16, triton.next_power_of_2(m))
    bks = (64, 128) if kind == "w4a16" else (128, 256)
    return [GemmTiles(bm, bn, bk, 4, 3, split) for bn in (16, 32, 64) for bk in bks
            for split in (1, 2, 4)]


def sweep_part(ms: list[int], kinds: list[str]) -> list[dict]:
    from radixlm.layers.quantization.fp8_kernels import fp8_weight_gemm
    from radixlm.layers.quantization.int4_kernels import w4a16_gemm
    rows = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.bfloat16)
        f8, i4 = _layer("fp8", n, k, w), _layer("w4a16", n, k, w)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for kind in kinds:
                timed = []
                for t in _sweep_grid(kind, m):
                    if kind == "fp8":
                        call = lambda t=t: fp8_weight_gemm(x, f8.weight, f8.weight_scale,
                                                           None, t)
                    else:
                        call = lambda t=t: w4a16_gemm(x, i4.qweight, i4.scales, i4.zeros,
                                                      128, t)
                    try:
                        timed.append((_timed(call, calls=10), t))
                    except Exception:      # a tile the compiler cannot fit (shared memory)
                        continue
                timed.sort(key=lambda p: p[0])
                rows.append({"shape": name, "m": m, "kind": kind,
                             "best": [{"us": us, "tiles": vars(t)} for us, t in timed[:3]]})
                for us, t in timed[:3]:
                    print(f"sweep {name:8s} M={m:<3d} {kind:6s} {us:8.1f} us "
                          f"({n * k / (1 if kind == 'fp8' else 2) / us / 1e6:.2f} TB/s) {t}",
                          flush=True)
        del f8, i4, w
        torch.cuda.empty_cache()
    return rows


def model_part(args) -> dict:
    from radixlm.bench.moe import model_part as run_model
    from radixlm.bench.one_batch import copy_bandwidth
    bandwidth = copy_bandwidth(torch.device("cuda"))
    out: dict[str, Any] = {"copy_bandwidth_gb_s": bandwidth / 1e9}
    quants = args.quants.split(",")
    for flag in [None, *quants]:
        args.quantization = flag
        out[flag or "bf16"] = run_model(args, torch.device("cuda"), bandwidth)
        gc.collect()
        torch.cuda.empty_cache()
    base = out["bf16"]["batches"]
    for flag in quants:
        for b, q in zip(base, out[flag]["batches"]):
            q["decode_speedup_vs_bf16"] = b["decode_step_ms"] / q["decode_step_ms"]
            q["prefill_speedup_vs_bf16"] = b["prefill_s"] / q["prefill_s"]
            print(f"{flag:6s} bs {q['batch_size']}: decode x{q['decode_speedup_vs_bf16']:.2f}, "
                  f"prefill x{q['prefill_speedup_vs_bf16']:.2f} vs bf16, "
                  f"{q['fraction_of_roofline']:.0%} of its roofline", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench quant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="kernel",
                   help="kernel, sweep, gemv, gemv-sweep, model, accuracy")
    p.add_argument("--ms", default="1,2,4,8,16,32,64,128,512,4096",
                   help="kernel part: rows M")
    p.add_argument("--sweep-ms", default="1,16,32,64")
    p.add_argument("--sweep-kinds", default=",".join(QUANTS))
    p.add_argument("--gemv-ms", default="1,2", help="gemv part: rows M (sweeps at M = 1)")
    p.add_argument("--model-path", default=None,
                   help="model part: a config dir (random weights); accuracy: a checkpoint "
                        "(default: the bundled model)")
    p.add_argument("--quants", default=",".join(QUANTS),
                   help="model part: the quantizations timed against bf16 (MoE models: fp8)")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--input-len", type=int, default=4096)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--device", default=None, help="accuracy part: cpu or cuda")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    require_positive(p, args, "input_len", "output_len")
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = set(parts) - {"kernel", "sweep", "gemv", "gemv-sweep", "model", "accuracy"}
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}")
    if set(parts) - {"accuracy"} and not torch.cuda.is_available():
        p.error("the kernel, sweep, gemv and model parts need a CUDA GPU")
    bad_quants = set(args.quants.split(",")) - set(QUANTS)
    if bad_quants:
        p.error(f"--quants: unknown {sorted(bad_quants)}; choose from {list(QUANTS)}")
    if "model" in parts and not args.model_path:
        p.error("--parts model needs --model-path")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    result: dict[str, Any] = {}
    if "kernel" in parts:
        result["kernel"] = kernel_part([int(m) for m in args.ms.split(",")])
    if "sweep" in parts:
        result["sweep"] = sweep_part([int(m) for m in args.sweep_ms.split(",")],
                                     args.sweep_kinds.split(","))
    if "gemv" in parts or "gemv-sweep" in parts:
        from radixlm.bench.quant_gemv import gemv_part
        result["gemv"] = gemv_part("gemv-sweep" in parts,
                                   [int(m) for m in args.gemv_ms.split(",")])
    if "model" in parts:
        result["model"] = model_part(args)
    if "accuracy" in parts:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        from radixlm.bench.quant_accuracy import measure_accuracy
        # (the model part's --model-path is a config of random weights: use the bundled model)
        result["accuracy"] = measure_accuracy(
            args.model_path if "model" not in parts else None, device)
    result.update(environment(None), command="radixlm bench quant " + " ".join(argv))
    path = write_json(args.output or default_output_path("quant"), result)
    print_summary(f"bench quant ({', '.join(parts)}) -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
