"""Graph slow state, round 4: which ingredient of the model process makes a later capture slow
down earlier graphs: memory footprint, graph count, or the kernel mix?"""
import os, sys, time
import torch
import torch.nn.functional as F

def t_ms(g, n=300):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

def cap(fn, pool=None):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s, pool=pool):
            fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    return g

mode = sys.argv[1]
y = torch.zeros(1 << 14, device="cuda")
if mode == "mixed" or mode == "mixed_many" or mode == "mixed_mem":
    from radixlm.layers.kernels import norm_kernels
    if mode == "mixed_mem":
        big = torch.empty(int(sys.argv[2]) << 30, dtype=torch.uint8, device="cuda"); big.fill_(0)
    h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(28)]
    def chain():
        z = h
        for w in ws:
            a = norm_kernels.rms_norm(z, nw, 1e-6, None)
            b = F.linear(a, w)
            z = z + b
            z = torch.nn.functional.silu(z)
        return z
    A = cap(chain)
    a0 = t_ms(A)
    extra = []
    if mode == "mixed_many":
        for i in range(11):
            extra.append(cap(chain, A.pool()))
        a0b = t_ms(A)
        print(f"mixed: A {a0:.4f}, after 11 more like it {a0b:.4f}", flush=True)
    B = cap(lambda: y.mul_(2.0))
    print(f"{mode}: A {a0:.4f} -> after B {t_ms(A):.4f} ms", flush=True)
elif mode == "model":
    os.environ["RADIXLM_DISABLE_GEMV"] = "1"
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    tokens, max_bs = int(sys.argv[3]), int(sys.argv[4])
    runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[2], load_format="dummy",
        dtype="bfloat16", device="cuda", max_total_tokens=tokens, cuda_graph_max_bs=max_bs),
        radix=False)
    g = runner.graph_runner.graphs[max_bs]
    a0 = t_ms(g)
    B = cap(lambda: y.mul_(2.0))
    print(f"model kv {tokens} max_bs {max_bs} ({len(runner.graph_runner.graphs)} graphs): "
          f"bs{max_bs} {a0:.3f} -> after B {t_ms(g):.3f} ms", flush=True)
