"""Graph slow state, round 8: per-graph replay time against capture order and graph count."""
import os, sys, time
import torch

def t_ms(g, n=200):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

order, max_bs = sys.argv[2], int(sys.argv[3])
if sys.argv[4] == "off":
    os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor import cuda_graph_runner as C
if order == "ascending":
    @torch.inference_mode()
    def capture(self):
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in self.batch_sizes:
                self._capture_one(bs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
    C.CudaGraphRunner.capture = capture
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=max_bs), radix=False)
gr = runner.graph_runner
print(f"{os.path.basename(sys.argv[1])} {order} max_bs {max_bs} gemv {sys.argv[4]}:",
      " ".join(f"{b}:{t_ms(g):.3f}" for b, g in sorted(gr.graphs.items())), flush=True)
