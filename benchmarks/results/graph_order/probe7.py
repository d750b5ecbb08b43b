"""Graph slow state, round 3: a model-free repro, and workarounds."""
import ctypes, os, sys, time
import torch

cuda = ctypes.CDLL("libcuda.so.1")

def upload(g):
    r = cuda.cuGraphUpload(ctypes.c_void_p(g.raw_cuda_graph_exec()),
                           ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    torch.cuda.synchronize()
    return r

def t_ms(g, n=400):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

def cap(fn):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    return g

mode = sys.argv[1]
if mode.startswith("micro"):
    n_nodes = int(sys.argv[2])
    x = torch.zeros(1 << 14, device="cuda")
    y = torch.zeros(1 << 14, device="cuda")
    def chain():
        for _ in range(n_nodes):
            x.add_(1.0)
    A = cap(chain)
    if mode == "micro_first":
        B = cap(lambda: y.mul_(2.0))
        print(f"micro {n_nodes}: B captured before A's first replay: A {t_ms(A):.4f}", flush=True)
    else:
        a0 = t_ms(A)
        B = cap(lambda: y.mul_(2.0))
        a1 = t_ms(A)
        r = upload(A)
        a2 = t_ms(A)
        print(f"micro {n_nodes}: A {a0:.4f} -> after B {a1:.4f} -> cuGraphUpload(A) rc {r}: {a2:.4f} ms",
              flush=True)
    sys.exit()

os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[2], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=64), radix=False)
gr = runner.graph_runner
x = torch.zeros(1 << 14, device="cuda")
if mode == "first":
    B = cap(lambda: x.mul_(2.0))
    print(f"extra graph before any replay: bs64 {t_ms(gr.graphs[64]):.3f}", flush=True)
elif mode == "upload":
    a0 = t_ms(gr.graphs[64])
    B = cap(lambda: x.mul_(2.0))
    a1 = t_ms(gr.graphs[64])
    r = upload(gr.graphs[64])
    a2 = t_ms(gr.graphs[64])
    rs = [upload(g) for g in gr.graphs.values()]
    a3 = t_ms(gr.graphs[64])
    print(f"bs64 {a0:.3f} -> extra {a1:.3f} -> upload rc {r} {a2:.3f} -> upload all {set(rs)} {a3:.3f}", flush=True)
elif mode == "recapture_all":
    a0 = t_ms(gr.graphs[64])
    B = cap(lambda: x.mul_(2.0))
    a1 = t_ms(gr.graphs[64])
    gr.graphs.clear(); gr.pool = None
    with torch.inference_mode():
        gr.capture()
    a2 = t_ms(gr.graphs[64])
    print(f"bs64 {a0:.3f} -> extra {a1:.3f} -> all recaptured {a2:.3f}", flush=True)
