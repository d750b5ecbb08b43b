"""After the graphs are captured (GEMV off), capture small graphs and time the bs-64 graph
after each: what makes it slower?"""
import os, sys, time
import torch
os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.layers.kernels import gemv_kernels as G
import torch.nn.functional as F

runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=64), radix=False)
gr = runner.graph_runner
g64 = gr.graphs[64]

def replay_ms(n=400):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g64.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

def clock():
    try:
        return torch.cuda.clock_rate()
    except Exception as e:
        return str(e)[:40]

keep = []
def cap(tag, fn, pool=None):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, pool=pool, stream=s):
            out = fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    keep.append((g, out))
    print(f"{tag:44s} -> {replay_ms():.3f} {replay_ms():.3f} ms, clock {clock()}", flush=True)

print(f"{'before':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms, clock {clock()}", flush=True)
x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
t = G.gemv_tiles(1, 4096, 1024)
which = sys.argv[2]
if which == "flinear":
    cap("graph: F.linear M=1 (own pool)", lambda: F.linear(x, w))
    cap("graph: F.linear M=1 (shared pool)", lambda: F.linear(x, w), gr.pool)
elif which == "norm":
    from radixlm.layers.kernels import norm_kernels
    h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    cap("graph: rms_norm (already loaded kernel)", lambda: norm_kernels.rms_norm(h, nw, 1e-6, None))
elif which == "replay_only":
    g1 = gr.graphs[1]
    for _ in range(10):
        g1.replay()
    torch.cuda.synchronize()
    print(f"{'replayed bs1 graph 10x':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms", flush=True)
elif which == "recap64":
    def t_all():
        out = []
        for b in (64, 32, 8):
            g = gr.graphs[b]
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for _ in range(400):
                g.replay()
            torch.cuda.synchronize()
            out.append(f"bs{b} {(time.perf_counter() - t0) / 400 * 1e3:.3f}")
        return ", ".join(out)
    print("all graphs before:", t_all(), flush=True)
    from radixlm.layers.kernels import norm_kernels
    h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    cap("graph: rms_norm", lambda: norm_kernels.rms_norm(h, nw, 1e-6, None))
    print("all graphs after a capture:", t_all(), flush=True)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(s):
        gr._capture_one(64)
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g64 = gr.graphs[64]
    print("bs64 recaptured:", t_all(), flush=True)
elif which == "free":
    from radixlm.layers.kernels import norm_kernels
    h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    cap("graph: rms_norm", lambda: norm_kernels.rms_norm(h, nw, 1e-6, None))
    keep.clear(); import gc; gc.collect(); torch.cuda.synchronize()
    print(f"{'rms_norm graph deleted':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms", flush=True)
    for b in (1, 2, 4):
        del gr.graphs[b]
    gc.collect(); torch.cuda.synchronize()
    print(f"{'graphs bs 1, 2, 4 deleted':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms", flush=True)
    for b in (8, 16, 24, 32):
        del gr.graphs[b]
    gc.collect(); torch.cuda.synchronize()
    print(f"{'graphs bs 8-32 deleted':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms", flush=True)
    cap("graph: rms_norm again", lambda: norm_kernels.rms_norm(h, nw, 1e-6, None))
elif which == "gemv_own":
    cap("graph: gemv (own pool)", lambda: G.gemv(x, w, None, t))
    cap("graph: gemv (shared pool)", lambda: G.gemv(x, w, None, t), gr.pool)
elif which == "gemv_shared":
    cap("graph: gemv (shared pool)", lambda: G.gemv(x, w, None, t), gr.pool)
elif which == "bs1":
    os.environ.pop("RADIXLM_DISABLE_GEMV")
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(s):
        gr._capture_one(1)
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    print(f"{'bs1 recaptured gemv on':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms, clock {clock()}", flush=True)
elif which == "bs1_off":
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(s):
        gr._capture_one(1)
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    print(f"{'bs1 recaptured gemv off':44s} -> {replay_ms():.3f} {replay_ms():.3f} ms, clock {clock()}", flush=True)
