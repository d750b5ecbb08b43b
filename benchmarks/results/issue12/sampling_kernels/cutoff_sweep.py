import time, torch
from radixlm.sampling import cutoff_kernels as ck, draw_kernels as dk
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.params import SamplingParams
from radixlm.sampling.request import SamplingRequest
from radixlm.bench.common import graph_seconds_per_call
dev = torch.device("cuda")
def setup(B, V, params):
    x = (torch.randn(B, V, device=dev) * 4).to(torch.bfloat16)
    reqs = [SamplingRequest(params=SamplingParams(**params), seed=i, prompt_ids=[1], output_ids=[]) for i in range(B)]
    return x, SamplingBatchInfo.build(reqs, V, dev)
def cut(x, info):
    return lambda: ck.sampling_cutoffs(x, info.temperatures, info.top_ks, info.top_p_limits, info.log_min_ps,
                                       top_k=info.need_top_k, top_p=info.need_top_p, min_p=info.need_min_p)
def host(f):
    for _ in range(3): f()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(20): f()
    h = (time.perf_counter() - t0) / 20; torch.cuda.synchronize(); return h
cases = {"top_p": dict(temperature=0.8, top_p=0.9), "top_k20": dict(temperature=0.8, top_k=20),
         "top_k40+top_p": dict(temperature=0.8, top_k=40, top_p=0.9), "min_p": dict(temperature=0.8, min_p=0.05)}
from radixlm.sampling.sampler import Sampler
for B, V in ((64, 151936), (256, 151936), (64, 49152), (1, 151936)):
    for name, params in cases.items():
        x, info = setup(B, V, params); f = cut(x, info)
        xf = x.float()
        ref = lambda: Sampler.filter_logits(xf, info)
        print(f"cutoffs B{B} V{V} {name}: host {host(f)*1e6:.0f} us, graph gpu {graph_seconds_per_call(f)*1e6:.0f} us; torch filter_logits graph gpu {graph_seconds_per_call(ref, graph_calls=3, repeats=3)*1e6:.0f} us", flush=True)
x, info = setup(64, 151936, cases["top_k40+top_p"])
f = cut(x, info); f()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    f(); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6), flush=True)
for chunk in (2048, 4096, 8192):
  for block in (256, 512, 1024):
    for warps in (4, 8):
        ck.CHUNK, ck.BLOCK, ck.SEARCH_WARPS = chunk, block, warps
        try:
            r = [graph_seconds_per_call(cut(*setup(64, 151936, cases[c])))*1e6 for c in ("top_p", "top_k20")]
            print(f"search CHUNK {chunk} BLOCK {block} warps {warps}: B64 V151936 top_p {r[0]:.0f} us, top_k20 {r[1]:.0f} us", flush=True)
        except Exception as e:
            print(chunk, block, warps, "ERR", str(e)[:200])
