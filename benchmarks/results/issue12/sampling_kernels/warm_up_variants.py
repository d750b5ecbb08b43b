import torch, sys
sys.path.insert(0, "tests")
from test_draw_kernels import _info
from radixlm.sampling import cutoff_kernels as ck, draw_kernels as dk
from radixlm.sampling.sampler import Sampler
V = 151936
s = Sampler(logits_hold_bf16=True)
s.warm_up(V, torch.float32, torch.device("cuda"))
ks = {n: getattr(m, n) for m, ns in ((ck, ["_stats_kernel", "_search_kernel", "_topk_mass_kernel", "_finish_kernel"]), (dk, ["_draw_chunk_kernel", "_draw_combine_kernel"])) for n in ns}
def snap(): return {n: set(k for c in f.device_caches.values() for k in c[0].keys()) for n, f in ks.items()}
base = snap()
for n, v in base.items(): print("warm", n, len(v))
kinds = [dict(top_p=0.9), dict(top_k=20), dict(min_p=0.1), dict(), dict(temperature=0), dict(top_k=40, top_p=0.8)]
for batch in (1, 3, 27, 64, 65):
    for mi, mix in enumerate((kinds, kinds[1:2], kinds[3:4], kinds[2:3])):
        params = [mix[i % len(mix)] for i in range(batch)]
        logits = torch.randn(batch, V, device="cuda").to(torch.bfloat16).float()
        s(logits, _info(V, "cuda", params))
        now = snap()
        for n in ks:
            new = now[n] - base[n]
            if new:
                print("NEW", batch, mi, n, [str(k)[:600] for k in new]); 
        base = now
