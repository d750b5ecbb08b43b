"""`radixlm bench spec`: speculative decoding on vs off, batch 1, same run (issue 18).

Two workloads on the served model (default: the bundled one), each request alone (batch 1),
greedy (or sampled with `--temperature`, a fixed seed per prompt), through the offline Engine:
  copy  edits and rewrites whose answer repeats the input (fix a paragraph's spelling, repeat
        code with a comment added, continue a list): what n-gram drafts are for;
  chat  open-ended questions, where drafts rarely match (the adaptive policy should keep the
        cost near zero).
Reported per workload: output tokens/s without and with --speculative-algorithm NGRAM (or,
with --draft-model-path, STANDALONE with that draft model), the ratio; the same for decode
alone (streamed, from the first token on: no prefill, no request round trip); the cost of a
verify step over a plain one as the adaptive policy measured it; tokens per verify step
(completion_tokens / spec_verify_ct), and whether the texts are identical (they must be, greedy
or sampled with the same seeds).

    radixlm bench spec [--model-path ...] [--max-new-tokens 256] [--draft-model-path ...]
                       [--num-draft-tokens 8 --ngram-max-bfs-breadth 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

from radixlm.bench.common import default_output_path, environment, print_summary, write_json
from radixlm.utils.gc_freeze import freeze_startup_heap

PARAGRAPH = ("Teh history of the printing press begins in the fifteenth century, when Johannes "
             "Gutenberg combined movable metal type, oil-based ink and a wooden screw press "
             "into a sytem that could produce books quickly and cheaply. Within fifty years "
             "printers were working in more then two hundred cities across Europe.")
CODE = '''def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
'''
COPY = [f"Fix the spelling mistakes in this paragraph and write it out again in full:\n\n"
        f"{PARAGRAPH}",
        f"Repeat this Python code exactly, adding a docstring to each function:\n\n{CODE}",
        "Write out the alphabet as a comma-separated list of capital letters, A to Z.",
        f"Copy this text word for word:\n\n{PARAGRAPH}"]
CHAT = ["Write a short story about a robot who learns to paint.",
        "Why is the sky blue? Explain it to a ten-year-old.",
        "Give me three ideas for a weekend trip and say why each is fun.",
        "What are the pros and cons of working from home?"]


def _run(engine, prompts: list[str], max_new: int, temperature: float) -> dict[str, Any]:
    before = engine.get_stats()
    texts, tokens, verify, seconds = [], 0, 0, 0.0
    for seed, p in enumerate(prompts):
        prompt = engine.apply_chat_template([{"role": "user", "content": p}])
        t = time.perf_counter()
        out = engine.generate(prompt, _params(max_new, temperature, seed))
        seconds += time.perf_counter() - t
        texts.append(out["text"])
        tokens += out["meta_info"]["completion_tokens"]
        verify += out["meta_info"].get("spec_verify_ct", 0)
    after = engine.get_stats()
    steps = after.spec_verify_steps - before.spec_verify_steps
    # Tokens the verify steps produced (accept length x steps, since start) over this run.
    emitted = (after.spec_accept_length * after.spec_verify_steps
               - before.spec_accept_length * before.spec_verify_steps)
    return {"texts": texts, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "verify_steps": verify, "accept_length": emitted / steps if steps else None,
            "tokens_in_verify_steps": emitted}


def _run_decode(engine, prompts: list[str], max_new: int, temperature: float) -> dict[str, Any]:
    """Decode alone: streamed, from the first token's arrival (the prefill's) to the last, so
    the prompt's prefill, tokenization and the request's round trip are left out. (Streaming
    sends every step's tokens: one message a token without drafts, one a verify step with.)"""
    tokens, seconds = 0, 0.0
    for seed, p in enumerate(prompts):
        prompt = engine.apply_chat_template([{"role": "user", "content": p}])
        first_at = first_tokens = last = None
        for chunk in engine.generate(prompt, _params(max_new, temperature, seed), stream=True):
            last = chunk
            if first_at is None and chunk["meta_info"]["completion_tokens"] > 0:
                first_at, first_tokens = time.perf_counter(), chunk["meta_info"][
                    "completion_tokens"]
        seconds += time.perf_counter() - first_at
        tokens += last["meta_info"]["completion_tokens"] - first_tokens
    return {"decode_tokens": tokens, "decode_seconds": seconds,
            "decode_tok_s": tokens / seconds if seconds > 0 else 0.0}


def _params(max_new: int, temperature: float, seed: int) -> dict[str, Any]:
    return {"max_new_tokens": max_new, "temperature": temperature, "sampling_seed": seed}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--num-draft-tokens", type=int, default=4, help="NGRAM's drafts a step")
    p.add_argument("--ngram-max-bfs-breadth", type=int, default=1,
                   help="NGRAM: > 1 drafts trees (--speculative-ngram-max-bfs-breadth)")
    p.add_argument("--draft-model-path", default=None,
                   help="compare STANDALONE with this draft model instead of NGRAM")
    p.add_argument("--num-steps", type=int, default=3, help="STANDALONE's drafts a step")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; above: sampled, seed i for the i-th prompt")
    p.add_argument("--repeats", type=int, default=5, help="passes over each workload (the "
                                                          "first warms up, the best is kept)")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    from radixlm.entrypoints.engine import Engine
    algorithm = "STANDALONE" if args.draft_model_path else "NGRAM"
    result: dict[str, Any] = {"max_new_tokens": args.max_new_tokens,
                              "temperature": args.temperature, "algorithm": algorithm}
    spec_flags = ({"speculative_draft_model_path": args.draft_model_path,
                   "speculative_num_steps": args.num_steps} if args.draft_model_path else
                  {"speculative_num_draft_tokens": args.num_draft_tokens,
                   "speculative_ngram_max_bfs_breadth": args.ngram_max_bfs_breadth})
    runs: dict[str, dict[str, Any]] = {}
    for spec in (None, algorithm):
        engine = Engine(model_path=args.model_path, device=args.device, log_level="warning",
                        speculative_algorithm=spec, **(spec_flags if spec else {}))
        freeze_startup_heap()   # (this process's: no full collection pass inside a timing)
        try:
            for name, prompts in (("copy", COPY), ("chat", CHAT)):
                best = decode = None
                for _ in range(args.repeats):
                    r = _run(engine, prompts, args.max_new_tokens, args.temperature)
                    if best is None or r["seconds"] < best["seconds"]:
                        best = r
                for _ in range(args.repeats):
                    d = _run_decode(engine, prompts, args.max_new_tokens, args.temperature)
                    if decode is None or d["decode_tok_s"] > decode["decode_tok_s"]:
                        decode = d
                ratio = engine.get_stats().spec_cost_ratio if spec else None
                runs[f"{name}/{spec or 'off'}"] = {**best, **decode, "cost_ratio": ratio}
        finally:
            engine.shutdown()
    for name in ("copy", "chat"):
        off, on = runs[f"{name}/off"], runs[f"{name}/{algorithm}"]
        result[name] = {
            "off_tok_s": off["tok_s"], "spec_tok_s": on["tok_s"],
            "speedup": on["tok_s"] / off["tok_s"],
            # decode alone (streamed, after the first token), each its own best pass
            "off_decode_tok_s": off["decode_tok_s"], "spec_decode_tok_s": on["decode_tok_s"],
            "decode_speedup": on["decode_tok_s"] / off["decode_tok_s"],
            "cost_ratio": on["cost_ratio"],
            # tokens a verify step produced on average (accepted drafts + 1), and the share of
            # all output tokens that came from verify steps (the rest: plain decode steps)
            "accept_length": on["accept_length"],
            "share_from_verify_steps": on["tokens_in_verify_steps"] / max(on["tokens"], 1),
            "verify_steps": on["verify_steps"], "tokens": on["tokens"],
            "identical_text": off["texts"] == on["texts"],
            "texts_off": off["texts"], "texts_spec": on["texts"]}
        r = result[name]
        print(f"{name}: {r['off_tok_s']:.1f} -> {r['spec_tok_s']:.1f} tok/s "
              f"(x{r['speedup']:.2f}; decode alone {r['off_decode_tok_s']:.1f} -> "
              f"{r['spec_decode_tok_s']:.1f}, x{r['decode_speedup']:.2f}; verify step "
              f"{r['cost_ratio'] or 0:.2f}x a plain one), accept length "
              f"{r['accept_length'] or 0:.2f} over "
              f"{r['verify_steps']} verify steps ({r['share_from_verify_steps']:.0%} of the "
              f"tokens), identical text: {r['identical_text']}",
              flush=True)
    result.update(environment(args.device), command="radixlm bench spec " + " ".join(argv))
    path = write_json(args.output or default_output_path("spec"), result)
    print_summary(f"bench spec -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
