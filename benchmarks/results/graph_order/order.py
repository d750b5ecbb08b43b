"""Run a module with the CUDA graphs captured in a chosen order: order.py ORDER -m MODULE ARGS...
ORDER is `ascending` (the committed code) or `descending` (the code before it)."""
import runpy, sys
import torch
from radixlm.model_executor import cuda_graph_runner as C

order = sys.argv[1]
assert sys.argv[2] == "-m"
if order == "descending":
    @torch.inference_mode()
    def capture(self):
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.batch_sizes):
                self._capture_one(bs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
    C.CudaGraphRunner.capture = capture
else:
    assert order == "ascending"
mod = sys.argv[3]
sys.argv = [mod] + sys.argv[4:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
