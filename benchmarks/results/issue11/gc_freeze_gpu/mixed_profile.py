# The in-process scheduler profile of static_masks/inprocess_profile.py with a third variant,
# "mixed" (every other request constrained, as bench structured's half-constrained figure): ms a
# step over alternated runs at bs 64 and 256 (no engine processes, no prefill in the figure's
# noise), then cProfile of one run of each and the functions where mixed spends more than
# all-constrained.
import cProfile, io, pstats, sys, time, re
import torch
from radixlm.bench.structured import MASK_REGEX, MASK_TOPICS
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import load_tokenizer, resolve_model_dir
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler
MP = sys.argv[1]; OUT = sys.argv[2]
base = ServerArgs(model_path=MP, attention_backend="triton", max_total_tokens=65536)
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
hf_dir, _ = resolve_model_dir(MP, "auto")
tok = load_tokenizer(hf_dir)
prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"({i + 1}) Write a few sentences about {MASK_TOPICS[i % 5]}."}], tokenize=False, add_generation_prompt=True), add_special_tokens=False) for i in range(256)]
from radixlm.utils.gc_freeze import freeze_startup_heap
freeze_startup_heap()  # as the scheduler process does once started
def run(constrained, n, prof=None):
    kv.flush()
    s = Scheduler(SchedulerConfig.from_server_args(base), runner, kv, lambda t: [], lambda m: None, tokenizer=tok)
    for i, ids in enumerate(prompts[:n]):
        s.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams(
            max_new_tokens=64, min_new_tokens=64, temperature=0, regex=MASK_REGEX if (constrained is True or (constrained == "mixed" and i % 2)) else None)))
    while any(r.grammar_future is not None and not r.grammar_future.done() for r in s.waiting): time.sleep(0.01)
    torch.cuda.synchronize(); t0 = time.perf_counter(); steps = 0
    if prof: prof.enable()
    while s.has_work:
        s.step(); steps += 1
    if prof: prof.disable()
    torch.cuda.synchronize()
    return dict(c=constrained, n=n, ms_per_step=round((time.perf_counter() - t0) / steps * 1e3, 3), steps=steps, rej=s.grammar_rejections)
for n in (64, 256):
    run(True, n); run(False, n); run("mixed", n)
    for rep in range(4):
        print(run(False, n), run(True, n), run("mixed", n), flush=True)
def load(pr):
    st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(80)
    d = {}
    for line in st.getvalue().splitlines():
        m = re.match(r"\s*(\d+)(?:/\d+)?\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+(.*)", line)
        if m: d[m.group(4)] = (int(m.group(1)), float(m.group(2)))
    return d, st.getvalue()
res = {}
for c in (False, True, "mixed"):
    pr = cProfile.Profile(); print(run(c, 64, pr)); res[c] = load(pr)
    open(f"{OUT}/prof_{c}.txt", "w").write(res[c][1])
a, b = res[True][0], res["mixed"][0]
print("mixed minus constrained, tottime s over one 64-step run")
for k in sorted(set(a) | set(b), key=lambda k: -(b.get(k, (0, 0))[1] - a.get(k, (0, 0))[1]))[:35]:
    print(f"{b.get(k,(0,0))[1]-a.get(k,(0,0))[1]:8.4f} constrained {a.get(k,(0,0))} mixed {b.get(k,(0,0))} {k[:120]}")
