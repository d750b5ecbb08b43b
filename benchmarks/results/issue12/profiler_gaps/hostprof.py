"""cProfile of the scheduler's step (overlap on, CUDA graphs) for a small model at batch 1: where
the host's per-step time goes when it is longer than the GPU's."""
import cProfile, pstats, sys, time
import torch
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler
model, bs, inp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = ServerArgs(model_path=model, load_format="dummy", dtype="bfloat16", tokenizer_path=model,
                  max_running_requests=bs, max_total_tokens=bs * (inp + 700) + 256)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
sched = Scheduler(SchedulerConfig.from_server_args(base), runner, kv, lambda t: [], lambda m: None)
gen = torch.Generator().manual_seed(0)
for i in range(bs):
    ids = torch.randint(0, runner.model_config.vocab_size, (inp,), generator=gen).tolist()
    sched.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams(
        max_new_tokens=650, temperature=0, ignore_eos=True)))
while sched.waiting or len(sched.running) < bs:
    sched.step()
for _ in range(20):
    sched.step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(200):
    sched.step()
torch.cuda.synchronize(); print(f"unprofiled step {(time.perf_counter() - t) / 200 * 1e6:.0f} us")
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
for _ in range(300):
    sched.step()
pr.disable()
print(f"cProfiled step {(time.perf_counter() - t) / 300 * 1e6:.0f} us")
st = pstats.Stats(pr)
st.sort_stats("cumulative").print_stats(70)
st.sort_stats("tottime").print_stats(40)
