"""Graph slow state, round 2: which part of a capture triggers it, and where the time goes."""
import gc, json, os, sys, time, tempfile
import torch
os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
import torch.nn.functional as F

runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=64), radix=False)
gr = runner.graph_runner
g64 = gr.graphs[64]

def replay_ms(n=400, stream=None):
    torch.cuda.synchronize(); t = time.perf_counter()
    if stream is None:
        for _ in range(n):
            g64.replay()
    else:
        with torch.cuda.stream(stream):
            for _ in range(n):
                g64.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

def host_launch_us(n=50):
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); g64.replay(); ts.append(time.perf_counter() - t)
        torch.cuda.synchronize()
    ts.sort(); return ts[n // 2] * 1e6

def report(tag):
    print(f"{tag:48s} -> {replay_ms():.3f} {replay_ms():.3f} ms, launch {host_launch_us():.0f} us",
          flush=True)

def trace(tag):
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            g64.replay()
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json"); prof.export_chrome_trace(path)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    ev.sort(key=lambda e: e["ts"])
    n = len(ev) // 20
    busy = sum(e["dur"] for e in ev) / 20
    span = (ev[-1]["ts"] + ev[-1]["dur"] - ev[0]["ts"]) / 20
    by = {}
    for i, e in enumerate(ev):
        k = e["name"][:60]
        by.setdefault(k, [0.0, 0]); by[k][0] += e["dur"] / 20; by[k][1] += 1
    gaps = {}
    for a, b in zip(ev, ev[1:]):
        g = b["ts"] - (a["ts"] + a["dur"])
        if g < 50:
            k = b["name"][:60]; gaps.setdefault(k, 0.0); gaps[k] += g / 20
    print(f"[{tag}] kernels/replay {n}, busy {busy:.1f} us, span {span:.1f} us", flush=True)
    return by, gaps

def diff(a, b):
    (ba, ga), (bb, gb) = a, b
    d = sorted(((bb[k][0] - ba.get(k, [0])[0], k) for k in bb), reverse=True)[:8]
    print("  kernel time up most:", [(round(x, 1), k) for x, k in d])
    d = sorted(((gb[k] - ga.get(k, 0), k) for k in gb), reverse=True)[:8]
    print("  gap before kernel up most:", [(round(x, 1), k) for x, k in d])
    print(f"  total gap {sum(ga.values()):.1f} -> {sum(gb.values()):.1f} us", flush=True)

def cap_ctx(fn):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            out = fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    return g, out

def cap_raw(fn):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin()
        out = fn()
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    return g, out

x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
keep = []
report("before")
for which in sys.argv[2].split(","):
    if which == "trace":
        base = trace("fast")
        keep.append(cap_ctx(lambda: F.linear(x, w)))
        report("after F.linear graph")
        diff(base, trace("after capture"))
    elif which == "empty_cache":
        torch.cuda.empty_cache(); torch.cuda.synchronize(); report("torch.cuda.empty_cache()")
    elif which == "gc":
        gc.collect(); report("gc.collect()")
    elif which == "bigalloc":
        t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); t.fill_(1); del t
        torch.cuda.empty_cache(); torch.cuda.synchronize(); report("1 GiB alloc, free, empty_cache")
    elif which == "raw":
        keep.append(cap_raw(lambda: F.linear(x, w))); report("raw capture_begin/end F.linear")
    elif which == "ctx":
        keep.append(cap_ctx(lambda: F.linear(x, w))); report("torch.cuda.graph F.linear")
    elif which == "stream":
        s = torch.cuda.Stream()
        print(f"{'replay on a fresh side stream':48s} -> {replay_ms(stream=s):.3f} ms", flush=True)
    elif which == "reinst":
        # instantiate the same graph again: is it the new exec or the capture?
        keep.append(cap_raw(lambda: x * 2)); report("raw capture of an elementwise op")
