"""FP8 per-pair GEMV at batch 1: current tiles (old kernel) vs wide tiles; 16 expert sets per
graph (L2 cold-ish), per-call us; correctness vs dequantized reference."""
import itertools, json, os
import torch
import torch.nn.functional as F
from radixlm.bench.common import graph_seconds_per_call
from radixlm.bench.moe_common import EXPERT_SHAPES
from radixlm.layers.moe.experts import Fp8ExpertScales
from radixlm.layers.moe.fp8_experts import quantize_experts
from radixlm.layers.moe.pair_gemv import PairGemvTiles, pair_gemv, pair_gemv_tiles

dev = torch.device("cuda")
rows = []
SETS = 16
for name in ("qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"):
    E, top_k, H, I = EXPERT_SHAPES[name]
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device=dev, generator=g) * 0.02
    w2 = torch.randn(E, H, I, device=dev, generator=g) * 0.02
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    gu = torch.randn(top_k, 2 * I, device=dev, dtype=torch.bfloat16)
    idsets = [torch.randperm(E, device=dev)[:top_k].to(torch.int32) for _ in range(SETS)]
    if E < SETS * top_k:  # mixtral: 8 experts, reuse
        pass
    pw = torch.rand(top_k, device=dev)
    for block in ((128, 128), None):
        q13, s13 = quantize_experts(w13.to(torch.bfloat16), block)
        q2, s2 = quantize_experts(w2.to(torch.bfloat16), block)
        sc = Fp8ExpertScales(s13, s2, block)
        for gemm in ("gate_up", "down"):
            b, s = (q13, s13) if gemm == "gate_up" else (q2, s2)
            a, arpp, gated = (x, top_k, False) if gemm == "gate_up" else (gu, 1, True)
            N, K = b.shape[1], b.shape[2]
            out = torch.empty(top_k, N, device=dev, dtype=torch.bfloat16)
            ids = idsets[0]
            deq = torch.stack([sc.dequantize(b[e], s[e], torch.float32) for e in ids.tolist()])
            if gated:
                inp = (F.silu(gu[:, :I].float()) * gu[:, I:].float()).to(torch.bfloat16).float()
            else:
                inp = x.float().expand(top_k, H)
            want = torch.einsum("pk,pnk->pn", inp, deq)
            if gated:
                want = want * pw[:, None]
            cur = pair_gemv_tiles(K, 1, gated)
            cands = [cur] + [PairGemvTiles(bn, bk, w, 1, wide=True) for bn, bk, w in
                             itertools.product((2, 4, 8, 16), (512, 1024, 2048), (4, 8))]
            for t in cands:
                def call(ids_, t=t):
                    pair_gemv(a, b, out, ids_, arpp, gated=gated,
                              pair_weights=pw if gated else None, b_scale=s,
                              scale_block=block, tiles=t)
                try:
                    call(ids); torch.cuda.synchronize()
                    err = ((out.float() - want).abs().max() / want.abs().max()).item()
                    sec = graph_seconds_per_call(lambda: [call(i) for i in idsets], SETS)
                except Exception as e:
                    print("skip", name, gemm, t, repr(e)[:100]); continue
                rows.append(dict(shape=name, block=block, gemm=gemm, tiles=t.__dict__,
                                 current=t is cur, us=sec * 1e6, err=err,
                                 gb_s=top_k * N * K / sec / 1e9))
            sel = [r for r in rows if r["shape"] == name and r["block"] == block and r["gemm"] == gemm]
            c = [r for r in sel if r["current"]][0]
            best = sorted(sel, key=lambda r: r["us"])
            print(f"{name} {block} {gemm} N{N} K{K}: current {c['us']:.2f} us err {c['err']:.1e}; "
                  f"best {best[0]['us']:.2f} {best[0]['tiles']} err {best[0]['err']:.1e}")
            for r in best[1:4]:
                print(f"      {r['us']:.2f} {r['tiles']}")
            print("      max err wide", max(r["err"] for r in sel))
out = os.environ.get("OUT", "/tmp")
json.dump(rows, open(os.path.join(out, "fp8_pair_sweep.json"), "w"), indent=1)
