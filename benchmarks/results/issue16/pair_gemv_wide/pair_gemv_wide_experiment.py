"""Experiment: pair GEMV, current kernel at its default tiles vs the wide-accumulator kernel."""
import itertools, json, sys
import torch
from radixlm.bench.common import graph_seconds_per_call
from radixlm.bench.moe_common import EXPERT_SHAPES
from radixlm.layers.moe.pair_gemv import PairGemvTiles, pair_gemv, pair_gemv_tiles

dev = torch.device("cuda")
out = {}
for name in ("deepseek-v2-lite", "qwen3-30b-a3b"):
    experts, top_k, hidden, inter = EXPERT_SHAPES[name]
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(1, hidden, device=dev, dtype=torch.bfloat16)
    gate_up = torch.randn(top_k, 2 * inter, device=dev, dtype=torch.bfloat16)
    ids_list = [torch.randperm(experts, device=dev)[:top_k].to(torch.int32) for _ in range(16)]
    out_up = torch.empty(top_k, 2 * inter, device=dev, dtype=torch.bfloat16)
    out_down = torch.empty(top_k, hidden, device=dev, dtype=torch.bfloat16)
    wts = torch.rand(top_k, device=dev)
    for gemm in ("gate_up", "down"):
        def call(t, ids):
            if gemm == "gate_up":
                return pair_gemv(x, w13, out_up, ids, top_k, tiles=t)
            return pair_gemv(gate_up, w2, out_down, ids, 1, gated=True, pair_weights=wts, tiles=t)
        nbytes = top_k * (w13[0] if gemm == "gate_up" else w2[0]).numel() * 2
        base_t = pair_gemv_tiles(hidden if gemm == "gate_up" else inter, 2, gemm == "down")
        ref = call(base_t, ids_list[0]).float().clone()
        def timed(t):
            return graph_seconds_per_call(lambda: [call(t, i) for i in ids_list], len(ids_list)) * 1e6
        base = timed(base_t)
        rows = []
        for bn, bk, w in itertools.product((2, 4, 8, 16), (256, 512, 1024), (4, 8)):
            t = PairGemvTiles(bn, bk, w, 1, wide=True)
            try:
                got = call(t, ids_list[0]).float()
                err = (got - ref).abs().max().item()
                if err > 0.02 * ref.abs().max().item():
                    print("WRONG", name, gemm, t, err); continue
                rows.append(dict(bn=bn, bk=bk, warps=w, us=timed(t)))
            except Exception as e:
                print("ERR", name, gemm, bn, bk, w, type(e).__name__, str(e)[:80])
        rows.sort(key=lambda r: r["us"])
        print(f"{name} {gemm}: current {base:.2f} us ({nbytes / base / 1e3:.0f} GB/s) {base_t}; "
              f"wide best {rows[0]} ({nbytes / rows[0]['us'] / 1e3:.0f} GB/s); next {rows[1:3]}", flush=True)
        out[f"{name}/{gemm}"] = dict(current_us=base, current_tiles=base_t.__dict__, wide=rows, bytes=nbytes)
json.dump(out, open(sys.argv[1], "w"), indent=1)
