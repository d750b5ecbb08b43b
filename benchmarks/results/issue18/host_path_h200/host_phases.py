"""Host time per scheduler phase (in-process scheduler, NGRAM k16, the copy prompts), and the
critical path from a verify step's result (its sync) to the next graph replay.
usage: MP=<gguf> NEW=256 python .devrun/host_phases.py cpu|cuda [ngram|none]"""
import os, sys, time, collections, statistics
os.environ.setdefault("RADIXLM_OVERLAP_ON_CPU", "1")
import torch
sys.path.insert(0, "tests")
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.sampling.params import SamplingParams
from radixlm.bench.spec import COPY
import radixlm.scheduler.scheduler as S
import radixlm.scheduler.schedule_batch as SB
import radixlm.scheduler.results as R
import radixlm.scheduler.launched_step as LS
from radixlm.scheduler import speculation as SP
from helpers import cpu_scheduler

dev = sys.argv[1]; algo = sys.argv[2] if len(sys.argv) > 2 else "ngram"
kw = dict(model_path=os.environ["MP"], device=dev)
if dev == "cuda":
    kw["attention_backend"] = "triton"
if algo == "ngram":
    kw.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=16)
sched = cpu_scheduler(ServerArgs(**kw), lambda m: None)
tok = sched.tokenizer
T = collections.defaultdict(float); N = collections.Counter()
stack = [0.0]          # time spent in excluded callees, per open frame
crit, state = [], {"v_end": None}
def wrap(owner, name, key, excl=False, hook=None):
    f = getattr(owner, name)
    def g(*a, **k):
        t = time.perf_counter(); stack.append(0.0)
        r = f(*a, **k)
        end = time.perf_counter(); dt = end - t
        inner = stack.pop()
        T[key] += dt - (0 if excl else inner); N[key] += 1
        stack[-1] += dt if excl else inner
        if hook: hook(end)
        return r
    setattr(owner, name, g)
def on_verified(end):
    if state["v_end"] is None:
        state["v_end"] = end
runner = sched.runner
if runner.graph_runner is not None:
    gr = runner.graph_runner
    f0 = gr.replay
    def rep(fb):
        if state["v_end"] is not None:
            crit.append(time.perf_counter() - state["v_end"]); state["v_end"] = None
        return f0(fb)
    gr.replay = rep
wrap(runner, "forward", "forward(launch)")
wrap(runner, "sample", "sample(launch)")
wrap(LS.LaunchedStep, "wait", "wait(sync)", excl=True)
wrap(LS.LaunchedStep, "verified", "verified(sync 1st)", excl=True, hook=on_verified)
wrap(R.ResultProcessor, "process", "process")
wrap(S.Scheduler, "_apply", "apply")
wrap(S.Scheduler, "next_batch", "next_batch")
wrap(SP.Speculator, "plan_step", "plan_step")
wrap(SP.NgramDrafter, "propose", "propose")
wrap(SB.ScheduleBatch, "prepare_decode", "prepare_decode")
wrap(S.Scheduler, "launch_sampling", "launch_sampling")
wrap(S.Scheduler, "launch_forward", "launch_forward")
new = int(os.environ.get("NEW", "256"))
for rep_ in range(int(os.environ.get("REPS", "2"))):
    T.clear(); N.clear(); crit.clear()
    v0 = sched.speculator.totals.verify_steps if sched.speculator else 0
    d0 = sched.decode_steps; t0 = time.time()
    for i, p in enumerate(COPY):
        sched.handle_message(TokenizedGenerateReq(rid=f"r{rep_}{i}", input_ids=[t % sched.runner.model_config.vocab_size for t in tok.encode(p)],
            sampling_params=SamplingParams(max_new_tokens=new, temperature=0)))
        while sched.has_work:
            sched.step()
    v1 = sched.speculator.totals.verify_steps if sched.speculator else 0
    print(f"== rep {rep_}: {time.time()-t0:.2f}s, decode steps {sched.decode_steps-d0}, verify {v1-v0}")
for k in sorted(T, key=lambda k: -T[k]):
    print(f"{k:20s} n={N[k]:5d} total={T[k]*1e3:8.1f} ms  per={T[k]/max(N[k],1)*1e6:7.1f} us")
if crit:
    c = sorted(crit)
    print(f"critical path verified->next replay: n={len(c)} median {statistics.median(c)*1e6:.0f} us, p25 {c[len(c)//4]*1e6:.0f}, p75 {c[3*len(c)//4]*1e6:.0f}")
