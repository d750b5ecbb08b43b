import itertools, json, os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch, triton
from triton.tools.tensor_descriptor import TensorDescriptor
from extp_kern import _kern
from radixlm.layers.attention.kernels.extend_attention import extend_attention
from radixlm.bench.common import cuda_median_seconds
LOG2E = 1.4426950408889634
hq, hk, d = 32, 8, 64
res = []
for lengths in ([4096] * 4, [16384]):
    dev, dt = torch.device("cuda"), torch.bfloat16
    t = sum(lengths)
    qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dt, device=dev)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hk * d, hk * d], dim=1))
    qo = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
    flops = 4.0 * d * hq * sum(n * (n + 1) / 2 for n in lengths)
    out = torch.empty_like(q)
    pool = torch.empty(1, hk, d, dtype=dt, device=dev)
    kvp = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=dev)
    kvi = torch.zeros(1, dtype=torch.int64, device=dev)
    prod = lambda: extend_attention(q, k, v, out, pool, pool, qo, kvp, kvi, max(lengths), d ** -0.5, extend_lens=lengths)
    prod(); ref = out.float().clone()
    s = cuda_median_seconds(prod)
    res.append(dict(shape=f"{len(lengths)}x{lengths[0]}", variant="production", tflops=flops / s / 1e12))
    print(res[-1], flush=True)
    for pipe, ws, (bm, bn, w, st) in itertools.product((0, 1, 2), (False, True), ((64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3))):
        if ws and pipe:
            continue
        if pipe == 2 and bm < 2 * bn:
            continue
        desc = lambda x, r: TensorDescriptor(x, shape=[t, x.shape[1] * d], strides=[x.stride(0), 1], block_shape=[r, d])
        qa, ka, va = desc(q, bm), desc(k, bn), desc(v, bn)
        grid = (hq, triton.cdiv(max(lengths), bm), len(lengths))
        run = lambda: _kern[grid](qa, ka, va, out, qo, d ** -0.5 * LOG2E, out.stride(0), out.stride(1),
                                  GROUP=hq // hk, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, PIPE=pipe, WS=ws,
                                  num_warps=w, num_stages=st)
        row = dict(shape=f"{len(lengths)}x{lengths[0]}", pipe=pipe, ws=ws, bm=bm, bn=bn, w=w, st=st)
        try:
            out.zero_(); run(); torch.cuda.synchronize()
            row["err"] = (out.float() - ref).abs().max().item()
            s = cuda_median_seconds(run)
            row["tflops"] = flops / s / 1e12
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        res.append(row)
        print(row, flush=True)
    s = cuda_median_seconds(prod)
    res.append(dict(shape=f"{len(lengths)}x{lengths[0]}", variant="production again", tflops=flops / s / 1e12))
    print(res[-1], flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "extp.json"), "w"), indent=1)
