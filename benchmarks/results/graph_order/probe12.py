"""Graph slow state, round 7: why do the runner's 11 start-up captures stay fast when a toy
process goes slow at its 4th graph?"""
import os, sys, time
import torch
import torch.nn.functional as F

def t_ms(g, n=200):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

v = sys.argv[1]
if v == "runner":
    os.environ["RADIXLM_DISABLE_GEMV"] = "1"
    from radixlm.model_executor import cuda_graph_runner as C
    orig = C.CudaGraphRunner._capture_one
    log = []
    def traced(self, bs):
        orig(self, bs)
        first = self.graphs[max(self.graphs)]
        log.append(f"{bs}:{t_ms(first):.3f}")
    C.CudaGraphRunner._capture_one = traced
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[2], load_format="dummy",
        dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=64), radix=False)
    gr = runner.graph_runner
    print("runner: bs64 graph after each capture:", " ".join(log))
    print("  every graph at the end:", " ".join(f"{b}:{t_ms(g):.3f}" for b, g in sorted(gr.graphs.items())))
    print("  cuda graphs instantiated before the first capture? torch graphs alive:",
          sum(1 for o in __import__('gc').get_objects() if isinstance(o, torch.cuda.CUDAGraph)))
else:
    from radixlm.layers.kernels import norm_kernels
    h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(28)]
    def mixed(n):
        z = h[:n]
        for w in ws:
            z = F.silu(z + F.linear(norm_kernels.rms_norm(z, nw, 1e-6, None), w))
        return z
    graphs, pool, log = {}, None, []
    with torch.inference_mode():
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for n in (64, 56, 48, 40, 32, 24, 16, 8, 4, 2, 1):
                mixed(n); torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=torch.cuda.current_stream()):
                    out = mixed(n)
                if pool is None:
                    pool = g.pool()
                graphs[n] = (g, out)
                if v == "toy_timed":
                    log.append(f"{n}:{t_ms(graphs[64][0]):.4f}")
        torch.cuda.current_stream().wait_stream(s)
    print(f"{v}: first graph after each capture:", " ".join(log))
    print("  every graph at the end:", " ".join(f"{b}:{t_ms(g):.4f}" for b, (g, _) in sorted(graphs.items())))
