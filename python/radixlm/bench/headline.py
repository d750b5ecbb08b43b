"""`radixlm bench headline`: one batched `/generate` call to a running server against the
plain-PyTorch floor, in one run (SGLang's talk workload: Llama-3.2-1B, batch 256, input 4096,
output 16).

1. Start `radixlm serve` on the model (or use `--base-url` of a server already running on this
   machine with the same weights), warm it up with a small batch, flush its cache, and time one
   `/generate` whose body holds all `--batch-size` prompts as input_ids (greedy, ignore_eos,
   `--output-len` new tokens each): request sent to last byte of the response.
2. Run the same request once more under the server's profiler (/start_profile with GPU
   activity only, /stop_profile): the engine's own GPU time for it, kernels that overlap
   counted once. End to end over that busy time is the host's share (issue 12's target:
   <= 1.05x).
3. Stop the server, load the same weights in this process and time the floor
   (bench/floor.py: static batch, cuBLAS + SDPA) on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import httpx
import torch

from radixlm.bench.common import (default_output_path, environment, print_summary, require_positive,
                                  write_json)
from radixlm.bench.floor import check_floor_supports, measure_floor
from radixlm.core.model_config import ModelConfig
from radixlm.bench.progress import TokenProgress
from radixlm.model_executor.model_runner import ModelRunner
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import load_hf_config, resolve_model_dir
from radixlm.utils.server_process import launch_server, stop_server


def start_server(ns: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    return launch_server(
        ["--model-path", ns.model_path, "--load-format", ns.load_format, "--dtype", ns.dtype,
         "--max-running-requests", str(ns.batch_size), "--log-level", "warning",
         *(["--tokenizer-path", ns.tokenizer_path] if ns.tokenizer_path else []),
         *ns.server_args], ns.startup_timeout, poll_s=1.0)


def generate(url: str, prompts: torch.Tensor, output_len: int,
             profile_dir: str | None = None) -> tuple[float, list[dict]]:
    """Time one batched /generate (cache flushed first); with `profile_dir`, under the
    server's profiler (GPU activity), whose summary is returned as the last list element."""
    # Encoded before the clock starts: the time is from the request being sent to the last
    # byte of the response (the client's JSON encoding of 1M ids took ~0.1 s on its own).
    body = json.dumps({"input_ids": prompts.tolist(),
                       "sampling_params": {"max_new_tokens": output_len, "temperature": 0,
                                           "ignore_eos": True}}).encode()
    httpx.post(url + "/flush_cache", timeout=60)
    if profile_dir is not None:
        httpx.post(url + "/start_profile", json={"output_dir": profile_dir,
                                                 "activities": ["GPU"]},
                   timeout=60).raise_for_status()

    def generated() -> int:
        return httpx.get(url + "/get_server_info", timeout=10).json()["generated_tokens_total"]

    with TokenProgress(len(prompts) * output_len, generated):
        t = time.perf_counter()
        resp = httpx.post(url + "/generate", content=body,
                          headers={"content-type": "application/json"}, timeout=3600)
        seconds = time.perf_counter() - t
    resp.raise_for_status()
    outs = resp.json()
    if profile_dir is not None:
        stop = httpx.post(url + "/stop_profile", timeout=600)
        stop.raise_for_status()
        outs.append(stop.json())
    return seconds, outs


def run(ns: argparse.Namespace) -> dict:
    bs, n_in, n_out = ns.batch_size, ns.input_len, ns.output_len
    # The floor only runs dense models: find out before the server's timed run, not after.
    hf_dir, _ = resolve_model_dir(ns.model_path, ns.load_format)
    check_floor_supports(ModelConfig.from_hf(load_hf_config(hf_dir), None))
    proc, url = (None, ns.base_url) if ns.base_url else start_server(ns)
    try:
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, ns.max_token_id, (bs, n_in), generator=gen)
        generate(url, prompts[: max(1, bs // 32)], n_out)          # warm-up
        server_s, outs = generate(url, prompts, n_out)
        server_s2, _ = generate(url, prompts, n_out)                 # a second timing
        gpu = {"gpu_busy_s": None, "gpu_span_s": None, "num_kernels": 0}
        profiled_s = None
        if not ns.no_profile:
            with tempfile.TemporaryDirectory() as tmp:
                profiled_s, profiled = generate(url, prompts, n_out, profile_dir=tmp)
            gpu = profiled[-1]
    finally:
        if proc is not None:
            stop_server(proc, timeout_s=60)
    completion = [o["meta_info"]["completion_tokens"] for o in outs]
    assert completion == [n_out] * bs, "every request must return exactly output_len tokens"

    # The floor drives runner.model directly with its own static KV tensors; the runner only
    # loads the same weights (no attention backend needed).
    runner = ModelRunner(RunnerConfig(model_path=ns.model_path, load_format=ns.load_format,
                                      dtype=ns.dtype, disable_cuda_graph=True,
                                      max_total_tokens=4096, max_running_requests=8,
                                      context_length=n_in + n_out + 8))
    fl = measure_floor(runner, prompts, n_out, max(1, ns.floor_prefill_tokens // n_in))
    first_agree = sum(o["output_ids"][0] == f for o, f in zip(outs, fl.first_tokens)) / bs
    best = min(server_s, server_s2)
    return {
        "batch_size": bs, "input_len": n_in, "output_len": n_out,
        "server_e2e_s": [server_s, server_s2], "server_best_s": best,
        "floor": {"total_s": fl.total_s, "prefill_s": fl.prefill_s,
                  "decode_s": sum(fl.decode_steps_s)},
        "ratio_server_over_floor": best / fl.total_s,
        # The engine's own GPU time for the same request (a third, profiled run).
        "profiled_run_s": profiled_s, "gpu_busy_s": gpu["gpu_busy_s"],
        "gpu_span_s": gpu["gpu_span_s"], "num_kernels": gpu["num_kernels"],
        "ratio_server_over_gpu_busy": best / gpu["gpu_busy_s"] if gpu["gpu_busy_s"] else None,
        "first_token_agreement_with_floor": first_agree,
        "config": {k: v for k, v in vars(ns).items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench headline", description=__doc__)
    p.add_argument("--model-path", required=True)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--base-url", default=None, help="use this running server instead")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--input-len", type=int, default=4096)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--max-token-id", type=int, default=32000,
                   help="prompt ids are drawn below this (must be inside the model's vocab)")
    p.add_argument("--floor-prefill-tokens", type=int, default=16384,
                   help="the floor prefills whole requests in groups of this many tokens")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the profiled run (a server without /start_profile)")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="the rest of the command line goes to `radixlm serve`")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = p.parse_args(argv)
    require_positive(p, ns, "batch_size", "input_len", "output_len")
    result = run(ns)
    result.update(environment(None), command="radixlm bench headline " + " ".join(argv))
    path = write_json(ns.output or default_output_path("headline"), result)
    busy = (f", GPU busy {result['gpu_busy_s']:.2f}s "
            f"({result['ratio_server_over_gpu_busy']:.3f}x)" if result["gpu_busy_s"] else "")
    print_summary(f"headline bs {ns.batch_size} in {ns.input_len} out {ns.output_len}: server "
                  f"{result['server_best_s']:.2f}s, floor {result['floor']['total_s']:.2f}s "
                  f"({result['ratio_server_over_floor']:.2f}x floor){busy} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
