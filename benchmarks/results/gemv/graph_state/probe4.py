import os, sys, time
import torch
if sys.argv[2] == "off":
    os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=int(sys.argv[3])), radix=False)
def replay_ms(g, n=400):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3
gs = runner.graph_runner.graphs
print(sys.argv[1].split("/")[-1], "gemv", sys.argv[2], " ".join(f"bs{b} {replay_ms(gs[b]):.3f}" for b in (64, 8, 1) if b in gs), flush=True)
