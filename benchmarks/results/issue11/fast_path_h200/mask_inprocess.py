"""Issue 11 diagnosis: in-process scheduler, mask-overhead workload (bs x tokens, MASK_REGEX,
min_new_tokens), per-variant step times, per-phase host time, rejections per request, finish
times of the unconstrained requests in the mixed batch, GC pauses, GPU busy."""
import collections, dataclasses, functools, gc, json, statistics, sys, time
import torch
from radixlm.bench.structured import MASK_REGEX, MASK_TOPICS
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq, BatchReqOutput
from radixlm.model_executor.model_runner import create_runner_and_kv, ModelRunner
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import load_tokenizer, resolve_model_dir
from radixlm.sampling.params import SamplingParams
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.penalties import LogitAdjustments
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler
from radixlm.scheduler.results import ResultProcessor
from radixlm.scheduler.launched_step import LaunchedStep
from radixlm.scheduler.step_sampling import StepSampling
from radixlm.scheduler.schedule_batch import ScheduleBatch
from radixlm.scheduler.grammar_sampling import MaskedResampler
from radixlm.utils.gpu_activity import busy_and_span, kernel_intervals

import os
import radixlm.scheduler.grammar_sampling as gsmod
if os.environ.get("REDRAW") is not None:
    gsmod.REDRAW_CANDIDATES = int(os.environ["REDRAW"])
MP = sys.argv[1] or None
BS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
TOK = int(sys.argv[3]) if len(sys.argv) > 3 else 64
REPS = int(sys.argv[4]) if len(sys.argv) > 4 else 8
OUT = sys.argv[5] if len(sys.argv) > 5 else None
cuda = torch.cuda.is_available()
sync = torch.cuda.synchronize if cuda else (lambda: None)

acc = collections.defaultdict(float)
cnt = collections.Counter()
def timed(cls, name):
    raw = cls.__dict__[name]
    is_cm = isinstance(raw, classmethod)
    fn = raw.__func__ if is_cm else raw
    @functools.wraps(fn)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[f"{cls.__name__}.{name}"] += time.perf_counter() - t
            cnt[f"{cls.__name__}.{name}"] += 1
    setattr(cls, name, classmethod(w) if is_cm else w)
for c, n in [(Scheduler, "launch_forward"), (Scheduler, "launch_sampling"), (Scheduler, "next_batch"),
             (Scheduler, "_apply"), (ResultProcessor, "process"), (ResultProcessor, "_check_unmasked"),
             (LaunchedStep, "wait"), (StepSampling, "build"), (StepSampling, "_grammar_mask"),
             (SamplingBatchInfo, "build"), (LogitAdjustments, "build"), (MaskedResampler, "resample"),
             (ModelRunner, "forward"), (ModelRunner, "sample"), (ScheduleBatch, "prepare_decode"),
             (ResultProcessor, "_advance_grammar"), (ResultProcessor, "_adopt_redrawn")]:
    try:
        timed(c, n)
    except KeyError as e:
        print("no", c, n)

gc_pauses = []
_gc_t = [0.0]
def _gc_cb(phase, info):
    if phase == "start":
        _gc_t[0] = time.perf_counter()
    else:
        gc_pauses.append((info["generation"], time.perf_counter() - _gc_t[0]))
gc.callbacks.append(_gc_cb)

base = ServerArgs(model_path=MP, attention_backend="triton" if cuda else "torch_native",
                  max_total_tokens=65536, device=None if cuda else "cpu", disable_jump_forward=True)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
hf_dir, _ = resolve_model_dir(MP, "auto")
tok = load_tokenizer(hf_dir)
prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"({i + 1}) Write a few sentences about {MASK_TOPICS[i % 5]}."}], tokenize=False, add_generation_prompt=True), add_special_tokens=False) for i in range(BS)]

def params_for(variant, i):
    if variant == "U0":
        return SamplingParams(max_new_tokens=TOK, temperature=0, ignore_eos=True)
    regex = None
    if variant in ("C", "K") or (variant == "M" and i % 2):
        regex = MASK_REGEX
    return SamplingParams(max_new_tokens=TOK, min_new_tokens=TOK, temperature=0, regex=regex)

def run(variant, prof=False):
    kv.flush()
    args = dataclasses.replace(base, disable_optimistic_grammar=(variant == "K"))
    finish_t = {}
    def send(msg):
        if isinstance(msg, BatchReqOutput):
            now = time.perf_counter()
            for o in msg.outputs:
                if o.finish_reason is not None:
                    finish_t[o.rid] = now
    s = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda t: [], send, tokenizer=tok)
    for i, ids in enumerate(prompts):
        s.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=params_for(variant, i)))
    while any(r.grammar_future is not None and not r.grammar_future.done() for r in s.waiting):
        time.sleep(0.01)
    reqs = list(s.waiting)
    acc.clear(); cnt.clear(); gc_pauses.clear()
    step_ms = []
    sync(); t0 = time.perf_counter()
    p = None
    if prof:
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]); p.__enter__()
    while s.has_work:
        a = time.perf_counter(); s.step(); step_ms.append(1e3 * (time.perf_counter() - a))
    sync(); sec = time.perf_counter() - t0
    res = dict(variant=variant, ms=round(sec * 1e3, 2), steps=len(step_ms),
               rejections=s.grammar_rejections,
               rej_per_req=collections.Counter(r.grammar_rejections for r in reqs),
               step_ms_med=round(statistics.median(step_ms), 3),
               step_ms_p90=round(sorted(step_ms)[int(0.9 * len(step_ms))], 3),
               step_ms_max=round(max(step_ms), 3),
               gc=[(g, round(1e3 * d, 2)) for g, d in gc_pauses if d > 0.0005],
               phases_ms_per_step={k: round(1e3 * v / len(step_ms), 4) for k, v in sorted(acc.items())},
               calls=dict(cnt))
    fin = [finish_t.get(f"r{i}", float("nan")) - t0 for i in range(BS)]
    res["finish_ms_unconstrained_rows"] = round(1e3 * statistics.median([fin[i] for i in range(BS) if params_for(variant, i).regex is None]), 2) if any(params_for(variant, i).regex is None for i in range(BS)) else None
    res["finish_ms_max"] = round(1e3 * max(fin), 2)
    if p is not None:
        p.__exit__(None, None, None)
        busy, span = busy_and_span(kernel_intervals(p))
        res["gpu_busy_ms"] = round(busy / 1e3, 2); res["gpu_span_ms"] = round(span / 1e3, 2)
    return res

variants = os.environ.get("VARIANTS", "U0,U,C,M,K").split(",")
for v in variants:
    run(v)  # warm-up
results = collections.defaultdict(list)
for rep in range(REPS):
    for v in variants:
        r = run(v)
        results[v].append(r)
        print(rep, json.dumps({k: r[k] for k in ("variant", "ms", "steps", "rejections", "step_ms_med", "step_ms_p90", "step_ms_max", "finish_ms_unconstrained_rows", "finish_ms_max", "gc")}), flush=True)
summary = {}
for v in variants:
    ms = [r["ms"] for r in results[v]]
    summary[v] = dict(ms_median=statistics.median(ms), ms_min=min(ms), ms_max=max(ms),
                      per_token_ms_median=statistics.median(ms) / TOK,
                      finish_unconstrained_median=statistics.median([r["finish_ms_unconstrained_rows"] for r in results[v]]) if results[v][0]["finish_ms_unconstrained_rows"] is not None else None)
base_ms = summary[variants[0]]["ms_median"]
for v in variants:
    summary[v]["vs_U"] = round(summary[v]["ms_median"] / base_ms - 1, 4)
print(json.dumps(summary, indent=1))
print("phases (median-ms run of each variant):")
for v in variants:
    rs = sorted(results[v], key=lambda r: r["ms"])[len(results[v]) // 2]
    print(v, rs["steps"], dict(rs["rej_per_req"]), json.dumps(rs["phases_ms_per_step"]))
prof = {v: run(v, prof=cuda) for v in variants}
for v, r in prof.items():
    print("profiled", v, r["ms"], "busy", r.get("gpu_busy_ms"), "span", r.get("gpu_span_ms"))
if OUT:
    json.dump(dict(summary=summary, runs=results, profiled=prof), open(OUT, "w"), indent=1, default=str)
