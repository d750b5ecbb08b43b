"""Host time of cudaGraphLaunch (graph.replay) without a profiler, and the decode step's wall
time against its kernel time under a CUDA-only profiler."""
import statistics, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler
from radixlm.utils.gpu_activity import busy_and_span, kernel_intervals

model, bs, inp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = ServerArgs(model_path=model, load_format="dummy", dtype="bfloat16", tokenizer_path=model,
                  max_running_requests=bs, max_total_tokens=bs * (inp + 400) + 256)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
sched = Scheduler(SchedulerConfig.from_server_args(base), runner, kv, lambda t: [], lambda m: None)
gen = torch.Generator().manual_seed(0)
for i in range(bs):
    ids = torch.randint(0, runner.model_config.vocab_size, (inp,), generator=gen).tolist()
    sched.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams(
        max_new_tokens=360, temperature=0, ignore_eos=True)))
while sched.waiting or len(sched.running) < bs:
    sched.step()
for _ in range(20):
    sched.step()
host = []
orig = torch.cuda.CUDAGraph.replay
def timed_replay(self):
    t = time.perf_counter(); orig(self); host.append((time.perf_counter() - t) * 1e6)
torch.cuda.CUDAGraph.replay = timed_replay
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(100):
    sched.step()
torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 100 * 1e6
print(f"{model} bs {bs}: step wall {wall:.0f} us unprofiled; graph.replay host median {statistics.median(host):.1f} us, max {max(host):.1f}")
host.clear()
for acts, tag in (([ProfilerActivity.CUDA], "cuda-only"), ([ProfilerActivity.CPU, ProfilerActivity.CUDA], "cpu+cuda")):
    torch.cuda.synchronize(); t = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(40):
            sched.step()
        torch.cuda.synchronize()
    pwall = (time.perf_counter() - t) / 40 * 1e6
    busy, span = busy_and_span(kernel_intervals(prof))
    print(f"  {tag} profiler: step wall {pwall:.0f} us, kernel busy {busy / 40:.0f} us a step, idle {1 - busy / span:.1%}; "
          f"graph.replay host median {statistics.median(host):.1f} us; busy / unprofiled wall {busy / 40 / wall:.3f}")
    host.clear()
