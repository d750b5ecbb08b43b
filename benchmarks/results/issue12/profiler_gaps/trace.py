"""Where the gap between the graph's input copy and its first kernel comes from: CPU runtime
calls around each device gap > 10 us, overlap on, a few steps."""
import argparse, dataclasses, sys
import torch
from torch.profiler import ProfilerActivity, profile
import radixlm.bench.overlap as ov
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler

model, bs, inp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = ServerArgs(model_path=model, load_format="dummy", dtype="bfloat16", tokenizer_path=model,
                  max_running_requests=bs, max_total_tokens=bs * (inp + 200) + 256)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
sched = Scheduler(SchedulerConfig.from_server_args(base), runner, kv, lambda t: [], lambda m: None)
gen = torch.Generator().manual_seed(0)
for i in range(bs):
    ids = torch.randint(0, runner.model_config.vocab_size, (inp,), generator=gen).tolist()
    sched.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams(
        max_new_tokens=150, temperature=0, ignore_eos=True)))
while sched.waiting or len(sched.running) < bs:
    sched.step()
for _ in range(30):
    sched.step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(6):
        sched.step()
    torch.cuda.synchronize()
evs = list(prof.events())
dev = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs
             if e.device_type == torch.autograd.DeviceType.CUDA)
cpu = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs
             if e.device_type != torch.autograd.DeviceType.CUDA and e.name.startswith("cuda"))
t0 = dev[0][0]
cur_end, cur_name = dev[0][1], dev[0][2]
shown = 0
for s, e, n in dev[1:]:
    gap = s - cur_end
    if gap > 10 and shown < 8:
        shown += 1
        print(f"\nGAP {gap:.1f} us at {cur_end - t0:.1f}: after {cur_name[:70]} / before {n[:70]}")
        for cs, ce, cn in cpu:
            if ce > cur_end - 80 and cs < s + 5:
                print(f"   cpu {cs - t0:9.1f} .. {ce - t0:9.1f} ({ce - cs:6.1f} us) {cn[:60]}")
    if e > cur_end:
        cur_end, cur_name = e, n
# host-side: durations of graph launches
gl = [ce - cs for cs, ce, cn in cpu if cn == "cudaGraphLaunch"]
print("\ncudaGraphLaunch host us:", [round(x, 1) for x in gl])
syncs = [(cn, round(ce - cs, 1)) for cs, ce, cn in cpu if "ynchronize" in cn]
print("syncs:", syncs[:20])
