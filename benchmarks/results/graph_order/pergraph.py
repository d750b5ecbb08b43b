"""Every graph's replay time and the graph pool's memory, for one capture order."""
import os, sys, time
import torch

def t_ms(g, n=200):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor import cuda_graph_runner as C
if sys.argv[3] == "descending":
    @torch.inference_mode()
    def desc(self):
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.batch_sizes):
                self._capture_one(bs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
    C.CudaGraphRunner.capture = desc
if len(sys.argv) > 4 and sys.argv[4] == "per_graph_logits":
    def capture_one(self, bs):
        fb = self._static_batch(bs)
        self._run_static(fb)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.current_stream()):
            logits = self._run_static(fb)
        self.graphs[bs] = graph
        self.__dict__.setdefault("kept", {})[bs] = logits
    C.CudaGraphRunner._capture_one = capture_one
orig = C.CudaGraphRunner.capture
mem = {}
def capture(self):
    torch.cuda.synchronize(); mem["before"] = torch.cuda.memory_reserved()
    orig(self)
    torch.cuda.synchronize(); mem["after"] = torch.cuda.memory_reserved()
C.CudaGraphRunner.capture = capture
max_bs = int(sys.argv[2])
runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=max_bs), radix=False)
gr = runner.graph_runner
print(f"{os.path.basename(sys.argv[1])} [{sys.argv[3:]}] graph pool "
      f"{(mem['after'] - mem['before']) / 2**20:.0f} MiB; ms a replay:",
      " ".join(f"{b}:{t_ms(g):.3f}" for b, g in sorted(gr.graphs.items())), flush=True)
