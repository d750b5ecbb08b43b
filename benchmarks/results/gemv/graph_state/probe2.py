"""After the graphs are captured (GEMV off): time the bs-64 graph; launch one GEMV variant
eagerly (no graph) once; time again. Prints the variant's registers / spills / shared memory."""
import os, sys, time
import torch
os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.layers.kernels import gemv_kernels as G

runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=64), radix=False)
g64 = runner.graph_runner.graphs[64]

def replay_ms(n=400):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g64.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

print(f"before: {replay_ms():.3f} {replay_ms():.3f} ms", flush=True)
for spec in sys.argv[2:]:
    bn, bk, n, k = map(int, spec.split(","))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    t = G.GemvTiles(bn, bk)
    y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    c = G._gemv_kernel[(triton_cdiv := -(-n // bn),)](x, w, w, y, n, w.stride(0), K=k, HAS_BIAS=False,
        BLOCK_N=bn, BLOCK_K=bk, num_warps=t.num_warps, num_stages=t.num_stages)
    torch.cuda.synchronize()
    print(f"ran gemv bn={bn} bk={bk} N={n} K={k}: regs {c.n_regs} spills {c.n_spills} "
          f"shared {c.metadata.shared} -> {replay_ms():.3f} {replay_ms():.3f} ms", flush=True)
