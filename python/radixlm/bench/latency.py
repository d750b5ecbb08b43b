"""`radixlm bench latency`: one request at a time, end to end, through the offline Engine.

For each prompt of `radixlm bench spec`'s copy and chat workloads (chat template applied) and
each of several max_new_tokens (ignore_eos), the best of `--repeats` requests, every request
alone. After the first the prompt is in the prefix cache, so a 1-token request measures the
fixed cost of a request: the engine's round trip plus the step that computes the prompt's last
token and samples (an extend step of its own, or rows of a decode step: scheduler/
short_prefill.py, RADIXLM_SHORT_PREFILL_TOKENS); the slope over max_new_tokens is the cost of a
decode step.

    radixlm bench latency --model-path benchmarks/configs/llama-3.2-1b --load-format dummy
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

from radixlm.bench.common import default_output_path, environment, print_summary, write_json
from radixlm.bench.spec import CHAT, COPY
from radixlm.utils.gc_freeze import freeze_startup_heap


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None, help="default: the bundled model")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--output-lens", type=int, nargs="+", default=[1, 2, 32, 128])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    from radixlm.entrypoints.engine import Engine
    engine = Engine(model_path=args.model_path, load_format=args.load_format, dtype=args.dtype,
                    device=args.device, log_level="warning")
    freeze_startup_heap()   # (this process's: no full collection pass inside a timing)
    rows: list[dict[str, Any]] = []
    try:
        for workload, prompts in (("copy", COPY), ("chat", CHAT)):
            for text in prompts:
                prompt = engine.apply_chat_template([{"role": "user", "content": text}])
                best: dict[str, float] = {}
                for n in args.output_lens:
                    times = []
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        out = engine.generate(prompt, {"max_new_tokens": n, "temperature": 0.0,
                                                       "ignore_eos": True})
                        times.append(time.perf_counter() - t)
                    best[str(n)] = min(times)
                rows.append({"workload": workload, "prompt_tokens":
                             out["meta_info"]["prompt_tokens"], "best_s": best})
                print(workload, rows[-1]["prompt_tokens"], " | ".join(
                    f"n={n} {1e3 * s:.2f} ms" for n, s in best.items()), flush=True)
        stats = engine.get_stats()
    finally:
        engine.shutdown()
    one = sorted(r["best_s"][str(args.output_lens[0])] for r in rows)
    result = {"rows": rows, "short_prefills": stats.short_prefills,
              "median_first_len_s": one[len(one) // 2]}
    result.update(environment(args.device), command="radixlm bench latency " + " ".join(argv))
    path = write_json(args.output or default_output_path("latency"), result)
    print_summary(f"bench latency: median {1e3 * result['median_first_len_s']:.2f} ms for "
                  f"{args.output_lens[0]} token(s), {stats.short_prefills} prompts in decode "
                  f"steps -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
