# production extend kernel: tiles x tma x has_prefix sweep (plain prefill, no prefix present)
import itertools, json, os, torch
from radixlm.bench.common import cuda_median_seconds
from radixlm.layers.attention.kernels.extend_attention import extend_attention, tma_fits
hq, hk, dev, dt = 32, 8, torch.device("cuda"), torch.bfloat16
TILES = {64: [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 3),
              (64, 64, 4, 2), (128, 128, 8, 3), (128, 32, 4, 3)],
         128: [(128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 32, 8, 3),
               (64, 64, 4, 3), (64, 32, 4, 3), (128, 128, 8, 3)]}
rows = []
for d in (64, 128):
    for lengths in ([4096] * 4, [16384]):
        t = sum(lengths)
        qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dt, device=dev)
        q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hk * d, hk * d], dim=1))
        assert tma_fits(q, k, v)
        out = torch.empty_like(q)
        pool = torch.empty(1, hk, d, dtype=dt, device=dev)
        qo = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
        kvp = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=dev)
        kvi = torch.zeros(1, dtype=torch.int32, device=dev)
        flops = 4.0 * d * hq * sum(n * (n + 1) / 2 for n in lengths)
        for hp, tma, (bm, bn, w, st) in itertools.product((False, True), (False, True), TILES[d]):
            run = lambda: extend_attention(q, k, v, out, pool, pool, qo, kvp, kvi, max(lengths), d ** -0.5,
                                           block_m=bm, block_n=bn, num_warps=w, num_stages=st, tma=tma,
                                           has_prefix=hp)
            r = dict(d=d, shape=f"{len(lengths)}x{lengths[0]}", has_prefix=hp, tma=tma, bm=bm, bn=bn, w=w, st=st)
            try:
                r["tflops"] = flops / cuda_median_seconds(run) / 1e12
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {str(e)[:100]}"
            rows.append(r)
        del qkv, q, k, v, out
        torch.cuda.empty_cache()
json.dump(rows, open(os.environ["OUT"] + "/r/g32.json", "w"), indent=1)
for d in (64, 128):
    for hp in (False, True):
        keys = sorted({(r["tma"], r["bm"], r["bn"], r["w"], r["st"]) for r in rows if r["d"] == d})
        tab = []
        for key in keys:
            v = {r["shape"]: r.get("tflops", 0) for r in rows if r["d"] == d and r["has_prefix"] == hp
                 and (r["tma"], r["bm"], r["bn"], r["w"], r["st"]) == key}
            tab.append((v.get("4x4096", 0), v.get("1x16384", 0), key))
        tab.sort(reverse=True)
        print(f"hd {d} has_prefix {hp}:", "; ".join(f"{k} {a:.0f}/{b:.0f}" for a, b, k in tab[:6]))
