"""Scheduler-only (in-process) timing of the mask-overhead workload of `bench structured`:
64 requests x 64 tokens under MASK_REGEX (min_new_tokens = 64), unconstrained vs constrained
(optimistic with several rejection policies, and masked), steps, rejections, cProfile."""
import cProfile, dataclasses, io, pstats, sys, time
import torch
import radixlm.scheduler.results as results_mod
from radixlm.bench.structured import MASK_REGEX, MASK_TOPICS
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import load_tokenizer, resolve_model_dir
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler
from radixlm.scheduler import grammar_sampling as gs

MP = (sys.argv[1] or None) if len(sys.argv) > 1 else None
BS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
cuda = torch.cuda.is_available()
sync = torch.cuda.synchronize if cuda else (lambda: None)
base = ServerArgs(model_path=MP, attention_backend="triton" if cuda else "torch_native",
                  max_total_tokens=65536, device=None if cuda else "cpu")
runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
hf_dir, _ = resolve_model_dir(MP, "auto")
tok = load_tokenizer(hf_dir)
prompts = [tok.apply_chat_template([{"role": "user", "content": f"({i + 1}) Write a few sentences about {MASK_TOPICS[i % 5]}."}], tokenize=False, add_generation_prompt=True) for i in range(256)]
prompts = [tok.encode(p, add_special_tokens=False) for p in prompts]
def run(constrained, optimistic=True, policy="resample", prof=None, n=None):
    kv.flush()
    args = dataclasses.replace(base, disable_optimistic_grammar=not optimistic)
    s = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda t: [], lambda m: None, tokenizer=tok)
    if policy == "recompute":
        s.results.resampler = None
    for i, ids in enumerate(prompts[:n]):
        s.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams(
            max_new_tokens=64, min_new_tokens=64, temperature=0, regex=MASK_REGEX if constrained else None)))
    if constrained:   # compile first
        while any(r.grammar_future is not None and not r.grammar_future.done() for r in s.waiting): time.sleep(0.01)
    sync(); steps = 0; t0 = time.perf_counter()
    if prof: prof.enable()
    while s.has_work:
        s.step(); steps += 1
    if prof: prof.disable()
    sync(); sec = time.perf_counter() - t0
    return dict(constrained=constrained, optimistic=optimistic, policy=policy, ms=round(sec * 1e3, 1), steps=steps,
                ms_per_step=round(sec / steps * 1e3, 3), rejections=s.grammar_rejections)

variants = [(False,), (True, True, "resample"), (True, False), (True, True, "recompute")]
for n in (64, 256):
    for rep in range(3):
        for v in variants:
            print(n, run(*v, n=n), flush=True)
for v in [(True, True, "resample")]:
    pr = cProfile.Profile(); run(*v, prof=pr)
    st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(22)
    print(v, st.getvalue()[:5000])
