"""What quantization costs in accuracy, on real weights: for each of full precision, FP8 and
W4A16 (online, from the same checkpoint), the next-token distributions over a fixed text
(teacher-forced, one decode step per token) and greedy continuations of a few prompts.

Reported: mean and max per-token KL(full || quantized), top-1 agreement along the text, and
over the prompts the share of continuations identical to full precision's and the mean number
of leading tokens that agree.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based ink and a wooden screw press into a "
        "system that could produce books quickly and cheaply. Within fifty years printers were "
        "working in more than two hundred cities across Europe, and the price of books fell so "
        "far that ordinary merchants could own them. Scholars argue about how much the press "
        "changed the way people thought, but few doubt that it spread new ideas faster than "
        "any invention before it.")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at",
           "Once upon a time, in a small village,", "The three primary colors are",
           "To make a cup of tea, first", "The largest planet in the solar system",
           "Photosynthesis is the process by which"]


def _runner(model_path: str | None, device: str, quantization: str | None):
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    return create_runner_and_kv(RunnerConfig(model_path=model_path, device=device,
                                             max_total_tokens=8192, quantization=quantization,
                                             disable_cuda_graph=True), radix=False)


def _teacher_forced_logprobs(runner, kv, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, V] log-probabilities of each next token given the text before it."""
    from radixlm.bench.one_batch import EngineRun
    run = EngineRun(runner, kv, torch.tensor([ids[:1]]), len(ids), 1)
    rows = []
    reqs = run.reqs
    for r in reqs:
        r.extend_input_len = r.prompt_len
    from radixlm.core.forward_batch import ForwardMode
    from radixlm.scheduler.schedule_batch import ScheduleBatch
    fb = ScheduleBatch(reqs, ForwardMode.EXTEND).prepare_extend(kv, runner.device)
    rows.append(runner.forward(fb).next_token_logits[0])
    for t in ids[1:-1]:
        reqs[0].output_ids.append(t)
        runner.last_token_ids[reqs[0].req_pool_idx] = t
        fb = ScheduleBatch(reqs, ForwardMode.DECODE).prepare_decode(kv, runner.last_token_ids)
        rows.append(runner.forward(fb).next_token_logits[0])
    run.release()
    return torch.log_softmax(torch.stack(rows).float(), dim=-1)


def _greedy(runner, kv, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from radixlm.bench.one_batch import EngineRun
    outs = []
    for p in prompts:
        run = EngineRun(runner, kv, torch.tensor([p]), new_tokens, 1)
        run.prefill()
        for _ in range(new_tokens - 1):
            run.decode_step()
        outs.append(list(run.reqs[0].output_ids))
        run.release()
    return outs


def measure_accuracy(model_path: str | None, device: str, prompts: int = 8,
                     new_tokens: int = 32, text_tokens: int | None = None) -> dict[str, Any]:
    """`text_tokens`: score only the text's first tokens (tests)."""
    from radixlm.model_executor.weight_source import load_tokenizer, resolve_model_dir
    tok = load_tokenizer(resolve_model_dir(model_path, "auto")[0])
    text_ids = tok.encode(TEXT)[:text_tokens]
    prompt_ids = [tok.encode(p) for p in PROMPTS[:prompts]]
    results: dict[str, Any] = {"text_tokens": len(text_ids), "prompts": len(prompt_ids),
                               "new_tokens": new_tokens, "device": device}
    ref_lp = ref_greedy = None
    for flag in (None, "fp8", "w4a16"):
        runner, kv = _runner(model_path, device, flag)
        lp = _teacher_forced_logprobs(runner, kv, text_ids)
        greedy = _greedy(runner, kv, prompt_ids, new_tokens)
        results.setdefault("dtype", str(runner.dtype))
        del runner, kv
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        if flag is None:
            ref_lp, ref_greedy = lp, greedy
            continue
        kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1)
        same_prefix = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r))
                       for g, r in zip(greedy, ref_greedy)]
        results[flag] = {
            "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
            "top1_agreement": (lp.argmax(-1) == ref_lp.argmax(-1)).float().mean().item(),
            "greedy_identical": sum(g == r for g, r in zip(greedy, ref_greedy)) / len(greedy),
            "greedy_tokens_agreeing_before_first_difference": sum(same_prefix) / len(greedy),
            "greedy_token_agreement": sum(a == b for g, r in zip(greedy, ref_greedy)
                                          for a, b in zip(g, r)) / (len(greedy) * new_tokens),
        }
        r = results[flag]
        print(f"{flag:6s} KL mean {r['kl_mean']:.4f} max {r['kl_max']:.3f}, top-1 agreement "
              f"{r['top1_agreement']:.1%}; greedy: {r['greedy_identical']:.0%} identical, "
              f"{r['greedy_tokens_agreeing_before_first_difference']:.1f} of {new_tokens} "
              f"tokens agree before the first difference", flush=True)
    return results
