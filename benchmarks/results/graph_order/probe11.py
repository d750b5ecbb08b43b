"""Graph slow state, round 6: what counts toward the 4th-graph switch."""
import sys, time, contextlib
import torch
import torch.nn.functional as F
from radixlm.layers.kernels import norm_kernels

def t_ms(g, n=300):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

def cap(fn, pool=None, warm=True, mode="global"):
    if warm:
        fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s, pool=pool, capture_error_mode=mode):
            out = fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g._out = out
    return g

h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
ws = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(28)]
y = torch.zeros(1 << 14, device="cuda")
def mixed():
    z = h
    for w in ws:
        z = F.silu(z + F.linear(norm_kernels.rms_norm(z, nw, 1e-6, None), w))
    return z
def norms():
    z = h
    for w in ws:
        z = norm_kernels.rms_norm(z, nw, 1e-6, None)
    return z
def trivial():
    y.mul_(2.0)

v = sys.argv[1]
ctx = torch.inference_mode() if v == "inference" else contextlib.nullcontext()
keep = []
with ctx:
    if v == "trivial_before":
        for _ in range(3):
            keep.append(cap(trivial))
        A = cap(mixed)
        out = [f"{t_ms(A):.4f}"]
        for _ in range(4):
            keep.append(cap(trivial)); out.append(f"{t_ms(A):.4f}")
    else:
        A = cap(mixed)
        out = [f"{t_ms(A):.4f}"]
        for i in range(8):
            if v == "trivial_after":
                keep.append(cap(trivial))
            elif v == "own_pool":
                keep.append(cap(mixed))
            elif v == "no_warm":
                keep.append(cap(mixed, A.pool(), warm=False))
            elif v == "other_fn":
                keep.append(cap(norms, A.pool()))
            elif v == "relaxed":
                keep.append(cap(mixed, A.pool(), mode="relaxed"))
            elif v == "inference":
                keep.append(cap(mixed, A.pool()))
            elif v == "no_replay":
                keep.append(cap(mixed, A.pool()))
                out.append("-"); continue
            out.append(f"{t_ms(A):.4f}")
        if v == "no_replay":
            out.append(f"{t_ms(A):.4f}")
print(f"{v:15s}: A: {' '.join(out)}", flush=True)
