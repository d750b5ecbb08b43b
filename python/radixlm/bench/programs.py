"""`radixlm bench programs`: frontend-language programs, with the radix cache on and off.

Three workloads whose prompts share prefixes the way real programs do:
- mc:    5-shot multiple choice: every prompt repeats the same five worked examples, then asks
         its own question and selects one of " A".." D" (four scored continuations);
- judge: the multi-dimension LLM judge: one essay per program, six forks that share it, then a
         summary gen;
- tot:   tree of thought: two plans per question, two attempts per plan, a yes/no check each.

Each workload runs `--num-programs` programs through `run_batch` and reports programs/s and the
cache hit rate (cached prompt tokens / prompt tokens over the workload's requests). Generations
have fixed lengths (ignore_eos, seeded sampling) so that both settings do the same work.

Backends: by default two in-process engines, one after the other, started from the server flags
given here (`--model-path`, `--mem-fraction-static`, ...): with the radix cache, and with
`--disable-radix-cache`. With `--url` (and optionally `--url-no-cache`) running servers are used.
Prints one summary line and writes JSON (`--output`).

    radixlm bench programs --num-programs 64
    python -m radixlm.bench.programs --device cpu --num-programs 4 --max-tokens 4   # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import radixlm.lang as rl
from radixlm.bench.common import default_output_path, environment, write_json
from radixlm.config import ServerArgs

WORKLOADS = ("mc", "judge", "tot")


# ---------------------------------------------------------------------- workloads

SHOTS = [("What is 12 + 7?", ["17", "19", "21", "18"], "B"),
         ("What is 9 x 3?", ["27", "24", "36", "12"], "A"),
         ("Which number is even?", ["7", "13", "21", "8"], "D"),
         ("What is 50 - 15?", ["25", "30", "35", "45"], "C"),
         ("What is 100 / 4?", ["20", "25", "40", "50"], "B")]


def _mc_question(rng: random.Random) -> tuple[str, list[str]]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    options = [str(a + b + d) for d in rng.sample([-10, -1, 0, 1, 10], 4)]
    if str(a + b) not in options:
        options[rng.randrange(4)] = str(a + b)
    return f"What is {a} + {b}?", options


def _format_mc(question: str, options: list[str]) -> str:
    return "\n".join([f"Question: {question}"] +
                     [f"{letter}. {o}" for letter, o in zip("ABCD", options)]) + "\nAnswer:"


@rl.function
def few_shot_mc(s, question: str, options: list[str]):
    s += "The following are multiple choice questions about arithmetic, with answers.\n\n"
    for q, opts, answer in SHOTS:
        s += _format_mc(q, opts) + f" {answer}\n\n"
    s += _format_mc(question, options)
    s += rl.select("answer", choices=[" A", " B", " C", " D"])


DIMENSIONS = ["clarity", "accuracy", "originality", "structure", "engagement", "concision"]
_TOPICS = ["rainbows", "volcanoes", "bees", "tides", "glaciers", "comets", "coral reefs",
           "deserts", "thunder", "photosynthesis", "magnets", "earthquakes"]


def _essay(rng: random.Random, i: int) -> str:
    topic = _TOPICS[i % len(_TOPICS)]
    sentences = [f"This essay, number {i}, is about {topic}.",
                 f"People have studied {topic} for a very long time.",
                 f"Scientists explain {topic} with simple physical ideas.",
                 f"Many children first learn about {topic} at school.",
                 f"There is still a lot we do not know about {topic}."]
    rng.shuffle(sentences)
    return " ".join(sentences * 2)


@rl.function
def llm_judge(s, essay: str, max_tokens: int):
    s += rl.system("You are a fair and strict judge of short essays.")
    s += rl.user_begin() + "Here is an essay:\n\n" + essay + "\n\n"
    forks = s.fork(len(DIMENSIONS))
    for f, dim in zip(forks, DIMENSIONS):
        f += f"Judge its {dim} in one sentence." + rl.user_end()
        f += rl.assistant(rl.gen("judgement", max_tokens=max_tokens))
    forks.join()
    s += "Summary of the judgements:\n" + "\n".join(s["judgement"]) + rl.user_end()
    s += rl.assistant("Overall: " + rl.gen("overall", max_tokens=max_tokens))


@rl.function
def tree_of_thought(s, question: str, max_tokens: int, seed: int):
    s += "Answer the question by making a plan first.\nQuestion: " + question + "\n"
    plans = s.fork(2)
    for i, plan in enumerate(plans):
        plan += "Plan:" + rl.gen("plan", max_tokens=max_tokens, temperature=0.8, seed=seed + i)
    leaves = []
    for i, plan in enumerate(plans):   # fork() waits for this plan only; the other runs on
        attempts = plan.fork(2)
        for j, attempt in enumerate(attempts):
            attempt += "\nAnswer:" + rl.gen("answer", max_tokens=max_tokens, temperature=0.8,
                                            seed=seed + 10 * (i + 1) + j)
            attempt += "\nIs the answer correct?" + rl.select("ok", choices=[" yes", " no"])
        leaves.append(attempts)
    for attempts in leaves:
        attempts.join()


def make_batch(workload: str, n: int, max_tokens: int, seed: int = 0
               ) -> tuple[Any, list[dict[str, Any]]]:
    rng = random.Random(seed)
    if workload == "mc":
        return few_shot_mc, [dict(zip(("question", "options"), _mc_question(rng)))
                             for _ in range(n)]
    if workload == "judge":
        return llm_judge, [{"essay": _essay(rng, i), "max_tokens": max_tokens} for i in range(n)]
    if workload == "tot":
        return tree_of_thought, [{"question": "What is %d + %d?" % (rng.randint(10, 99),
                                                                   rng.randint(10, 99)),
                                  "max_tokens": max_tokens, "seed": 1000 * i} for i in range(n)]
    raise ValueError(f"unknown workload {workload!r}; choose from {WORKLOADS}")


# ---------------------------------------------------------------------- running

@dataclass
class Result:
    workload: str
    radix_cache: bool
    num_programs: int
    seconds: float
    programs_per_s: float
    cache_hit_rate: float            # over this workload's requests (from their meta_info)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    requests: int
    errors: int
    server_cache_hit_rate: float | None   # the server's own figure, cumulative since its start


def run_workload(backend: rl.Backend, workload: str, radix_cache: bool, ns: argparse.Namespace
                 ) -> Result:
    program, batch = make_batch(workload, ns.num_programs, ns.max_tokens, ns.seed)
    if ns.warmup:  # first-request costs (compilation, CUDA graphs) stay out of the timing
        warm_program, warm_batch = make_batch(workload, min(ns.warmup, ns.num_programs),
                                              ns.max_tokens, ns.seed + 1)
        warm_program.run_batch(warm_batch, backend=backend, temperature=0, ignore_eos=True)
    backend.flush_cache()   # every measurement starts from an empty cache
    backend.usage.reset()
    start = time.perf_counter()
    states = program.run_batch(batch, backend=backend, num_threads=ns.num_threads,
                               temperature=0, ignore_eos=True, progress_bar=ns.progress_bar)
    seconds = time.perf_counter() - start
    errors = [s.error() for s in states if s.error() is not None]
    if errors:
        print(f"{workload}: {len(errors)} programs failed, first: {errors[0]}", file=sys.stderr)
    u = backend.usage.snapshot()
    server_rate = backend.get_server_info().get("cache_hit_rate")
    return Result(workload, radix_cache, len(batch), seconds, len(batch) / seconds,
                  u["cache_hit_rate"], u["prompt_tokens"], u["cached_tokens"],
                  u["completion_tokens"], u["requests"], len(errors), server_rate)


def _engine_backend(server_args: ServerArgs, radix_cache: bool) -> rl.Backend:
    from radixlm.lang.backends.engine import EngineBackend
    args = dataclasses.replace(server_args, disable_radix_cache=not radix_cache)
    return EngineBackend(**dataclasses.asdict(args))


def run_all(ns: argparse.Namespace, server_args: ServerArgs) -> list[Result]:
    settings: list[tuple[bool, Callable[[], rl.Backend]]] = []
    if ns.url:
        from radixlm.lang.backends.runtime_endpoint import RuntimeEndpoint
        settings.append((True, lambda: RuntimeEndpoint(ns.url)))
        if ns.url_no_cache:
            settings.append((False, lambda: RuntimeEndpoint(ns.url_no_cache)))
    else:
        settings += [(True, lambda: _engine_backend(server_args, True)),
                     (False, lambda: _engine_backend(server_args, False))]
    results = []
    for radix_cache, make in settings:
        backend = make()
        try:
            for workload in ns.workloads:
                res = run_workload(backend, workload, radix_cache, ns)
                print(f"  {workload:>5} radix cache {'on ' if radix_cache else 'off'}: "
                      f"{res.programs_per_s:8.2f} programs/s, hit rate {res.cache_hit_rate:.2f}"
                      f" ({res.seconds:.1f} s)", file=sys.stderr)
                results.append(res)
        finally:
            backend.shutdown()
    return results


def summary_line(results: list[Result]) -> str:
    parts = []
    for workload in dict.fromkeys(r.workload for r in results):
        on = next((r for r in results if r.workload == workload and r.radix_cache), None)
        off = next((r for r in results if r.workload == workload and not r.radix_cache), None)
        text = f"{workload}: "
        if on:
            text += f"{on.programs_per_s:.2f} prog/s (cache on, hit {on.cache_hit_rate:.2f})"
        if off:
            text += f"{' vs ' if on else ''}{off.programs_per_s:.2f} (off)"
        if on and off:
            text += f" x{on.programs_per_s / off.programs_per_s:.2f}"
        parts.append(text)
    return "bench programs | " + " | ".join(parts)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench programs", description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated, from {WORKLOADS}")
    p.add_argument("--num-programs", type=int, default=64)
    p.add_argument("--num-threads", type=int, default=64, help="programs in flight at once")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per generation")
    p.add_argument("--warmup", type=int, default=2, help="programs run before timing (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", default=None, help="use a running server instead of engines")
    p.add_argument("--url-no-cache", default=None,
                   help="with --url: a second server started with --disable-radix-cache")
    p.add_argument("--output", default=None,
                   help="JSON results file (default: benchmarks/programs_<time>.json)")
    p.add_argument("--progress-bar", action="store_true")
    ServerArgs.add_cli_args(p)   # flags of the engines this starts (without --url)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    ns.workloads = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    for w in ns.workloads:
        if w not in WORKLOADS:
            raise SystemExit(f"radixlm bench programs: unknown workload {w!r}; use {WORKLOADS}")
    if ns.num_programs < 1 or ns.num_threads < 1 or ns.max_tokens < 1:
        raise SystemExit("radixlm bench programs: --num-programs, --num-threads and "
                         "--max-tokens must be >= 1")
    if ns.log_level == "info":
        ns.log_level = "warning"   # engine start-up logs would bury the results
    server_args = ServerArgs.from_cli_args(ns)
    results = run_all(ns, server_args)
    line = summary_line(results)
    config = {k: v for k, v in vars(ns).items()
              if v is None or isinstance(v, (str, int, float, bool, list))}
    path = write_json(ns.output or default_output_path("programs"), {
        "summary": line, "argv": list(argv) if argv is not None else sys.argv[1:],
        "environment": environment(ns.device), "config": config,
        "results": [dataclasses.asdict(r) for r in results]})
    print(f"results: {path}", file=sys.stderr)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
