"""`python -m radixlm.bench.sampler`: the Sampler's own cost per step, its Triton kernels
(sampling/logprob_kernels.py, sampling/topk_kernels.py) against its PyTorch code
(RADIXLM_DISABLE_FUSED_OPS=1), for the kinds of batch a scheduler sends. CUDA only.

The sampler runs outside the CUDA graph, so each of its launches is host time on the step's
critical path. Two figures per case, medians of --iters after warm-up:
  * host: wall time of the call, returning without a sync (what the scheduler's thread pays
    before it can go on; the sampler makes no sync except the top-logprob host copy);
  * total: the call plus a synchronize (host and GPU, whichever is longer).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch

from radixlm.bench.common import (FusedOpsFallback, default_output_path, environment, median,
                                  print_summary, write_json)

# name -> (per-row SamplingParams kwargs, top_logprobs_num a row, alternatives)
CASES: dict[str, tuple[dict[str, Any], int, int]] = {
    "greedy": (dict(temperature=0), 0, 0),
    "greedy+alternatives16": (dict(temperature=0), 0, 16),
    "greedy+min_tokens+alternatives16": (dict(temperature=0, min_new_tokens=64), 0, 16),
    "greedy+top_logprobs5": (dict(temperature=0), 5, 0),
    "temperature": (dict(temperature=0.8), 0, 0),
    "top_p": (dict(temperature=0.8, top_p=0.9), 0, 0),
    "top_p+top_logprobs5": (dict(temperature=0.8, top_p=0.9), 5, 0),
    "top_k20": (dict(temperature=0.8, top_k=20), 0, 0),
    "top_k40+top_p": (dict(temperature=0.8, top_k=40, top_p=0.9), 0, 0),
    "min_p": (dict(temperature=0.8, min_p=0.05), 0, 0),
}


def _time(call: Callable[[], object], iters: int, sync: bool) -> float:
    samples = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if sync:
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return median(samples)


def run_case(vocab: int, batch: int, case: str, iters: int) -> dict[str, Any]:
    from radixlm.sampling.batch_info import SamplingBatchInfo
    from radixlm.sampling.params import SamplingParams
    from radixlm.sampling.request import SamplingRequest
    from radixlm.sampling.sampler import Sampler
    params, top_n, alternatives = CASES[case]
    reqs = [SamplingRequest(params=SamplingParams(**params), seed=i, prompt_ids=[1, 2, 3],
                            output_ids=[], eos_token_ids=[0]) for i in range(batch)]
    device = torch.device("cuda")
    info = SamplingBatchInfo.build(reqs, vocab, device)
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(batch, vocab, device=device, generator=g) * 4).to(torch.bfloat16)
    nums = [top_n] * batch if top_n else None
    sampler = Sampler()
    row: dict[str, Any] = dict(vocab=vocab, batch=batch, case=case)
    outs = {}
    call = lambda: sampler(logits, info, nums, alternatives)   # noqa: E731
    for name, off in (("fused", False), ("torch", True)):
        with FusedOpsFallback(off):
            for _ in range(3):
                call()
            row[f"{name}_host_us"] = _time(call, iters, sync=False) * 1e6
            row[f"{name}_total_us"] = _time(call, iters, sync=True) * 1e6
            outs[name] = call()
    row["same_tokens"] = bool(torch.equal(outs["fused"].next_token_ids,
                                          outs["torch"].next_token_ids))
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocabs", default="49152,128256,151936")
    p.add_argument("--batch-sizes", default="1,64,256")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench sampler needs CUDA")
    rows = []
    print(f"{'vocab':>7} {'bs':>4} {'case':34} {'host us fused/torch':>22} "
          f"{'total us fused/torch':>22}  same")
    for vocab in map(int, args.vocabs.split(",")):
        for batch in map(int, args.batch_sizes.split(",")):
            for case in args.cases.split(","):
                r = run_case(vocab, batch, case, args.iters)
                rows.append(r)
                print(f"{vocab:>7} {batch:>4} {case:34} {r['fused_host_us']:>10.1f} / "
                      f"{r['torch_host_us']:<9.1f} {r['fused_total_us']:>10.1f} / "
                      f"{r['torch_total_us']:<9.1f}  {r['same_tokens']}", flush=True)
    path = write_json(args.output or default_output_path("sampler"),
                      dict(environment=environment("cuda"), args=vars(args), rows=rows))
    worst = max(rows, key=lambda r: r["fused_total_us"] / r["torch_total_us"])
    print_summary(f"bench sampler -> {path}; worst fused/torch total: {worst['case']} bs "
                  f"{worst['batch']} vocab {worst['vocab']}: "
                  f"{worst['fused_total_us'] / worst['torch_total_us']:.2f}x")


if __name__ == "__main__":
    main()
