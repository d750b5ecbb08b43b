"""Does capturing the batch-1 graph with the Triton GEMV slow down the process afterwards?
One process: graphs captured with the GEMV off; time bs-64 replays and a host loop; re-capture
the bs-1 graph with the GEMV on; time again; then off again."""
import os, sys, time
import torch
first_on = len(sys.argv) > 2 and sys.argv[2] == "on"
if not first_on:
    os.environ["RADIXLM_DISABLE_GEMV"] = "1"
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig

runner, kv = create_runner_and_kv(RunnerConfig(model_path=sys.argv[1], load_format="dummy",
    dtype="bfloat16", device="cuda", max_total_tokens=65536, cuda_graph_max_bs=64), radix=False)
gr = runner.graph_runner
g64 = gr.graphs[64]

def replay_ms(n=400):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        g64.replay()
    torch.cuda.synchronize()
    gpu = (time.perf_counter() - t) / n * 1e3
    t = time.perf_counter()
    for _ in range(n):
        g64.replay()
        torch.cuda.synchronize()
    synced = (time.perf_counter() - t) / n * 1e3
    return gpu, synced

def host_us(n=20000):
    a = torch.zeros(64, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        a.add_(1)
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    t = time.perf_counter()
    x = [i * 2 for i in range(2_000_000)]
    py = time.perf_counter() - t
    return host, py

def report(tag):
    for _ in range(2):
        g, s = replay_ms(); h, p = host_us()
        print(f"{tag:28s} bs64 replay {g:.3f} ms, replay+sync {s:.3f} ms, add_ launch {h:.2f} us, python {p*1e3:.1f} ms", flush=True)

def recapture(on):
    if on:
        os.environ.pop("RADIXLM_DISABLE_GEMV", None)
    else:
        os.environ["RADIXLM_DISABLE_GEMV"] = "1"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(s):
        gr._capture_one(1)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

report(f"captured with gemv {'on' if first_on else 'off'}")
recapture(not first_on)
report(f"bs1 recaptured, gemv {'off' if first_on else 'on'}")
recapture(first_on)
report(f"bs1 recaptured, gemv {'on' if first_on else 'off'}")
