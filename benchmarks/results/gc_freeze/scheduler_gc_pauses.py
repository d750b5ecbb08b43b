"""The cycle collector's passes inside the scheduler's loop, with and without the start-up
freeze (utils/gc_freeze.py): an in-process Scheduler on the bundled model serves 3,000 short
requests (12 prompt tokens, 4 out, 64 at a time); gc.callbacks time every pass.

    python scheduler_gc_pauses.py MODEL_PATH [--freeze] [--device cpu]
"""
import argparse
import gc
import json
import time

from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import load_tokenizer, resolve_model_dir
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler
from radixlm.utils.gc_freeze import freeze_startup_heap

p = argparse.ArgumentParser()
p.add_argument("model_path")
p.add_argument("--freeze", action="store_true")
p.add_argument("--device", default=None)
p.add_argument("--requests", type=int, default=3000)
ns = p.parse_args()
base = ServerArgs(model_path=ns.model_path, device=ns.device, max_total_tokens=65536)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
hf_dir, _ = resolve_model_dir(ns.model_path, "auto")
tok = load_tokenizer(hf_dir)
prompts = [tok.encode(f"({i}) Write a few sentences about the sea.")[:12] for i in range(256)]
s = Scheduler(SchedulerConfig.from_server_args(base), runner, kv, lambda t: [], lambda m: None,
              tokenizer=tok)
frozen = freeze_startup_heap() if ns.freeze else 0
passes = {g: [] for g in range(3)}
started = [0.0]


def on_gc(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        passes[info["generation"]].append(time.perf_counter() - started[0])


gc.callbacks.append(on_gc)
t0, steps, n = time.perf_counter(), 0, 0
longest_step = 0.0
while n < ns.requests or s.has_work:
    while len(s.waiting) + len(s.running) < 64 and n < ns.requests:
        s.handle_message(TokenizedGenerateReq(
            rid=f"r{n}", input_ids=prompts[n % len(prompts)],
            sampling_params=SamplingParams(max_new_tokens=4, temperature=0)))
        n += 1
    t = time.perf_counter()
    s.step()
    longest_step = max(longest_step, time.perf_counter() - t)
    steps += 1
out = {"freeze": ns.freeze, "frozen_objects": frozen, "requests": n, "steps": steps,
       "seconds": round(time.perf_counter() - t0, 1),
       "longest_step_ms": round(longest_step * 1e3, 1),
       "passes": {g: {"count": len(v), "total_ms": round(sum(v) * 1e3, 1),
                      "longest_ms": round(max(v, default=0) * 1e3, 1)}
                  for g, v in passes.items()}}
print(json.dumps(out))
