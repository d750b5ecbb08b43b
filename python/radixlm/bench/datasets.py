"""Synthetic request sets shared by `radixlm bench offline` and `radixlm bench serving`.

Every request is a list of prompt token ids plus the exact number of tokens to generate; the
benchmarks send `ignore_eos` so that the work done is known in advance and two runs (two
engines, or the engine and HF transformers) do the same work.

- `random`: input and output lengths uniform in [min, max], token ids uniform over a pool of
  ordinary (non-special) ids, from a seeded numpy Generator.
- `shared-prefix`: `num_groups` long random system prompts, each shared by `prompts_per_group`
  requests that append their own random question: what the radix cache is for.
- `nano-vllm`: the workload of nano-vllm's bench.py (Qwen3-0.6B): 256 requests, lengths uniform
  in 100..1024, ids uniform in 0..10000, drawn in the same order from Python's `random` seeded
  with 0, so that the numbers compare with the ones its README quotes.

Text backends (the OpenAI API) need text, not ids: `fit_text` turns ids into a string that the
tokenizer encodes back to the requested length (random ids seldom round-trip exactly).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

DATASETS = ("random", "shared-prefix", "nano-vllm")

# nano-vllm's bench.py draws prompt ids with randint(0, 10000): inclusive bounds.
NANO_VLLM_MAX_ID = 10000


@dataclass
class BenchRequest:
    input_ids: list[int]
    output_len: int
    group: int = -1                  # shared-prefix group (-1: none)
    prefix_len: int = 0              # leading ids shared with the rest of the group
    prompt: str | None = None        # text form, only for text backends (see fit_text)


@dataclass
class DatasetArgs:
    dataset: str = "random"
    num_prompts: int = 256
    min_input_len: int = 100
    max_input_len: int = 1024
    min_output_len: int = 100
    max_output_len: int = 1024
    num_groups: int = 4
    prompts_per_group: int = 16
    system_prompt_len: int = 1024
    question_len: int = 128
    shuffle: bool = False            # shared-prefix: mix the groups' requests
    seed: int = 0
    # Provenance for the JSON: which preset filled in the defaults.
    notes: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset must be one of {DATASETS}, got {self.dataset!r}")
        for name in ("num_prompts", "min_input_len", "min_output_len", "num_groups",
                     "prompts_per_group", "system_prompt_len", "question_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_input_len < self.min_input_len:
            raise ValueError("--max-input-len must be >= --min-input-len")
        if self.max_output_len < self.min_output_len:
            raise ValueError("--max-output-len must be >= --min-output-len")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    """Dataset flags. Length and count flags default to None so that a preset (nano-vllm) can
    tell them apart from values the user gave."""
    g = parser.add_argument_group("dataset")
    g.add_argument("--dataset", default="random", choices=DATASETS)
    g.add_argument("--num-prompts", type=int, default=None,
                   help="requests (random, nano-vllm; shared-prefix: groups x per group)")
    for name in ("min-input-len", "max-input-len", "min-output-len", "max-output-len"):
        g.add_argument(f"--{name}", type=int, default=None)
    g.add_argument("--num-groups", type=int, default=None, help="shared-prefix groups")
    g.add_argument("--prompts-per-group", type=int, default=None)
    g.add_argument("--system-prompt-len", type=int, default=None,
                   help="tokens of each group's shared prefix")
    g.add_argument("--question-len", type=int, default=None,
                   help="tokens each shared-prefix request adds after the prefix")
    g.add_argument("--shuffle", action="store_true",
                   help="shared-prefix: interleave the groups (default: group after group)")
    g.add_argument("--seed", type=int, default=0)


def dataset_args_from(ns: argparse.Namespace) -> DatasetArgs:
    """Explicit flags win; the rest come from the dataset's defaults."""
    base = DatasetArgs(dataset=ns.dataset, seed=ns.seed, shuffle=ns.shuffle)
    if ns.dataset == "nano-vllm":
        base.notes.append("nano-vllm preset: 256 requests, input and output lengths uniform in "
                          "100..1024, ids uniform in 0..10000, Python random seeded with --seed "
                          "(0 reproduces nano-vllm's bench.py draws)")
    if ns.dataset == "shared-prefix":
        # Shared-prefix defaults: short answers, the prefix dominates.
        base.min_output_len = base.max_output_len = 128
    for name in ("num_prompts", "min_input_len", "max_input_len", "min_output_len",
                 "max_output_len", "num_groups", "prompts_per_group", "system_prompt_len",
                 "question_len"):
        value = getattr(ns, name, None)
        if value is not None:
            setattr(base, name, value)
    # One bound given: the other follows, so `--max-output-len 8` alone is a valid range.
    for lo, hi in (("min_input_len", "max_input_len"), ("min_output_len", "max_output_len")):
        if getattr(ns, lo, None) is None and getattr(base, lo) > getattr(base, hi):
            setattr(base, lo, getattr(base, hi))
        if getattr(ns, hi, None) is None and getattr(base, hi) < getattr(base, lo):
            setattr(base, hi, getattr(base, lo))
    base.validate()
    return base


# ---------------------------------------------------------------------- token pools

def token_pool(vocab_size: int, tokenizer: Any = None, text_safe: bool = False) -> np.ndarray:
    """Ids to draw prompts from: below `vocab_size` (the smaller of the model's and the
    tokenizer's vocabularies), no special tokens (an EOS or chat marker in the middle of a
    prompt is not what a benchmark means). `text_safe` also drops ids whose text alone is not
    whole characters (a byte-level token ending mid-UTF-8 character), which would not survive
    a decode / encode round trip."""
    ids = np.arange(vocab_size, dtype=np.int64)
    if tokenizer is None:
        return ids
    special = [i for i in getattr(tokenizer, "all_special_ids", []) if 0 <= i < vocab_size]
    keep = np.ones(vocab_size, dtype=bool)
    keep[special] = False
    if text_safe:
        texts = tokenizer.batch_decode([[int(i)] for i in ids])
        keep &= np.array([bool(t.strip()) and "\ufffd" not in t for t in texts])
    pool = ids[keep]
    if pool.size == 0:
        raise ValueError("no usable token ids for prompts")
    return pool


# ---------------------------------------------------------------------- generators

def _draw(rng: np.random.Generator, pool: np.ndarray, n: int) -> list[int]:
    return pool[rng.integers(0, pool.size, size=n)].tolist()


def random_requests(args: DatasetArgs, pool: np.ndarray) -> list[BenchRequest]:
    rng = np.random.default_rng(args.seed)
    n = args.num_prompts
    in_lens = rng.integers(args.min_input_len, args.max_input_len + 1, size=n)
    out_lens = rng.integers(args.min_output_len, args.max_output_len + 1, size=n)
    return [BenchRequest(_draw(rng, pool, int(i)), int(o)) for i, o in zip(in_lens, out_lens)]


def shared_prefix_requests(args: DatasetArgs, pool: np.ndarray) -> list[BenchRequest]:
    rng = np.random.default_rng(args.seed)
    reqs = []
    for g in range(args.num_groups):
        prefix = _draw(rng, pool, args.system_prompt_len)
        for _ in range(args.prompts_per_group):
            out = int(rng.integers(args.min_output_len, args.max_output_len + 1))
            reqs.append(BenchRequest(prefix + _draw(rng, pool, args.question_len), out, g,
                                     len(prefix)))
    if args.shuffle:
        order = rng.permutation(len(reqs))
        reqs = [reqs[i] for i in order]
    return reqs


def nano_vllm_requests(args: DatasetArgs, vocab_size: int) -> list[BenchRequest]:
    """Same draw order as nano-vllm's bench.py: per prompt its length then its ids, then all
    the output lengths, all from one Python `random` stream."""
    if vocab_size <= NANO_VLLM_MAX_ID:
        raise ValueError(f"the nano-vllm preset draws ids up to {NANO_VLLM_MAX_ID}; this model's "
                         f"vocabulary has only {vocab_size}")
    rnd = random.Random(args.seed)
    prompts = [[rnd.randint(0, NANO_VLLM_MAX_ID)
                for _ in range(rnd.randint(args.min_input_len, args.max_input_len))]
               for _ in range(args.num_prompts)]
    outs = [rnd.randint(args.min_output_len, args.max_output_len) for _ in prompts]
    return [BenchRequest(p, o) for p, o in zip(prompts, outs)]


def make_requests(args: DatasetArgs, vocab_size: int, tokenizer: Any = None,
                  text_safe: bool = False) -> list[BenchRequest]:
    if args.dataset == "nano-vllm":
        return nano_vllm_requests(args, vocab_size)
    pool = token_pool(vocab_size, tokenizer, text_safe)
    if args.dataset == "shared-prefix":
        return shared_prefix_requests(args, pool)
    return random_requests(args, pool)


# ---------------------------------------------------------------------- text prompts

def _special_count(tokenizer: Any) -> int:
    """Tokens the tokenizer adds around any text by default (a BOS for Llama, none for Qwen):
    the server encodes with them, so they count towards the prompt length."""
    return len(tokenizer("a").input_ids) - len(tokenizer("a", add_special_tokens=False).input_ids)


def fit_text(tokenizer: Any, ids: Sequence[int], pool: np.ndarray, rng: np.random.Generator,
             add_special: bool = True, rounds: int = 8) -> str:
    """A string that the tokenizer encodes to len(ids) tokens (counting the special tokens it
    adds by default when `add_special`), when a few rounds of cut / extend get there."""
    target = max(1, len(ids) - (_special_count(tokenizer) if add_special else 0))
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    for _ in range(rounds):
        enc = tokenizer(text, add_special_tokens=False).input_ids
        if len(enc) == target:
            break
        enc = enc[:target] if len(enc) > target else enc + _draw(rng, pool, target - len(enc))
        text = tokenizer.decode(enc, skip_special_tokens=True)
    return text


def attach_text(requests: list[BenchRequest], tokenizer: Any, pool: np.ndarray,
                seed: int) -> None:
    """Give every request a text prompt of (about) its length; input_ids become the text's own
    encoding so that input token counts stay truthful. A group's shared prefix is fitted once
    and the questions separately, so that the texts, too, share the prefix."""
    rng = np.random.default_rng(seed + 1)
    prefixes: dict[int, str] = {}
    for r in requests:
        if r.group >= 0 and r.prefix_len:
            if r.group not in prefixes:
                prefixes[r.group] = fit_text(tokenizer, r.input_ids[:r.prefix_len], pool, rng)
            r.prompt = prefixes[r.group] + fit_text(tokenizer, r.input_ids[r.prefix_len:], pool,
                                                    rng, add_special=False)
        else:
            r.prompt = fit_text(tokenizer, r.input_ids, pool, rng)
        r.input_ids = list(tokenizer(r.prompt).input_ids)
