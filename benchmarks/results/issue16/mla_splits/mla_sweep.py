"""MLA decode at batch 1: tokens per split x block_n x warps x stages (graph of the pair)."""
import itertools, json, os, sys
import torch
from radixlm.bench.common import graph_seconds_per_call
from radixlm.layers.attention.kernels import alloc_decode_buffers, build_kv_indices
from radixlm.layers.attention.kernels.mla_attention import mla_decode_attention

dev = torch.device("cuda")
lora, rope, dt = 512, 64, torch.bfloat16
rows = []
for bs, ctx, heads in [(1, 1024, 16), (1, 1088, 16), (1, 4096, 16), (1, 1024, 128), (8, 1024, 16)]:
    tokens = bs * ctx
    kv = torch.randn(tokens + 1, 1, lora + rope, device=dev).to(dt)
    table = (torch.randperm(tokens, device=dev) + 1).to(torch.int32).view(bs, ctx)
    seq_lens = torch.full((bs,), ctx, device=dev)
    indptr, indices = build_kv_indices(table, torch.arange(bs, device=dev), seq_lens, tokens)
    q = torch.randn(bs, heads, lora + rope, device=dev).to(dt)
    out = torch.empty(bs, heads, lora, device=dev, dtype=dt)
    ref = None
    for tps, bn, w, st in itertools.product((16, 32, 64, 128), (16, 32), (4, 8), (1, 2)):
        if tps < bn:
            continue
        max_splits = 64
        n = min(64, -(-ctx // tps))
        splits = torch.full((bs,), n, device=dev, dtype=torch.int32)
        buf = alloc_decode_buffers(bs, heads, lora, max_splits, dev)
        run = lambda: mla_decode_attention(q, kv, out, lora, indptr, indices, splits, max_splits,
                                           0.1, buf, block_n=bn, num_warps=w, num_stages=st)
        try:
            run(); torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            err = (out.float() - ref.float()).abs().max().item()
            s = graph_seconds_per_call(run)
        except Exception as e:
            print("skip", tps, bn, w, st, repr(e)[:80]); continue
        rows.append(dict(bs=bs, ctx=ctx, heads=heads, tokens_per_split=tps, splits=n, block_n=bn,
                         warps=w, stages=st, us=s * 1e6, err=err))
    best = sorted([r for r in rows if r["ctx"] == ctx and r["bs"] == bs and r["heads"] == heads],
                  key=lambda r: r["us"])
    dflt = [r for r in best if r["tokens_per_split"] == 64 and r["block_n"] == 32
            and r["warps"] == 4 and r["stages"] == 2]
    print(f"bs {bs} ctx {ctx} heads {heads} default {dflt[0]['us']:.1f} us" if dflt else "")
    for r in best[:6]:
        print("  ", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "mla_sweep.json"), "w"), indent=1)
