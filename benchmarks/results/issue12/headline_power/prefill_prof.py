# Kernel table of one headline prefill batch (Llama-3.2-1B shape, 4 x 4096 new tokens).
import json, os, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from radixlm.bench.one_batch import EngineRun
from radixlm.config import ServerArgs
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig

model = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/configs/llama-3.2-1b"
bs, n = 4, 4096
sa = ServerArgs(model_path=model, load_format="dummy", dtype="bfloat16", device="cuda",
                max_total_tokens=bs * (n + 8) + 64, max_running_requests=bs, context_length=n + 16,
                disable_cuda_graph=True)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(sa), radix=False)
prompts = torch.randint(0, runner.model_config.vocab_size, (bs, n), generator=torch.Generator().manual_seed(0))
for i in range(4):
    r = EngineRun(runner, kv, prompts, 2, bs)
    torch.cuda.synchronize(); t = time.perf_counter()
    if i == 3:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            r.prefill(); torch.cuda.synchronize()
    else:
        r.prefill(); torch.cuda.synchronize()
    print("prefill wall ms", (time.perf_counter() - t) * 1e3, flush=True)
    r.release()
ks = [e for e in prof.key_averages() if e.device_time_total > 0]
ks.sort(key=lambda e: -e.device_time_total)
tot = sum(e.device_time_total for e in ks)
print(f"GPU total {tot/1e3:.1f} ms")
rows = []
for e in ks[:30]:
    rows.append(dict(name=e.key[:110], count=e.count, ms=e.device_time_total / 1e3))
    print(f"{e.device_time_total/1e3:8.2f} ms {e.count:5d}  {e.key[:110]}")
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(dict(model=model, gpu_total_ms=tot / 1e3, kernels=rows), open(os.path.join(os.environ.get("OUT", "/tmp"), "prefill_prof.json"), "w"), indent=1)
# 64 back-to-back prefills of 16k tokens (the headline's 1M prompt tokens): per-prefill GPU time
# by events, with the SM clock and power sampled by nvidia-smi alongside.
import subprocess
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                        "--format=csv,noheader", "-lms", "100"],
                       stdout=open(os.path.join(os.environ.get("OUT", "/tmp"), "smi.csv"), "w"))
time.sleep(1.0)
ms = []
for rep in range(64):
    r = EngineRun(runner, kv, prompts, 2, bs)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); r.prefill(); b.record(); b.synchronize()
    ms.append(a.elapsed_time(b)); r.release()
smi.terminate()
print("sustained prefill ms (64 x 16k tokens):", [round(x, 1) for x in ms])
json.dump(dict(sustained_ms=ms), open(os.path.join(os.environ.get("OUT", "/tmp"), "sustained.json"), "w"))
