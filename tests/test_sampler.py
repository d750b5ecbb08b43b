"""Tests of the sampler (sampling/: sampler.py, penalties.py, noise.py); CPU, fast."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.request import SamplingRequest
from radixlm.sampling.sampler import Sampler
from radixlm.sampling.noise import (gumbel_argmax, gumbel_noise, hash_bits, mix32, mix32_int,
                                           row_key, token_keys)
from radixlm.sampling.params import SamplingParams

CPU = torch.device("cpu")


def req(seed: int = 0, prompt=(1, 2), output=(), eos=(0,), **params) -> SamplingRequest:
    return SamplingRequest(params=SamplingParams(**params), seed=seed, prompt_ids=list(prompt),
                           output_ids=output, eos_token_ids=list(eos))


def sample(logits: torch.Tensor, reqs: list[SamplingRequest], nums=None):
    info = SamplingBatchInfo.build(reqs, logits.shape[1], logits.device)
    return Sampler()(logits, info, nums)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


# ---------------------------------------------------------------- noise


def test_mix32_tensor_matches_python_ints():
    rng = random.Random(0)
    values = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + [rng.getrandbits(32) for _ in range(2000)]
    x = torch.tensor(values, dtype=torch.int64)
    got = mix32(x).tolist()
    assert got == [mix32_int(v) for v in values]
    assert x.tolist() == values  # input untouched
    assert all(0 <= g < 2**32 for g in got) and len(set(got)) == len(set(values))  # bijective
    assert mix32_int(0x12345678) == 0x16E776BD  # pins the definition: changing it changes outputs


def test_noise_is_standard_gumbel_and_keyed_by_seed_and_step():
    keys = torch.tensor([row_key(s, 0) for s in range(64)])
    g = gumbel_noise(keys, token_keys(4096, CPU))
    assert torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(g.var().item() - math.pi**2 / 6) < 0.03
    pairs = [(5, 0), (5, 1), (6, 0), (-5, 0), (2**62, 0), (5 + 2**64, 1)]
    keys = [row_key(s, t) for s, t in pairs]
    assert len(set(keys[:-1])) == 5 and keys[-1] == keys[1]  # seeds count modulo 2**64
    bits = hash_bits(torch.tensor(keys[:5]), token_keys(1000, CPU))
    assert len({tuple(r) for r in bits.tolist()}) == 5


def test_chunked_gumbel_argmax_matches_unchunked(monkeypatch):
    import radixlm.sampling.noise as noise
    scores, keys, tk = torch.randn(10, 300), torch.tensor([row_key(s, 3) for s in range(10)]), \
        token_keys(300, CPU)
    whole = gumbel_argmax(scores, keys, tk)
    monkeypatch.setattr(noise, "MAX_NOISE_CHUNK_ELEMENTS", 700)  # chunks of 2 rows
    assert torch.equal(noise.gumbel_argmax(scores, keys, tk), whole)


# ---------------------------------------------------------------- greedy and seeds


@pytest.mark.parametrize("temperature", [0.0, 1e-8])
def test_greedy_equals_argmax(temperature):
    logits = torch.randn(7, 100)
    out = sample(logits, [req(seed=i, temperature=temperature) for i in range(7)])
    assert torch.equal(out.next_token_ids, logits.argmax(-1))


def test_top_k_one_equals_greedy_at_temperature_one():
    logits = torch.randn(7, 100)
    out = sample(logits, [req(seed=i, temperature=1.0, top_k=1) for i in range(7)])
    assert torch.equal(out.next_token_ids, logits.argmax(-1))


def test_mixed_greedy_and_sampled_rows():
    logits = torch.randn(6, 100)
    reqs = [req(seed=i, temperature=0.0 if i % 2 else 1.5) for i in range(6)]
    ids = sample(logits, reqs).next_token_ids
    assert torch.equal(ids[1::2], logits[1::2].argmax(-1))
    alone = [sample(logits[i:i + 1], [reqs[i]]).next_token_ids.item() for i in range(6)]
    assert ids.tolist() == alone


def test_same_seed_same_tokens_alone_batched_and_reordered():
    vocab = 500
    torch.manual_seed(0)
    target_logits = torch.randn(vocab)
    target = [req(seed=1234, output=list(range(s)), temperature=0.9, top_p=0.95, top_k=100)
              for s in range(5)]
    alone = [sample(target_logits[None], [t]).next_token_ids.item() for t in target]
    assert alone == [sample(target_logits[None], [t]).next_token_ids.item() for t in target]
    rng = random.Random(1)
    for trial in range(4):
        for t, expected in zip(target, alone):
            others = [req(seed=rng.randrange(10**9), output=[1] * rng.randrange(9),
                          temperature=rng.choice([0.0, 0.5, 1.3]), top_k=rng.choice([-1, 3, 50]),
                          top_p=rng.choice([1.0, 0.5]), frequency_penalty=rng.choice([0.0, 1.0]))
                      for _ in range(rng.randrange(1, 6))]
            pos = rng.randrange(len(others) + 1)
            batch = others[:pos] + [t] + others[pos:]
            logits = torch.randn(len(batch), vocab)
            logits[pos] = target_logits
            assert sample(logits, batch).next_token_ids[pos].item() == expected


def test_different_seeds_and_steps_differ():
    logits = torch.zeros(1, 1000)  # uniform: any collision would be chance (1 in 1000 per pair)
    by_seed = {sample(logits, [req(seed=s)]).next_token_ids.item() for s in range(20)}
    by_step = {sample(logits, [req(seed=7, output=range(s))]).next_token_ids.item()
               for s in range(20)}
    assert len(by_seed) > 15 and len(by_step) > 15


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_empirical_distribution_matches_softmax(temperature):
    logits = torch.tensor([1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -1.6, -2.0])
    probs = torch.softmax(logits / temperature, -1)
    n = 40000
    # Many seeds at one step, and one seed over many steps.
    by_seed = sample(logits.expand(n, -1), [req(seed=s, temperature=temperature)
                                            for s in range(n)]).next_token_ids
    by_step = sample(logits.expand(n, -1), [req(seed=99, output=range(s), temperature=temperature)
                                            for s in range(n)]).next_token_ids
    for ids in (by_seed, by_step):
        counts = torch.bincount(ids, minlength=8)
        assert chi_square(counts, probs) < 29.9  # df = 7, p = 1e-4


# ---------------------------------------------------------------- filters


def test_top_k_never_samples_outside_top_k():
    logits = torch.randn(50) * 0.3
    n = 3000
    ids = sample(logits.expand(n, -1), [req(seed=s, top_k=5) for s in range(n)]).next_token_ids
    assert set(ids.tolist()) == set(logits.topk(5).indices.tolist())


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])
    logits = probs.log().expand(4000, -1)
    ids = sample(logits, [req(seed=s, top_p=0.7) for s in range(4000)]).next_token_ids
    assert set(ids.tolist()) == {0, 1}  # 0.5 < 0.7, so token 1 is needed to reach 0.7
    ids = sample(logits, [req(seed=s, top_p=0.8) for s in range(4000)]).next_token_ids
    assert set(ids.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.8 (within float rounding)
    ids = sample(logits, [req(seed=s, top_p=1e-6) for s in range(4000)]).next_token_ids
    assert set(ids.tolist()) == {0}  # the most likely token is always allowed


def test_top_p_applies_after_top_k_renormalisation():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = probs.log().expand(4000, -1)
    # After top-k=2: {0: 4/7, 1: 3/7}; top_p=0.5 then keeps only token 0 (4/7 >= 0.5).
    ids = sample(logits, [req(seed=s, top_k=2, top_p=0.5) for s in range(4000)]).next_token_ids
    assert set(ids.tolist()) == {0}


def test_min_p_filter():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.09, 0.07, 0.04])
    logits = probs.log().expand(4000, -1)
    ids = sample(logits, [req(seed=s, min_p=0.3) for s in range(4000)]).next_token_ids
    assert set(ids.tolist()) == {0, 1, 2}  # 0.3 * 0.4 = 0.12


def test_min_p_in_the_batch_keeps_other_rows_filters_at_an_infinite_logit():
    """A row without min-p whose maximum is +inf keeps its top-k cut-off when another row of
    the batch uses min-p (max + log(min_p) is inf + -inf = NaN there, and must not count)."""
    logits = torch.tensor([[0.0, 1.0, 2.0, float("inf"), 3.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    info = SamplingBatchInfo.build([req(top_k=2), req(min_p=0.5)], 5, CPU)
    kept = Sampler.filter_logits(logits, info) > float("-inf")
    assert kept.tolist() == [[False, False, False, True, True], [False, False, False, False, True]]


# ---------------------------------------------------------------- logit adjustments


def test_penalties_match_hand_computed_reference():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.3, 1.2, 0.0],
                           [2.0, -1.0, 0.5, -0.3, 1.2, 0.0]])
    reqs = [req(prompt=[1, 4], output=[2, 3, 3], repetition_penalty=1.5, frequency_penalty=0.5,
                presence_penalty=0.25),
            req(prompt=[1, 4], output=[2, 3, 3])]  # same tokens, no penalties: untouched
    info = SamplingBatchInfo.build(reqs, 6, CPU)
    got = Sampler.process_logits(logits, info)
    expected = logits[0].tolist()
    counts = {2: 1, 3: 2}
    for tok in {1, 4, 2, 3}:  # prompt + output, once each
        expected[tok] = expected[tok] / 1.5 if expected[tok] > 0 else expected[tok] * 1.5
    for tok, c in counts.items():  # output only
        expected[tok] -= 0.5 * c + 0.25
    torch.testing.assert_close(got[0], torch.tensor(expected))
    assert torch.equal(got[1], logits[1])
    assert torch.equal(logits[0], torch.tensor([2.0, -1.0, 0.5, -0.3, 1.2, 0.0]))  # input intact


@pytest.mark.parametrize("which", ["frequency_penalty", "presence_penalty"])
def test_single_additive_penalty(which):
    logits = torch.zeros(1, 5)
    info = SamplingBatchInfo.build([req(output=[4, 4, 4, 1], **{which: 1.0})], 5, CPU)
    got = Sampler.process_logits(logits, info)[0].tolist()
    assert got == ([0, -1, 0, 0, -3] if which == "frequency_penalty" else [0, -1, 0, 0, -1])


def test_min_new_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0, 0.0, 4.0, 3.0]])
    kw = dict(temperature=0.0, min_new_tokens=3, max_new_tokens=10, stop_token_ids=[5])
    pick = lambda n, **extra: sample(logits, [req(output=[1] * n, eos=[0], **kw, **extra)])
    assert pick(0).next_token_ids.item() == 6
    assert pick(2).next_token_ids.item() == 6
    assert pick(3).next_token_ids.item() == 0  # reached: EOS allowed again
    assert pick(2, ignore_eos=True).next_token_ids.item() == 0  # ignore_eos: EOS not banned
    info = SamplingBatchInfo.build([req(output=[], **kw, ignore_eos=True)], 7, CPU)
    assert Sampler.process_logits(logits, info)[0, 5] == float("-inf")  # stop id still banned


def test_logit_bias():
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0]])
    info = SamplingBatchInfo.build([req(temperature=0.0, logit_bias={2: 5.0, 0: -1.0})], 4, CPU)
    assert Sampler.process_logits(logits, info).tolist() == [[2.0, 1.0, 5.0, -1.0]]
    assert Sampler()(logits, info).next_token_ids.item() == 2


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_log_softmax_at_chosen_tokens():
    logits = torch.randn(5, 40).to(torch.bfloat16)
    reqs = [req(seed=i, temperature=0.7, top_k=10, repetition_penalty=1.8, output=[3, 4],
                logit_bias={7: 3.0}) for i in range(5)]
    out = sample(logits, reqs)
    ref = torch.log_softmax(logits.float(), -1).gather(1, out.next_token_ids[:, None])[:, 0]
    torch.testing.assert_close(out.next_token_logprobs, ref)
    assert out.next_token_logprobs.dtype == torch.float32 and out.top_logprobs is None


def test_top_logprobs_sorted_and_correct():
    logits = torch.randn(3, 30)
    out = sample(logits, [req(seed=i) for i in range(3)], nums=[4, 0, 2])
    logp = torch.log_softmax(logits, -1)
    assert out.top_logprobs[1] == ([], [])
    for row, k in ((0, 4), (2, 2)):
        values, ids = out.top_logprobs[row]
        assert ids == logp[row].topk(k).indices.tolist()
        assert values == sorted(values, reverse=True)
        torch.testing.assert_close(torch.tensor(values), logp[row, ids])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_token_ids_logprobs_of_the_rows_that_ask(device):
    """token_ids_logprob: raw logits' log_softmax at the asked ids, in the order asked, for the
    rows that ask (a bf16 batch, with a penalty and a bias that must not change them; on CUDA
    through the fused sampler)."""
    logits = torch.randn(4, 50).to(torch.bfloat16).to(device)
    reqs = [req(seed=i, temperature=0.9, repetition_penalty=1.5, output=[3],
                logit_bias={9: 5.0}) for i in range(4)]
    info = SamplingBatchInfo.build(reqs, 50, logits.device)
    asked = [[9, 3, 3], None, [], [49]]
    out = Sampler()(logits, info, token_ids=asked)
    ref = torch.log_softmax(logits.float(), -1)
    assert out.token_ids_logprobs[1] == [] and out.token_ids_logprobs[2] == []
    for row in (0, 3):
        assert [t for _, t in out.token_ids_logprobs[row]] == asked[row]
        torch.testing.assert_close(torch.tensor([lp for lp, _ in out.token_ids_logprobs[row]],
                                                device=device), ref[row, asked[row]])
    assert Sampler()(logits, info).token_ids_logprobs is None


# ---------------------------------------------------------------- property test


def allowed_by_filters(x: torch.Tensor, p: SamplingParams, token: int) -> bool:
    """Is `token` allowed by top-k, top-p and min-p on processed logits x? float64, tolerant."""
    s = x.double() / p.temperature
    if not math.isfinite(s[token].item()):
        return False
    vocab = s.numel()
    k = vocab if p.top_k < 0 else min(p.top_k, vocab)
    top_vals = s.sort(descending=True).values[:k]
    if s[token] < top_vals[-1]:
        return False
    probs = torch.softmax(top_vals, -1)  # renormalised over the top-k
    mass_above = probs[top_vals > s[token]].sum().item()
    if p.top_p < 1.0 and mass_above >= p.top_p + 1e-4:
        return False
    return s[token] >= top_vals[0] + math.log(p.min_p) - 1e-5 if p.min_p > 0 else True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_chosen_token_is_allowed(data):
    vocab = data.draw(st.integers(2, 40))
    rows = data.draw(st.integers(1, 4))
    logits = torch.tensor(data.draw(st.lists(
        st.lists(st.floats(-15, 15, width=32), min_size=vocab, max_size=vocab),
        min_size=rows, max_size=rows)), dtype=torch.float32)
    reqs = []
    for _ in range(rows):
        params = SamplingParams(
            temperature=data.draw(st.sampled_from([0.0, 0.05, 0.5, 1.0, 2.0])),
            top_k=data.draw(st.sampled_from([-1, 1, 2, 5, 50])),
            top_p=data.draw(st.floats(0.01, 1.0)),
            min_p=data.draw(st.sampled_from([0.0, 0.0, 0.05, 0.5, 1.0])),
            repetition_penalty=data.draw(st.sampled_from([1.0, 1.3])),
            presence_penalty=data.draw(st.sampled_from([0.0, -0.5, 1.0])),
        )
        params.validate(vocab)
        output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=6))
        reqs.append(SamplingRequest(params, seed=data.draw(st.integers(-2**70, 2**70)),
                                    prompt_ids=[0], output_ids=output, eos_token_ids=[]))
    info = SamplingBatchInfo.build(reqs, vocab, CPU)
    ids = Sampler()(logits, info).next_token_ids.tolist()
    x = Sampler.process_logits(logits, info)
    for row, (r, tok) in enumerate(zip(reqs, ids)):
        if r.params.temperature == 0.0 or r.params.top_k == 1:
            assert x[row, tok] == x[row].max()
        else:
            assert allowed_by_filters(x[row], r.params, tok), (row, tok, r.params)


# ---------------------------------------------------------------- device independence


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    seeds, steps = [0, 1, -7, 2**62, 123456789], [0, 5, 3, 1000, 2]
    keys = torch.tensor([row_key(s, t) for s, t in zip(seeds, steps)])
    cpu_bits = hash_bits(keys, token_keys(50000, CPU))
    cuda = torch.device("cuda")
    assert torch.equal(cpu_bits, hash_bits(keys.to(cuda), token_keys(50000, cuda)).cpu())
    logits = torch.randn(5, 50000)
    reqs = [req(seed=s, output=range(t), temperature=0.8, top_p=0.9, top_k=200 if s % 2 else -1,
                min_p=0.01) for s, t in zip(seeds, steps)]
    reqs[0].params.repetition_penalty = 1.2  # exercise the penalty scatter ops on CUDA too
    cpu = sample(logits, reqs)
    gpu = sample(logits.cuda(), reqs)
    assert torch.equal(cpu.next_token_ids, gpu.next_token_ids.cpu())


def test_alternatives_are_the_best_adjusted_tokens_with_raw_logprobs():
    """SampleOutput.alternatives: per row the k best tokens by the logits after adjustments
    (what a greedy row takes the argmax of), best first, with log_softmax of the raw logits."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen)
    reqs = [req(temperature=0.0), req(temperature=0.0, frequency_penalty=2.0, output=[7, 7]),
            req(temperature=0.0, min_new_tokens=5, eos=(int(logits[2].argmax()),))]
    info = SamplingBatchInfo.build(reqs, 50, CPU)
    out = Sampler()(logits, info, alternatives=6)
    ids, scores, logprobs = out.alternatives
    adjusted = Sampler.process_logits(logits.float(), info)
    want_scores, want_ids = torch.topk(adjusted, 6, dim=-1)
    assert torch.equal(ids.long(), want_ids) and torch.equal(scores, want_scores)
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).gather(1, want_ids))
    assert torch.equal(ids[:, 0].long(), out.next_token_ids)   # the greedy rows' tokens lead
    assert int(logits[2].argmax()) not in ids[2].long().tolist()   # banned by min_new_tokens
    assert Sampler()(logits, info).alternatives is None
