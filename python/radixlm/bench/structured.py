"""`radixlm bench structured`: constrained decoding, jump-forward on vs off, and mask overhead.

1. The JSON-decoding workloads of the SGLang paper, each sent as one greedy batch: `json`, a
   character description per name under a JSON schema with many fixed keys and enums (where
   jump-forward pays off), and `regex`, fields of a short city text under a regex that spells out
   a JSON layout. Two engines run one after the other (the first is shut down first, to free
   memory): jump-forward on, then off. Per workload: requests/s, output tokens/s, forward passes
   per request, finish reasons, valid fraction (jsonschema; re.fullmatch), the on/off ratio.
2. Mask overhead, on the jump-forward-off engine: `--batch-size` requests decode exactly
   `--mask-tokens` tokens each, with a permissive regex and without; time per step = batch wall
   time / tokens, median over `--repeats` rounds after a warm-up round.

Forward passes: with jump-forward off each output token costs one; with it on, the engine reports
no step counts, so its own jump-forward planner is replayed over each output in this process (a
request whose replay does not reproduce its tokens counts as unknown).

    radixlm bench structured --num-requests 32 --batch-size 64
    python -m radixlm.bench.structured --device cpu --num-requests 2 --batch-size 2 --mask-tokens 8
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from tqdm import tqdm

from radixlm.bench import common
from radixlm.config import LOAD_FORMATS
from radixlm.utils.gc_freeze import freeze_startup_heap

NAMES = [
    "Harry Potter", "Hermione Granger", "Ron Weasley", "Albus Dumbledore", "Severus Snape",
    "Rubeus Hagrid", "Draco Malfoy", "Neville Longbottom", "Luna Lovegood", "Ginny Weasley",
    "Minerva McGonagall", "Sirius Black", "Remus Lupin", "Lord Voldemort", "Bellatrix Lestrange",
    "Dobby", "Cedric Diggory", "Cho Chang", "Fred Weasley", "George Weasley", "Percy Weasley",
    "Molly Weasley", "Arthur Weasley", "Nymphadora Tonks", "Kingsley Shacklebolt",
    "Alastor Moody", "Gilderoy Lockhart", "Dolores Umbridge", "Horace Slughorn",
    "Filius Flitwick", "Pomona Sprout", "Quirinus Quirrell", "Peter Pettigrew", "Lucius Malfoy",
    "Narcissa Malfoy", "Seamus Finnigan", "Dean Thomas", "Oliver Wood", "Viktor Krum",
]


def _text(max_length: int) -> dict[str, Any]:
    # Bounded strings keep random-weight models (load_format dummy) from rambling to the limit.
    return {"type": "string", "maxLength": max_length}


CHARACTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": _text(32),
        "house": {"enum": ["Gryffindor", "Slytherin", "Ravenclaw", "Hufflepuff"]},
        "blood status": {"enum": ["Pure-blood", "Half-blood", "Muggle-born"]},
        "occupation": {"enum": ["student", "teacher", "auror", "ministry of magic",
                                "death eater", "order of the phoenix"]},
        "wand": {"type": "object",
                 "properties": {"wood": _text(24), "core": _text(24),
                                "length": {"type": "number"}},
                 "required": ["wood", "core", "length"], "additionalProperties": False},
        "alive": {"enum": ["Alive", "Deceased"]},
        "patronus": _text(24),
        "bogart": _text(24),
    },
    "required": ["name", "house", "blood status", "occupation", "wand", "alive", "patronus",
                 "bogart"],
    "additionalProperties": False,
}

CITIES = [
    "Paris is the capital of France, on the river Seine, at a latitude of about 48.86 degrees "
    "north. Some 2.1 million people live in the city proper. Visitors come for the Eiffel "
    "Tower, the Louvre and the cathedral of Notre Dame.",
    "Tokyo, the capital of Japan, lies at latitude 35.68 on the bay of the same name. About "
    "14 million people live in the metropolis. Its best known sights include the Senso-ji "
    "temple, the Tokyo Skytree and the Meiji Shrine.",
    "Cairo is the capital of Egypt, on the Nile, at latitude 30.04. Roughly 10 million people "
    "live there. Nearby are the Giza pyramids, and in town the Egyptian Museum and the old "
    "Citadel.",
    "Sydney, the largest city of Australia, sits at latitude -33.87 around a harbour. It has "
    "about 5.3 million inhabitants and is known for its Opera House, the Harbour Bridge and "
    "Bondi Beach.",
    "Rome, capital of Italy, lies on the Tiber at latitude 41.9 and has about 2.8 million "
    "residents. Its landmarks include the Colosseum, the Pantheon and the Trevi Fountain.",
]

CITY_REGEX = (r'\{\n  "name": "[\w\d\s]{1,16}",\n  "country": "[\w\d\s]{1,16}",\n'
              r'  "latitude": [-+]?[0-9]*\.?[0-9]{0,2},\n  "population": [-+]?[0-9]{1,9},\n'
              r'  "top 3 landmarks": \["[\w\d\s]{1,16}", "[\w\d\s]{1,16}", '
              r'"[\w\d\s]{1,16}"\]\n\}')

# Mask overhead: many tokens allowed at every step, never a forced string, never finished by the
# grammar (min_new_tokens bans EOS, so every request decodes exactly --mask-tokens tokens).
MASK_REGEX = r"[a-zA-Z ,.]+"
MASK_TOPICS = ["the sea", "a mountain village", "autumn", "a train journey", "a lighthouse"]

WORKLOADS = ("json", "regex")
JSON_MAX_TOKENS = 256
REGEX_MAX_TOKENS = 128


@dataclass
class Workload:
    name: str
    prompts: list[str]
    kind: str               # "json_schema" | "regex": the sampling_params key
    spec: str               # the constraint, as sent
    max_new_tokens: int
    is_valid: Callable[[str], bool]

    def params(self) -> dict[str, Any]:
        return {"temperature": 0.0, "max_new_tokens": self.max_new_tokens, self.kind: self.spec}


@dataclass
class RunStats:
    requests: int
    wall_s: float
    output_tokens: int
    finish_reasons: dict[str, int]
    stopped: int
    valid: int
    valid_stopped: int
    forward_passes: int | None = None   # summed over requests whose count is known
    forward_passes_known: int = 0       # requests whose count is known
    wall_s_samples: list[float] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            requests_per_s=self.requests / self.wall_s,
            output_tokens_per_s=self.output_tokens / self.wall_s,
            stop_fraction=self.stopped / self.requests,
            valid_fraction=self.valid / self.requests,
            valid_fraction_of_stopped=self.valid_stopped / self.stopped if self.stopped else None,
            forward_passes_per_request=(self.forward_passes / self.forward_passes_known
                                        if self.forward_passes_known else None))
        return out


def _valid_character(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if importlib.util.find_spec("jsonschema") is None:  # a test-only dependency of radixlm
        return isinstance(value, dict)
    import jsonschema
    return jsonschema.Draft202012Validator(CHARACTER_SCHEMA).is_valid(value)


def build_workloads(engine, num_requests: int, names: list[str]) -> list[Workload]:
    keys = "name, house, blood status, occupation, wand (wood, core, length), alive, patronus, " \
           "bogart"
    # Names (and cities) repeat past the list's end; a repeat is then a radix-cache hit.
    json_prompts = [common.chat_prompt(engine, f"Give the character information of "
                                               f"{NAMES[i % len(NAMES)]} from the Harry Potter "
                                               f"books as a JSON object with the keys {keys}.")
                    for i in range(num_requests)]
    city_prompts = [common.chat_prompt(engine, f"Here is a text about a city:\n\n"
                                               f"{CITIES[i % len(CITIES)]}\n\nExtract the city's "
                                               f"name, country, latitude, population and top 3 "
                                               f"landmarks as JSON.")
                    for i in range(num_requests)]
    return [wl for wl in [
        Workload("json", json_prompts, "json_schema", json.dumps(CHARACTER_SCHEMA),
                 JSON_MAX_TOKENS, _valid_character),
        Workload("regex", city_prompts, "regex", CITY_REGEX, REGEX_MAX_TOKENS,
                 lambda text: re.fullmatch(CITY_REGEX, text) is not None),
    ] if wl.name in names]


def _flush(engine) -> None:
    # Every timed batch starts from an empty prefix cache, so that runs compare like with like.
    if not engine.flush_cache():
        print("warning: flush_cache refused; this run may start with a warm cache", file=sys.stderr)


def run_workload(engine, wl: Workload, repeats: int = 1) -> tuple[RunStats, list[dict]]:
    """The whole workload as one batch, from an empty prefix cache, `repeats` times; wall_s is
    the median (single runs of a second or two spread widely on a host-bound small model)."""
    walls = []
    for _ in range(repeats):
        _flush(engine)
        outs, wall = common.timed(
            lambda: engine.generate(wl.prompts, [wl.params()] * len(wl.prompts)))
        walls.append(wall)
    stopped = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    return RunStats(
        requests=len(outs), wall_s=common.median(walls), wall_s_samples=walls,
        output_tokens=sum(o["meta_info"]["completion_tokens"] for o in outs),
        finish_reasons=common.finish_counts(outs), stopped=len(stopped),
        valid=sum(wl.is_valid(o["text"]) for o in outs),
        valid_stopped=sum(wl.is_valid(o["text"]) for o in stopped)), outs


# ---------------------------------------------------------------------- forward passes

def _replay_passes(tokenizer, matcher, output_ids: list[int], max_new_tokens: int,
                   eos_ids: set[int]) -> int | None:
    """Passes the engine needed for these jump-forward outputs: one per sampled token. Mirrors
    the scheduler's order (stop checks, grammar, then jump) and the non-streaming send rule (the
    first token is sent unless its step jumped), which decides how much tail plan_jump may
    re-tokenize. None when the replay does not reproduce the tokens (the engine changed)."""
    from radixlm.constrained.jump_forward import plan_jump

    out: list[int] = []
    sent = passes = 0
    while len(out) < len(output_ids):
        token = output_ids[len(out)]
        out.append(token)
        passes += 1
        if len(out) >= max_new_tokens or token in eos_ids:
            break
        if not matcher.accept_token(token):
            return None
        if matcher.is_terminated():
            break
        jump = plan_jump(tokenizer, matcher, out, len(out) - sent, max_new_tokens - len(out))
        if jump is None:
            sent = len(out) if len(out) == 1 else sent
            continue
        del out[len(out) - jump.num_replaced:]
        out.extend(jump.new_tokens)
        if out != output_ids[:len(out)]:
            return None
        if len(out) >= max_new_tokens or matcher.is_terminated():
            break
    return passes if out == output_ids else None


def count_forward_passes(engine, wl: Workload, outs: list[dict], jump_forward: bool,
                         stats: RunStats) -> None:
    if not jump_forward:  # a prefill pass for the first token, then a decode pass per token
        stats.forward_passes = stats.output_tokens
        stats.forward_passes_known = stats.requests
        return
    from radixlm.constrained.base import ConstraintKey
    from radixlm.constrained.xgrammar_backend import XGrammarBackend

    ready = engine.ready
    backend = XGrammarBackend(engine.tokenizer, ready.vocab_size, list(ready.eos_token_ids))
    try:
        compiled = backend.compile(ConstraintKey(wl.kind, wl.spec)).result()
        counts = [_replay_passes(engine.tokenizer, backend.matcher(compiled), o["output_ids"],
                                 wl.max_new_tokens, set(ready.eos_token_ids)) for o in outs]
    finally:
        backend.shutdown()
    known = [c for c in counts if c is not None]
    stats.forward_passes = sum(known) if known else None
    stats.forward_passes_known = len(known)


# ---------------------------------------------------------------------- mask overhead

def measure_mask_overhead(engine, batch_size: int, tokens: int, repeats: int) -> dict[str, Any]:
    prompts = [common.chat_prompt(engine, f"({i + 1}) Write a few sentences about "
                                          f"{MASK_TOPICS[i % len(MASK_TOPICS)]}.")
               for i in range(batch_size)]
    base = {"temperature": 0.0, "max_new_tokens": tokens, "min_new_tokens": tokens}
    constrained_params = {**base, "regex": MASK_REGEX}
    # "mixed": every other request constrained, to see what grammar rows cost the free ones.
    variants = {"unconstrained": [base] * batch_size,
                "constrained": [constrained_params] * batch_size,
                "mixed": [constrained_params if i % 2 else base for i in range(batch_size)]}
    step_s: dict[str, list[float]] = {name: [] for name in variants}
    last: dict[str, list[dict]] = {}
    rejections = {name: 0 for name in variants}
    device_rows = {name: 0 for name in variants}
    # Steps a round (decode, extend): a variant taking more steps for the same tokens (its
    # requests admitted apart, say) shows here rather than as a slower step.
    steps = {name: [0, 0] for name in variants}
    rounds = tqdm(range(repeats + 1), desc="mask overhead rounds", file=sys.stderr)
    order = list(variants)
    for rep in rounds:  # the first round warms up (grammar compile, kernels)
        # Each round starts with the next variant (a drift or a slow spell of the host does
        # not always land on the same one).
        for name in order[rep % len(order):] + order[:rep % len(order)]:
            params = variants[name]
            _flush(engine)
            before = engine.get_stats()
            outs, wall = common.timed(lambda: engine.generate(prompts, params))
            if rep > 0:
                after = engine.get_stats()
                step_s[name].append(wall / tokens)
                rejections[name] += after.grammar_rejections - before.grammar_rejections
                device_rows[name] += after.grammar_device_rows - before.grammar_device_rows
                steps[name][0] += after.decode_steps - before.decode_steps
                steps[name][1] += after.extend_steps - before.extend_steps
            last[name] = outs
    med = {name: common.median(v) for name, v in step_s.items()}
    constrained = last["constrained"]
    return {
        "batch_size": batch_size, "tokens_per_request": tokens, "repeats": repeats,
        "regex": MASK_REGEX,
        "unconstrained_step_ms": 1e3 * med["unconstrained"],
        "constrained_step_ms": 1e3 * med["constrained"],
        "overhead": med["constrained"] / med["unconstrained"] - 1,
        "mixed_step_ms": 1e3 * med["mixed"],
        "mixed_overhead": med["mixed"] / med["unconstrained"] - 1,
        "samples_step_ms": {k: [1e3 * x for x in v] for k, v in step_s.items()},
        # Unmasked tokens the grammar rejected (sampled again under the mask), per timed round.
        "grammar_rejections_per_round": {k: v / repeats for k, v in rejections.items()},
        # Rows masked from their grammar state on the device (scheduler/grammar_states.py).
        "grammar_device_rows_per_round": {k: v / repeats for k, v in device_rows.items()},
        "decode_steps_per_round": {k: v[0] / repeats for k, v in steps.items()},
        "extend_steps_per_round": {k: v[1] / repeats for k, v in steps.items()},
        # Every request must have decoded the full length, or the per-step times are not equal work.
        "all_full_length": all(o["meta_info"]["completion_tokens"] == tokens
                               for outs in last.values() for o in outs),
        "constrained_valid_fraction": sum(re.fullmatch(MASK_REGEX, o["text"]) is not None
                                          for o in constrained) / len(constrained),
    }


# ---------------------------------------------------------------------- driver

def _engine_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    return {"model_path": ns.model_path, "load_format": ns.load_format, "device": ns.device,
            "max_total_tokens": ns.max_total_tokens, "attention_backend": ns.attention_backend,
            "log_level": ns.log_level,
            "disable_optimistic_grammar": ns.disable_optimistic_grammar}


def _phase(ns: argparse.Namespace, jump_forward: bool) -> dict[str, Any]:
    """Start an engine, run the workloads (and, jump-forward off, the mask overhead), stop it."""
    from radixlm.entrypoints.engine import Engine

    engine = Engine(**_engine_kwargs(ns), disable_jump_forward=not jump_forward)
    # The engine's tokenizer side runs in this process: its full collection passes (~0.1 s over
    # the start-up heap) would land inside a timed round (utils/gc_freeze.py).
    freeze_startup_heap()
    try:
        workloads = build_workloads(engine, ns.num_requests, ns.workloads)
        for wl in workloads:  # warm-up: compile the grammars, pay first-call costs
            n = min(2, len(wl.prompts))
            engine.generate(wl.prompts[:n], [{**wl.params(), "max_new_tokens": 4}] * n)
        label = f"workloads (jump-forward {'on' if jump_forward else 'off'})"
        runs = {wl.name: run_workload(engine, wl, ns.workload_repeats)
                for wl in tqdm(workloads, desc=label, file=sys.stderr)}
        mask = None
        if not jump_forward:
            mask = measure_mask_overhead(engine, ns.batch_size, ns.mask_tokens, ns.repeats)
            # Other batch sizes (--mask-batch-sizes), reported beside the main figure.
            mask["other_batch_sizes"] = [
                measure_mask_overhead(engine, bs, ns.mask_tokens, ns.repeats)
                for bs in ns.mask_batch_sizes if bs != ns.batch_size]
        info = {"grammar_rejections": engine.get_stats().grammar_rejections,
                "server_args": dataclasses.asdict(engine.server_args),
                "resolved_model_path": engine.ready.model_path, "device": engine.ready.device,
                "dtype": engine.ready.dtype}
    finally:
        engine.shutdown()
    for wl in workloads:  # CPU-only work in this process, after the engine is gone
        count_forward_passes(engine, wl, runs[wl.name][1], jump_forward, runs[wl.name][0])
    return {"workloads": workloads, "runs": runs, "mask": mask, "engine": info}


def _compare(on: tuple[RunStats, list[dict]], off: tuple[RunStats, list[dict]]) -> dict[str, Any]:
    (s_on, o_on), (s_off, o_off) = on, off
    j_on, j_off = s_on.to_json(), s_off.to_json()
    p_on, p_off = j_on["forward_passes_per_request"], j_off["forward_passes_per_request"]
    return {"on": j_on, "off": j_off, "speedup": s_off.wall_s / s_on.wall_s,
            "forward_pass_reduction": 1 - p_on / p_off if p_on is not None and p_off else None,
            "identical_text_fraction": sum(a["text"] == b["text"] for a, b in zip(o_on, o_off))
                                       / len(o_on),
            "example_output": o_on[0]["text"]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench structured",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=None, help="default: the bundled model")
    p.add_argument("--load-format", default="auto", choices=LOAD_FORMATS)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--disable-optimistic-grammar", action="store_true",
                   help="every constrained row samples under its grammar mask")
    p.add_argument("--num-requests", type=int, default=32,
                   help="requests of each workload, sent as one batch")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
                   help="comma-separated subset of the jump-forward workloads: json, regex")
    p.add_argument("--workload-repeats", type=int, default=3,
                   help="timed runs of each jump-forward workload (the median is reported)")
    p.add_argument("--batch-size", type=int, default=64, help="batch of the mask-overhead test")
    p.add_argument("--mask-batch-sizes", default=[],
                   type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                   help="more batch sizes for the mask-overhead test, e.g. 1,8,256")
    p.add_argument("--mask-tokens", type=int, default=64,
                   help="tokens each request decodes in the mask-overhead test")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed rounds of the mask-overhead test (the median is reported)")
    p.add_argument("--output", default=None,
                   help="JSON results (default benchmarks/structured_<timestamp>.json)")
    return p


def _jump_forward_figures(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    per = {wl.name: _compare(on["runs"][wl.name], off["runs"][wl.name]) for wl in on["workloads"]}
    st_on = [s for s, _ in on["runs"].values()]
    st_off = [s for s, _ in off["runs"].values()]
    # Only a reduction over the same requests means anything: every count must be known.
    known = all(s.forward_passes_known == s.requests for s in st_on + st_off)
    p_on, p_off = (sum(s.forward_passes or 0 for s in st) for st in (st_on, st_off))
    return {"speedup": sum(s.wall_s for s in st_off) / sum(s.wall_s for s in st_on),
            "forward_pass_reduction": 1 - p_on / p_off if known and p_off else None,
            "workloads": per}


def _summary(results: dict[str, Any]) -> str:
    jf, mask = results["jump_forward"], results["mask_overhead"]
    parts = ", ".join(f"{k} {v['speedup']:.2f}x" for k, v in jf["workloads"].items())
    if jf["forward_pass_reduction"] is not None:
        parts += f"; passes {common.pct(-jf['forward_pass_reduction'])}"
    return (f"structured: jump-forward {jf['speedup']:.2f}x ({parts}), "
            f"mask overhead {common.pct(mask['overhead'])} at bs {mask['batch_size']}"
            f" (half constrained: {common.pct(mask['mixed_overhead'])})"
            + "".join(f" ({common.pct(m['overhead'])} at bs {m['batch_size']})"
                      for m in mask.get("other_batch_sizes", [])) + ", "
            f"valid {common.pct(results['valid_fraction_of_stopped'])} of stopped "
            f"(stop {common.pct(results['stop_fraction'])})")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    common.require_positive(parser, ns, "num_requests", "batch_size", "mask_tokens", "repeats",
                            "workload_repeats")
    if not ns.workloads or set(ns.workloads) - set(WORKLOADS):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    on = _phase(ns, jump_forward=True)
    off = _phase(ns, jump_forward=False)

    all_stats = [s for ph in (on, off) for s, _ in ph["runs"].values()]
    stopped = sum(s.stopped for s in all_stats)
    results = {
        "benchmark": "structured",
        "argv": list(sys.argv[1:] if argv is None else argv),
        **common.environment(ns.device),
        "engine_args": _engine_kwargs(ns),
        "engines": {"jump_forward_on": on["engine"], "jump_forward_off": off["engine"]},
        "settings": {"num_requests": ns.num_requests, "workloads": ns.workloads,
                     "json_max_new_tokens": JSON_MAX_TOKENS,
                     "regex_max_new_tokens": REGEX_MAX_TOKENS, "temperature": 0.0,
                     "json_validator": "jsonschema" if importlib.util.find_spec("jsonschema")
                                       else "json.loads only"},
        "constraints": {"json_schema": CHARACTER_SCHEMA, "regex": CITY_REGEX},
        "jump_forward": _jump_forward_figures(on, off),
        "mask_overhead": off["mask"],
        "stop_fraction": stopped / sum(s.requests for s in all_stats),
        "valid_fraction_of_stopped": (sum(s.valid_stopped for s in all_stats) / stopped
                                      if stopped else None),
    }
    results["summary"] = line = _summary(results)
    path = common.write_json(ns.output or common.default_output_path("structured"), results)
    print(f"results written to {path}", file=sys.stderr)
    common.print_summary(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
