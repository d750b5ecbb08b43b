"""Graph slow state, round 5: sweep the number of graphs captured after graph A."""
import sys, time
import torch
import torch.nn.functional as F
from radixlm.layers.kernels import norm_kernels

def t_ms(g, n=300):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    t1 = (time.perf_counter() - t) / n * 1e3
    if sys.argv[3] != "replay_on_capture_stream":
        return t1
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.cuda.stream(g._cap_stream):
        for _ in range(n):
            g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

SAME = torch.cuda.Stream()
STREAM_MODE = sys.argv[3]
def cap(fn, pool=None, warm=True):
    if warm:
        fn(); torch.cuda.synchronize()
    s = SAME if STREAM_MODE == "same" else torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s, pool=pool):
            fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g._cap_stream = s
    return g

mode, layers = sys.argv[1], int(sys.argv[2])
h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
ws = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
y = torch.zeros(1 << 14, device="cuda")
def mixed():
    z = h
    for w in ws:
        z = F.silu(z + F.linear(norm_kernels.rms_norm(z, nw, 1e-6, None), w))
    return z
def adds():
    for _ in range(4 * layers):
        y.add_(1.0)
def linears():
    z = h
    for w in ws:
        z = F.linear(z, w)
    return z
def norms():
    z = h
    for w in ws:
        z = norm_kernels.rms_norm(z, nw, 1e-6, None)
    return z
fns = {"mixed": mixed, "adds": adds, "linears": linears, "norms": norms}
fn = fns[mode]
A = cap(fn)
keep = []
out = [f"{t_ms(A):.4f}"]
for i in range(12):
    keep.append(cap(fn, A.pool()))
    out.append(f"{t_ms(A):.4f}")
print(f"{mode} x{layers} layers [{STREAM_MODE}]: A after 0..12 more graphs: {' '.join(out)}; newest {t_ms(keep[-1]):.4f}", flush=True)
keep.clear(); import gc; gc.collect(); torch.cuda.synchronize()
print(f"   after deleting them: {t_ms(A):.4f}; a fresh capture of A: {t_ms(cap(fn, A.pool())):.4f}", flush=True)
