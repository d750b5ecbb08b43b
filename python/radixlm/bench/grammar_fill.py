"""`radixlm bench grammar-fill`: what filling one step's grammar masks costs on this host.

The grammars of `bench structured` (the JSON character schema, the city regex, the permissive
mask regex) are compiled with the model's tokenizer; `--batch-size` matchers per grammar are
advanced to different points of a typical output (so the batch holds a mix of states), and one
batched fill of their bitmask rows is timed serially and on 2 / 4 / 8 / 16 of xgrammar's
threads (median of `--repeats`). Also timed: one serial fill in a worker thread beside Python
work on this one (does the fill release the GIL? if so the two overlap).

    python -m radixlm.bench.grammar_fill --tokenizer-path <model dir> --batch-size 32
"""

from __future__ import annotations

import argparse
import functools
import json
import threading
from typing import Any, Callable

from radixlm.bench import common
from radixlm.bench.structured import CHARACTER_SCHEMA, CITY_REGEX, MASK_REGEX

THREADS = (1, 2, 4, 8, 16)
# What the model typically writes under each grammar (the matchers are advanced into these).
EXAMPLES = {
    "json_schema": '{"name": "Harry Potter", "house": "Gryffindor", "blood status": "Half-blood", '
                   '"occupation": "student", "wand": {"wood": "holly", "core": "phoenix '
                   'feather", "length": 11}, "alive": "Alive", "patronus": "stag", "bogart": '
                   '"dementor"}',
    "city_regex": '{\n  "name": "Paris",\n  "country": "France",\n  "latitude": 48.86,\n  '
                  '"population": 2102650,\n  "top 3 landmarks": ["Eiffel Tower", "Louvre", '
                  '"Notre Dame"]\n}',
    "mask_regex": "The sea is a vast body of water, and the waves move slowly along the shore.",
}


def _ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of `repeats` calls, in milliseconds."""
    return 1e3 * common.median(common.timed(fn)[1] for _ in range(repeats))


def _python_work(n: int = 200_000) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def measure(tokenizer, vocab_size: int, eos: list[int], batch_size: int,
            repeats: int) -> dict[str, Any]:
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                              stop_token_ids=eos)
    compiler = xgr.GrammarCompiler(info)
    grammars = {
        "json_schema": compiler.compile_json_schema(json.dumps(CHARACTER_SCHEMA),
                                                    any_whitespace=False),
        "city_regex": compiler.compile_regex(CITY_REGEX),
        "mask_regex": compiler.compile_regex(MASK_REGEX),
    }
    out: dict[str, Any] = {}
    for name, grammar in grammars.items():
        ids = tokenizer.encode(EXAMPLES[name], add_special_tokens=False)
        matchers = []
        for i in range(batch_size):
            m = xgr.GrammarMatcher(grammar)
            for t in ids[:(i * 7) % len(ids)]:
                if not m.accept_token(t):
                    break
            matchers.append(m)
        mask = xgr.allocate_token_bitmask(batch_size, vocab_size)
        rows = list(range(batch_size))
        fills = {threads: functools.partial(
                     xgr.BatchGrammarMatcher(threads).batch_fill_next_token_bitmask,
                     matchers, mask, rows) for threads in THREADS}
        fill_ms = {}
        for threads, fill in fills.items():
            fill()  # warm-up: the threaded filler starts its workers on the first call
            fill_ms[threads] = _ms(fill, repeats)
        python_ms = _ms(_python_work, repeats)
        worker = threading.Thread(target=fills[1])
        with common.Timed() as beside:
            worker.start()
            _python_work()
            worker.join()
        beside_ms = 1e3 * beside.seconds
        out[name] = {
            "fill_ms_by_threads": fill_ms,
            "per_row_us_serial": 1e3 * fill_ms[1] / batch_size,
            "python_work_ms": python_ms,
            "fill_in_thread_beside_python_ms": beside_ms,
            # ~1: the fill ran beside the Python work (GIL released); ~0: one waited for the other.
            "overlap_fraction": max(0.0, (fill_ms[1] + python_ms - beside_ms)
                                    / min(fill_ms[1], python_ms)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer-path", required=True, help="model directory or GGUF file")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--output", default=None)
    ns = p.parse_args(argv)
    common.require_positive(p, ns, "batch_size", "repeats")
    from radixlm.model_executor.weight_source import load_tokenizer
    tokenizer = load_tokenizer(ns.tokenizer_path)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    results = measure(tokenizer, len(tokenizer), eos, ns.batch_size, ns.repeats)
    record = {"benchmark": "grammar_fill", **common.environment("cpu"),
              "settings": vars(ns), "results": results}
    path = common.write_json(ns.output or common.default_output_path("grammar_fill"), record)
    parts = [f"{name}: serial {r['fill_ms_by_threads'][1]:.2f} ms, 8 threads "
             f"{r['fill_ms_by_threads'][8]:.2f} ms, overlap with Python "
             f"{r['overlap_fraction']:.2f}" for name, r in results.items()]
    common.print_summary(f"grammar fill bs {ns.batch_size}: " + "; ".join(parts) + f" -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
