"""What one grammar-accept costs on the host, per constrained row and step (issue 11).

The mask-overhead workload of `bench structured` (regex [a-zA-Z ,.]+, greedy, bs 64, bundled
SmolLM2) spends its constrained host work mostly in accepting each row's sampled token. This
times, for `rows` fresh matchers of that regex fed the same tokens step by step:
  - radixlm's loop (XGrammarMatcher.accept_token: one xgrammar call a row),
  - xgrammar's own Python wrapper in a loop,
  - the bare C++ handle in a loop (the floor of any Python loop),
  - xgrammar's BatchGrammarMatcher.batch_accept_token (one call a step),
  - the bare handle loop split over two Python threads, each feeding its half of the rows
    every token (whether xgrammar's accept releases the GIL: if it does, about half the time
    of one thread).

    python benchmarks/results/issue11/accept_cost/accept_cost.py --model-path TOKENIZER_DIR \
        [--out f.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import threading
import time

import xgrammar as xgr
from transformers import AutoTokenizer

from radixlm.bench.structured import MASK_REGEX
from radixlm.constrained.xgrammar_backend import XGrammarMatcher

TEXT = ("The sea is calm and blue, and the waves roll in slowly. Birds fly over the water and "
        "the sun sets behind the hills, far away.")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--rows", default="1,8,64,256")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    ns = p.parse_args()
    tok = AutoTokenizer.from_pretrained(ns.model_path)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    grammar = xgr.GrammarCompiler(info).compile_regex(MASK_REGEX)
    tokens = tok.encode(TEXT * 2, add_special_tokens=False)[:48]

    def two_threads(handles: list) -> bool:
        """Each of two threads feeds its half of the rows every token: the steps' total time,
        with one thread start, not one a step."""
        ok = [True, True]

        def part(k: int, sub: list) -> None:
            for t in tokens:
                ok[k] &= all(h.accept_token(t, False) for h in sub)
        half = len(handles) // 2
        other = threading.Thread(target=part, args=(0, handles[:half]))
        other.start()
        part(1, handles[half:])
        other.join()
        return all(ok)

    def timed(rows: int, how: str) -> float:
        best = float("inf")
        for _ in range(ns.repeats):
            ours = [XGrammarMatcher(grammar) for _ in range(rows)]
            raw = [m._m for m in ours]
            handles = [m._handle for m in raw]
            start = time.perf_counter()
            if how == "two_threads":
                assert two_threads(handles)
            else:
                step_by_step(how, ours, raw, handles)
            best = min(best, (time.perf_counter() - start) / len(tokens))
        return best * 1e6

    def step_by_step(how: str, ours: list, raw: list, handles: list) -> None:
        rows = len(ours)
        for t in tokens:
            if how == "radixlm_loop":
                ok = [m.accept_token(t) for m in ours]
            elif how == "xgrammar_loop":
                ok = [m.accept_token(t) for m in raw]
            elif how == "handle_loop":
                ok = [h.accept_token(t, False) for h in handles]
            else:
                ok = xgr.BatchGrammarMatcher.batch_accept_token(raw, [t] * rows)
            assert all(ok)

    result = {"cpu": platform.processor() or platform.machine(), "regex": MASK_REGEX,
              "us_per_step": {}}
    for rows in [int(x) for x in ns.rows.split(",")]:
        row = {how: timed(rows, how) for how in ("radixlm_loop", "xgrammar_loop", "handle_loop",
                                                "batch_accept_token", "two_threads")}
        result["us_per_step"][rows] = row
        print(f"rows {rows:4d}: " + ", ".join(f"{k} {v:7.1f} us" for k, v in row.items())
              + f"  ({row['radixlm_loop'] / rows:.2f} us a row)", flush=True)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
