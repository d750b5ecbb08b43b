"""`radixlm bench offline`: offline throughput, many requests through the in-process Engine.

All requests go to `Engine.generate` as one batch call; each has `ignore_eos` and a fixed
`max_new_tokens`, so the output token count is known before the run and equal across systems.
Reports requests, input / output tokens, wall time, output tokens/s, total tokens/s, requests/s
(and the prompt cache hit rate, which the shared-prefix dataset is about).

`--hf-baseline`: after the engine is shut down (its memory freed), the same requests go through
HF transformers `generate` on the same device and dtype, in batches of `--hf-batch-size` (left
padded, with attention masks). A batch generates max(output lengths in the batch) tokens for
every row; only each request's own output length counts as useful output, which is what the
tokens/s figure and the engine / HF ratio use.

    radixlm bench offline --dataset nano-vllm --model-path benchmarks/configs/qwen3-0.6b \\
        --load-format dummy --tokenizer-path TOKENIZER_DIR --hf-baseline
    python -m radixlm.bench.offline --device cpu --num-prompts 8 --max-input-len 64 \\
        --max-output-len 8                                       # smoke test on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from radixlm.bench import common
from radixlm.bench.progress import TokenProgress
from radixlm.bench.datasets import (BenchRequest, DatasetArgs, add_dataset_args,
                                    dataset_args_from, make_requests)
from radixlm.config import ServerArgs
from radixlm.utils.gc_freeze import freeze_startup_heap


@dataclass
class Throughput:
    requests: int
    input_tokens: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float

    @classmethod
    def of(cls, requests: int, input_tokens: int, output_tokens: int,
           wall_s: float) -> "Throughput":
        return cls(requests, input_tokens, output_tokens, wall_s, output_tokens / wall_s,
                   (input_tokens + output_tokens) / wall_s, requests / wall_s)


def _sampling_params(r: BenchRequest, temperature: float) -> dict[str, Any]:
    return {"max_new_tokens": r.output_len, "ignore_eos": True, "temperature": temperature}


def _length_stats(values: list[int]) -> dict[str, float]:
    return {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}


# ---------------------------------------------------------------------- engine

def run_engine(server_args: ServerArgs, dargs: DatasetArgs, temperature: float
               ) -> tuple[list[BenchRequest], dict[str, Any]]:
    from radixlm.entrypoints.engine import Engine

    engine = Engine(**dataclasses.asdict(server_args))
    freeze_startup_heap()   # (this process's: no full collection pass inside a timing)
    try:
        ready = engine.ready
        # A dummy config may be served with a smaller model's tokenizer: prompt ids stay below
        # both vocabularies.
        vocab = min(ready.vocab_size, len(engine.tokenizer))
        requests = make_requests(dargs, vocab, engine.tokenizer)
        too_long = [len(r.input_ids) + r.output_len for r in requests
                    if len(r.input_ids) + r.output_len > ready.context_len]
        if too_long:
            raise ValueError(f"{len(too_long)} requests need more than the context length "
                             f"({ready.context_len}), e.g. {too_long[0]} tokens")
        # Warm-up (first-call costs, lazy allocations), then an empty cache for the timed run.
        warm = [requests[0].input_ids[:16]] * 2
        engine.generate(input_ids=warm, sampling_params=[{"max_new_tokens": 4,
                                                          "ignore_eos": True}] * 2)
        engine.flush_cache()
        params = [_sampling_params(r, temperature) for r in requests]
        with TokenProgress(sum(r.output_len for r in requests),
                           lambda: engine.get_stats().generated_tokens_total):
            outs, wall = common.timed(lambda: engine.generate(
                input_ids=[r.input_ids for r in requests], sampling_params=params))
        info = {"resolved_model_path": ready.model_path, "tokenizer_path": ready.tokenizer_path,
                "device": ready.device, "dtype": ready.dtype, "vocab_size": ready.vocab_size,
                "tokenizer_vocab_size": len(engine.tokenizer), "context_len": ready.context_len,
                "max_total_num_tokens": ready.max_total_num_tokens,
                "max_running_requests": ready.max_running_requests}
    finally:
        engine.shutdown()
    metas = [o["meta_info"] for o in outs]
    prompt = sum(m["prompt_tokens"] for m in metas)
    cached = sum(m.get("cached_tokens", 0) for m in metas)
    out_tokens = sum(m["completion_tokens"] for m in metas)
    figures = Throughput.of(len(requests), prompt, out_tokens, wall)
    return requests, {
        "engine": info,
        "results": dataclasses.asdict(figures),
        "output_tokens_requested": sum(r.output_len for r in requests),
        # ignore_eos: every request must produce exactly its length, or the work differs.
        "all_full_length": all(m["completion_tokens"] == r.output_len
                               for m, r in zip(metas, requests)),
        "finish_reasons": common.finish_counts(outs),
        "cache_hit_rate": cached / prompt if prompt else 0.0,
    }


# ---------------------------------------------------------------------- HF baseline

def _hf_model(model_dir: str, load_format: str, device: str, dtype_name: str, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    if load_format == "dummy":
        # Random weights as the engine draws them (uniform +-1e-3, norms 1): the same cost per
        # token, and finite activations in half precision.
        torch.manual_seed(seed)
        config = AutoConfig.from_pretrained(model_dir)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.fill_(1.0) if name.endswith("norm.weight") else p.uniform_(-1e-3, 1e-3)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    return model.eval()


def run_hf(requests: list[BenchRequest], model_dir: str, load_format: str, device: str,
           dtype_name: str, batch_size: int, temperature: float, seed: int) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig

    model = _hf_model(model_dir, load_format, device, dtype_name, seed)
    # Batches of similar output lengths waste fewer padded steps: the fairest static batching.
    order = sorted(range(len(requests)), key=lambda i: -requests[i].output_len)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    pad = 0  # any id: masked out, and the model never sees it as input

    def generate(idx: list[int], max_new: int) -> int:
        rows = [requests[i].input_ids for i in idx]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows],
                            device=device)
        # eos None: no stopping (the engine's ignore_eos); min = max: exactly max_new steps.
        cfg = GenerationConfig(max_new_tokens=max_new, min_new_tokens=max_new,
                               do_sample=temperature > 0,
                               temperature=temperature if temperature > 0 else None,
                               top_k=None, top_p=None, eos_token_id=None, pad_token_id=pad,
                               bos_token_id=None)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        return (out.shape[1] - width) * len(rows)

    generate(batches[0][:1], 2)  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    generated = 0
    for b in batches:
        generated += generate(b, max(requests[i].output_len for i in b))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    useful = sum(r.output_len for r in requests)
    figures = Throughput.of(len(requests), sum(len(r.input_ids) for r in requests), useful, wall)
    return {"results": dataclasses.asdict(figures), "batch_size": batch_size,
            "num_batches": len(batches), "generated_tokens_incl_padding": generated,
            "useful_fraction": useful / generated if generated else None,
            "method": ("HF AutoModelForCausalLM.generate, requests sorted by output length, "
                       "batches of --hf-batch-size, left padding + attention mask, each batch "
                       "generates max(output len in batch) tokens with EOS disabled; "
                       "output tokens count only each request's own output length"),
            "sampling": "greedy" if temperature <= 0 else f"temperature {temperature}"}


# ---------------------------------------------------------------------- driver

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench offline",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    add_dataset_args(p)
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default 0 = greedy; 0.6 for the nano-vllm preset)")
    p.add_argument("--hf-baseline", action="store_true",
                   help="also run the requests through HF transformers generate")
    p.add_argument("--hf-batch-size", type=int, default=32)
    p.add_argument("--output", default=None,
                   help="JSON results (default benchmarks/offline_<timestamp>.json)")
    ServerArgs.add_cli_args(p)   # the engine's flags: --model-path, --load-format, --dtype, ...
    return p


def _summary(res: dict[str, Any]) -> str:
    e = res["results"]
    line = (f"offline {res['dataset']['dataset']}: {e['requests']} reqs, "
            f"in {e['input_tokens']} tok, out {e['output_tokens']} tok, {e['wall_s']:.2f}s: "
            f"{e['output_tokens_per_s']:.1f} out tok/s, {e['total_tokens_per_s']:.1f} tok/s, "
            f"{e['requests_per_s']:.2f} req/s")
    if res["dataset"]["dataset"] == "shared-prefix":
        line += f", cache hit {common.pct(res['cache_hit_rate'])}"
    hf = res.get("hf_baseline")
    if hf:
        line += (f"; HF {hf['results']['output_tokens_per_s']:.1f} out tok/s "
                 f"(engine {res['ratio_engine_over_hf']:.2f}x)")
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    try:
        dargs = dataset_args_from(ns)
    except ValueError as e:
        parser.error(str(e))
    if ns.hf_batch_size < 1:
        parser.error("--hf-batch-size must be >= 1")
    temperature = ns.temperature if ns.temperature is not None else (
        0.6 if ns.dataset == "nano-vllm" else 0.0)
    if ns.log_level == "info":
        ns.log_level = "warning"   # engine start-up logs would bury the results
    server_args = ServerArgs.from_cli_args(ns)
    requests, res = run_engine(server_args, dargs, temperature)
    result: dict[str, Any] = {
        "benchmark": "offline",
        "argv": list(sys.argv[1:] if argv is None else argv),
        **common.environment(res["engine"]["device"]),
        "engine_args": dataclasses.asdict(server_args),
        "dataset": {**dargs.to_json(), "num_requests": len(requests),
                    "input_len": _length_stats([len(r.input_ids) for r in requests]),
                    "output_len": _length_stats([r.output_len for r in requests])},
        "settings": {"temperature": temperature, "ignore_eos": True, "one_batch_call": True},
        **res,
        "hf_baseline": None,
    }
    if ns.hf_baseline:
        from radixlm.model_executor.weight_source import resolve_model_dir

        model_dir, load_format = resolve_model_dir(server_args.model_path,
                                                   server_args.load_format)
        hf = run_hf(requests, model_dir, load_format, res["engine"]["device"],
                    res["engine"]["dtype"], ns.hf_batch_size, temperature,
                    server_args.random_seed)
        result["hf_baseline"] = hf
        result["ratio_engine_over_hf"] = (res["results"]["output_tokens_per_s"]
                                          / hf["results"]["output_tokens_per_s"])
    result["summary"] = line = _summary(result)
    path = common.write_json(ns.output or common.default_output_path("offline"), result)
    print(f"results written to {path}", file=sys.stderr)
    common.print_summary(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
