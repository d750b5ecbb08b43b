"""The synthetic datasets of `bench offline` / `bench serving`: bounds, determinism, sharing, and
text prompts that encode back to their requested lengths."""

from __future__ import annotations

import argparse
import os
import random

import pytest

from radixlm.bench import datasets as D


def _args(**kw) -> D.DatasetArgs:
    base = dict(num_prompts=40, min_input_len=5, max_input_len=60, min_output_len=1,
                max_output_len=9, num_groups=3, prompts_per_group=4, system_prompt_len=30,
                question_len=7)
    base.update(kw)
    return D.DatasetArgs(**base)


def _parse(*argv: str) -> D.DatasetArgs:
    p = argparse.ArgumentParser()
    D.add_dataset_args(p)
    return D.dataset_args_from(p.parse_args(list(argv)))


def test_random_lengths_within_bounds_and_ids_ordinary(tokenizer):
    args = _args(dataset="random")
    reqs = D.make_requests(args, len(tokenizer), tokenizer)
    assert len(reqs) == 40
    special = set(tokenizer.all_special_ids)
    for r in reqs:
        assert 5 <= len(r.input_ids) <= 60 and 1 <= r.output_len <= 9
        assert all(0 <= t < len(tokenizer) and t not in special for t in r.input_ids)
    # Uniform draws over a wide range: both ends of the ranges are actually used.
    assert len({len(r.input_ids) for r in reqs}) > 10 and len({r.output_len for r in reqs}) > 4


def test_seed_determinism():
    pool = D.token_pool(1000)
    for name in ("random", "shared-prefix", "nano-vllm"):
        a = D.make_requests(_args(dataset=name, seed=3), 20000)
        b = D.make_requests(_args(dataset=name, seed=3), 20000)
        c = D.make_requests(_args(dataset=name, seed=4), 20000)
        assert [(r.input_ids, r.output_len) for r in a] == [(r.input_ids, r.output_len) for r in b]
        assert [r.input_ids for r in a] != [r.input_ids for r in c], name
    assert D.random_requests(_args(), pool)[0].input_ids == D.random_requests(_args(), pool)[0].input_ids


def test_shared_prefix_is_shared_within_groups_only():
    args = _args(dataset="shared-prefix")
    reqs = D.make_requests(args, 20000)
    assert len(reqs) == 3 * 4
    by_group: dict[int, list[D.BenchRequest]] = {}
    for r in reqs:
        assert len(r.input_ids) == 30 + 7 and r.prefix_len == 30
        by_group.setdefault(r.group, []).append(r)
    prefixes = []
    for g, rs in by_group.items():
        assert len(rs) == 4
        assert len({tuple(r.input_ids[:30]) for r in rs}) == 1, "prefix not shared"
        assert len({tuple(r.input_ids[30:]) for r in rs}) == 4, "questions should differ"
        prefixes.append(tuple(rs[0].input_ids[:30]))
    assert len(set(prefixes)) == 3
    # Group after group by default; --shuffle mixes them (same requests).
    assert [r.group for r in reqs] == sorted(r.group for r in reqs)
    mixed = D.make_requests(_args(dataset="shared-prefix", shuffle=True), 20000)
    assert [r.group for r in mixed] != sorted(r.group for r in mixed)
    assert sorted(map(tuple, (r.input_ids for r in mixed))) == sorted(
        map(tuple, (r.input_ids for r in reqs)))


def test_nano_vllm_preset_reproduces_its_draws():
    args = _parse("--dataset", "nano-vllm")
    assert (args.num_prompts, args.min_input_len, args.max_input_len, args.min_output_len,
            args.max_output_len, args.seed) == (256, 100, 1024, 100, 1024, 0)
    reqs = D.make_requests(args, 151936)
    # nano-vllm's bench.py: random.seed(0); per prompt randint(100, 1024) ids of
    # randint(0, 10000); then randint(100, 1024) output lengths.
    rnd = random.Random(0)
    n0 = rnd.randint(100, 1024)
    assert reqs[0].input_ids == [rnd.randint(0, 10000) for _ in range(n0)]
    assert all(100 <= len(r.input_ids) <= 1024 and 100 <= r.output_len <= 1024 for r in reqs)
    assert max(max(r.input_ids) for r in reqs) <= 10000
    with pytest.raises(ValueError, match="nano-vllm"):
        D.make_requests(args, 5000)


def test_flags_and_presets():
    a = _parse("--max-output-len", "8", "--max-input-len", "50")
    assert (a.min_output_len, a.max_output_len, a.min_input_len, a.max_input_len) == (8, 8, 50, 50)
    sp = _parse("--dataset", "shared-prefix")
    assert sp.min_output_len == sp.max_output_len == 128
    with pytest.raises(ValueError):
        _parse("--min-input-len", "10", "--max-input-len", "5")
    with pytest.raises(ValueError):
        _parse("--num-prompts", "0")


def test_text_prompts_match_lengths_and_keep_prefixes(tokenizer):
    pool = D.token_pool(len(tokenizer), tokenizer, text_safe=True)
    assert 0 < pool.size < len(tokenizer)
    reqs = D.make_requests(_args(dataset="random", num_prompts=12), len(tokenizer), tokenizer)
    wanted = [len(r.input_ids) for r in reqs]
    D.attach_text(reqs, tokenizer, pool, seed=0)
    got = [len(tokenizer(r.prompt).input_ids) for r in reqs]
    assert got == [len(r.input_ids) for r in reqs]        # input_ids are the text's encoding
    assert sum(abs(a - b) for a, b in zip(wanted, got)) <= 2, (wanted, got)

    sp = D.make_requests(_args(dataset="shared-prefix"), len(tokenizer), tokenizer)
    D.attach_text(sp, tokenizer, pool, seed=0)
    for g in range(3):
        texts = [r.prompt for r in sp if r.group == g]
        # 30 of the 37 tokens are the shared prefix: so is most of the text.
        assert len(os.path.commonprefix(texts)) >= len(texts[0]) * 0.6, texts
