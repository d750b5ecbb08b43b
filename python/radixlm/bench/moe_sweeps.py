"""Tile sweeps behind two of the fused MoE's kernel rules (`radixlm bench moe --parts
gemv-sweep` / `w8a8-sweep`; GPU): each GEMM timed alone over a small grid of tiles, the best
printed and written with the top few.

    gemv-sweep   the per-pair GEMVs at batch 1, bf16 and FP8, on the earlier kernel's tiles
                 (the wide kernel's tiles, now the defaults of pair_gemv_tiles, came from
                 the scripts in results/issue16/pair_gemv_wide/ and fp8_pair_gemv_wide/)
    w8a8-sweep   the W8A8 grouped GEMMs at prefill-sized batches (layers/moe/experts.py:
                 W8A8_LARGE_TILE)
"""

from __future__ import annotations

import torch

from radixlm.bench.moe_common import EXPERT_SHAPES, fp8_copy, graphed, time_fn


def gemv_sweep_part(shapes: list[str], device: torch.device) -> list[dict]:
    """Tiles of the per-pair GEMVs at batch 1, bf16 and FP8 (block scales), each GEMM alone,
    on the earlier (non-wide) kernel: what the wide tiles were compared against."""
    import itertools

    from radixlm.layers.moe.pair_gemv import PairGemvTiles, pair_gemv
    from radixlm.layers.moe.topk import RoutingConfig, select_experts

    rows = []
    for name in shapes:
        experts, top_k, hidden, inter = EXPERT_SHAPES[name]
        g = torch.Generator(device=device).manual_seed(0)
        w13 = (torch.randn(experts, 2 * inter, hidden, device=device, generator=g) * 0.02
               ).to(torch.bfloat16)
        w2 = (torch.randn(experts, hidden, inter, device=device, generator=g) * 0.02
              ).to(torch.bfloat16)
        q13, q2, sc = fp8_copy(w13, w2)
        x = torch.randn(1, hidden, device=device, dtype=torch.bfloat16)
        _, ids = select_experts(torch.randn(1, experts, device=device),
                                RoutingConfig(top_k, renormalize=True))
        ids = ids.reshape(-1).to(torch.int32)
        gate_up = torch.randn(top_k, 2 * inter, device=device, dtype=torch.bfloat16)
        out_up = torch.empty(top_k, 2 * inter, device=device, dtype=torch.bfloat16)
        out_down = torch.empty(top_k, hidden, device=device, dtype=torch.bfloat16)
        for label, b13, b2, s13, s2, block in (("bf16", w13, w2, None, None, None),
                                               ("fp8", q13, q2, sc.w13, sc.w2, sc.block)):
            for gemm, call in (
                    ("gate_up", lambda t: pair_gemv(x, b13, out_up, ids, top_k, b_scale=s13,
                                                    scale_block=block, tiles=t)),
                    ("down", lambda t: pair_gemv(gate_up, b2, out_down, ids, 1, gated=True,
                                                 b_scale=s2, scale_block=block, tiles=t))):
                timed = []
                for bn, bk, warps, stages in itertools.product((8, 16, 32), (512, 1024, 2048),
                                                               (4, 8), (3,)):
                    tiles = PairGemvTiles(bn, bk, warps, stages)
                    try:
                        timed.append((time_fn(graphed(lambda t=tiles: call(t), device), device,
                                              iters=10), tiles))
                    except Exception:  # out of registers / shared memory: skip
                        continue
                best_s, best = min(timed, key=lambda st: st[0])
                b = b13 if gemm == "gate_up" else b2
                weight_bytes = top_k * b[0].numel() * b.element_size()
                rows.append({"shape": name, "weights": label, "gemm": gemm,
                             "best_us": best_s * 1e6, "best": best.__dict__,
                             "gb_s": weight_bytes / best_s / 1e9,
                             "all": [(s * 1e6, t.__dict__) for s, t in sorted(
                                 timed, key=lambda st: st[0])[:8]]})
                print(f"gemv {name:17s} {label} {gemm:7s}: best {best_s * 1e6:.1f} us "
                      f"({rows[-1]['gb_s']:.0f} GB/s) {best}", flush=True)
    return rows


def w8a8_sweep_part(shapes: list[str], batch_sizes: list[int], device: torch.device
                    ) -> list[dict]:
    """Tiles of the W8A8 grouped GEMMs (FP8 experts with block scales, FP8 inputs) at
    prefill-sized batches, each GEMM alone: the data behind fused_moe_kernel.w8a8_tile_config."""
    import itertools

    from radixlm.layers.moe import fused_moe_kernel as kern
    from radixlm.layers.moe.topk import RoutingConfig, select_experts
    from radixlm.layers.quantization.fp8_kernels import quantize_per_token_group

    rows = []
    for name in shapes:
        experts, top_k, hidden, inter = EXPERT_SHAPES[name]
        g = torch.Generator(device=device).manual_seed(0)
        w13 = torch.randn(experts, 2 * inter, hidden, device=device, generator=g) * 0.02
        w2 = torch.randn(experts, hidden, inter, device=device, generator=g) * 0.02
        q13, q2, sc = fp8_copy(w13.to(torch.bfloat16), w2.to(torch.bfloat16))
        del w13, w2
        for bs in batch_sizes:
            x = torch.randn(bs, hidden, device=device, dtype=torch.bfloat16)
            _, ids = select_experts(torch.randn(bs, experts, device=device),
                                    RoutingConfig(top_k, renormalize=True))
            xq, xs = quantize_per_token_group(x, 128)
            act = torch.randn(bs * top_k, inter, device=device, dtype=torch.bfloat16)
            aq, as_ = quantize_per_token_group(act, 128)
            gate_up = torch.empty(bs * top_k, 2 * inter, device=device, dtype=torch.bfloat16)
            down = torch.empty(bs * top_k, hidden, device=device, dtype=torch.bfloat16)
            pw = torch.rand(bs * top_k, device=device)
            aligned: dict[int, object] = {}

            def pairs(block_m):
                if block_m not in aligned:
                    aligned[block_m] = kern.align_pairs_to_blocks(ids, experts, block_m)
                return aligned[block_m]

            for gemm, call in (
                    ("gate_up", lambda c: kern.grouped_gemm(
                        xq, q13, gate_up, pairs(c.block_m), top_k, c, b_scale=sc.w13,
                        scale_block=sc.block, a_scale=xs, a_group=128)),
                    ("down", lambda c: kern.grouped_gemm(
                        aq, q2, down, pairs(c.block_m), 1, c, pair_weights=pw, b_scale=sc.w2,
                        scale_block=sc.block, a_scale=as_, a_group=128))):
                timed = []
                for bm, bn, warps, stages in itertools.product((64, 128), (128, 256), (4, 8),
                                                               (3, 4)):
                    cfg = kern.MoETileConfig(bm, bn, 128, 8, warps, stages)
                    try:
                        timed.append((time_fn(lambda c=cfg: call(c), device, iters=10), cfg))
                    except Exception:  # out of shared memory / registers: skip
                        continue
                timed.sort(key=lambda st: st[0])
                best_s, best = timed[0]
                rows.append({"shape": name, "batch_size": bs, "gemm": gemm,
                             "best_us": best_s * 1e6, "best": best.__dict__,
                             "top": [(s * 1e6, c.__dict__) for s, c in timed[:6]]})
                print(f"w8a8 {name:17s} bs {bs:5d} {gemm:7s}: best {best_s * 1e6:.0f} us "
                      f"{best}", flush=True)
    return rows
