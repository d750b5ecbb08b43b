"""The host ops on a verify step's critical path (its result's sync -> the next graph replay),
from torch.profiler (CPU side), on the in-process scheduler; plus micro-costs of variants.
usage: MP=<gguf> python .devrun/crit_ops.py"""
import os, sys, time, collections, statistics
import torch
sys.path.insert(0, "tests")
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.sampling.params import SamplingParams
from radixlm.bench.spec import COPY
import radixlm.scheduler.launched_step as LS
from helpers import cpu_scheduler
from torch.autograd.profiler import record_function

sched = cpu_scheduler(ServerArgs(model_path=os.environ["MP"], device="cuda", attention_backend="triton",
                                 speculative_algorithm="NGRAM", speculative_num_draft_tokens=16), lambda m: None)
tok = sched.tokenizer
state = {"rf": None, "on": False}
fv = LS.LaunchedStep.verified
def verified(self, row):
    first = self._verify_copied is not None
    r = fv(self, row)
    if first and state["on"] and state["rf"] is None:
        state["rf"] = record_function("CRIT"); state["rf"].__enter__()
    return r
LS.LaunchedStep.verified = verified
gr = sched.runner.graph_runner; f0 = gr.replay
def rep(fb):
    if state["rf"] is not None:
        state["rf"].__exit__(None, None, None); state["rf"] = None
    return f0(fb)
gr.replay = rep
def run(new, tag):
    for i, p in enumerate(COPY):
        sched.handle_message(TokenizedGenerateReq(rid=f"{tag}{i}", input_ids=tok.encode(p),
            sampling_params=SamplingParams(max_new_tokens=new, temperature=0)))
        while sched.has_work:
            sched.step()
run(128, "w")
from torch.profiler import profile, ProfilerActivity
state["on"] = True
with profile(activities=[ProfilerActivity.CPU], with_stack=False) as prof:
    run(256, "p")
state["on"] = False
ev = prof.events()
crit = [e for e in ev if e.name == "CRIT"]
print("crit ranges", len(crit), "median us", statistics.median(e.cpu_time_total for e in crit))
ids = {e.id for e in crit}
agg = collections.defaultdict(lambda: [0, 0.0])
for e in ev:
    if e.cpu_parent is not None and e.cpu_parent.id in ids:
        agg[e.name][0] += 1; agg[e.name][1] += e.cpu_time_total
n = len(crit)
tot = 0
for name, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    tot += t
    print(f"{name:45s} calls/step {c/n:5.2f}  us/step {t/n:7.1f}  us/call {t/c:6.1f}")
print(f"ops total us/step {tot/n:.1f}")

# micro-costs
dev = torch.device("cuda")
vals = list(range(60))
def t(f, n=2000):
    for _ in range(100): f()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): f()
    e = time.perf_counter(); torch.cuda.synchronize()
    return (e - s) / n * 1e6
from radixlm.utils.device import to_device
x = torch.zeros(100, dtype=torch.int64, device=dev)
idx = torch.arange(10, device=dev)
v = torch.ones(10, dtype=torch.int64, device=dev)
table = torch.zeros(64, 4096, dtype=torch.int32, device=dev)
res = {
 "to_device(60)": t(lambda: to_device(vals, torch.int64, dev)),
 "tensor(pin_memory=True).to": t(lambda: torch.tensor(vals, dtype=torch.int64, pin_memory=True).to(dev, non_blocking=True)),
 "tensor().to(non_blocking) pageable": t(lambda: torch.tensor(vals, dtype=torch.int64).to(dev, non_blocking=True)),
 "slice x[:10]": t(lambda: x[:10]),
 "split 6": t(lambda: x.split([10, 10, 10, 10, 10, 50])),
 "index x[idx]": t(lambda: x[idx]),
 "index_put x[idx]=v": t(lambda: x.__setitem__(idx, v)),
 "index_put_ (accumulate=False)": t(lambda: x.index_put_((idx,), v)),
 "2d index_put table[a,b]=v32": t(lambda: table.__setitem__((idx, idx), v.to(torch.int32))),
 "to(int32)": t(lambda: v.to(torch.int32)),
 "cat 2": t(lambda: torch.cat([x, v])),
 "event record": t(lambda: torch.cuda.Event().record()),
 "empty pinned 60": t(lambda: torch.empty(60, dtype=torch.int64, pin_memory=True)),
}
for k, val in res.items():
    print(f"{k:40s} {val:6.1f} us")
