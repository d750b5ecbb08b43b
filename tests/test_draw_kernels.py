"""The sampled rows' kernels against the sampler's PyTorch code: the top-k / top-p / min-p
cut-offs from a value search (sampling/cutoff_kernels.py) against the sort
(`_top_k_top_p_threshold` and `filter_logits`), and the one-pass draw (sampling/draw_kernels.py)
against `Sampler._sample` (noise.py's Gumbel-max) plus the chosen tokens' logprobs.

CPU: the cases below in a child process under TRITON_INTERPRET=1; GPU: the same at the
vocabulary sizes of the benchmark models.

    TRITON_INTERPRET=1 python tests/test_draw_kernels.py
"""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import run_cpu_interpreter_cases, run_interpreter_cases

# Rows: temperature 1 unless given; each row one kind of filter.
ROW_PARAMS = [
    dict(top_p=0.9), dict(top_k=20), dict(top_k=50, top_p=0.5), dict(), dict(top_p=0.99),
    dict(top_p=0.01), dict(top_k=40), dict(top_k=3, top_p=0.95), dict(top_p=0.5, min_p=0.1),
    dict(top_k=7), dict(top_p=0.7, temperature=0.6), dict(top_k=5, temperature=1.7),
    dict(top_k=2, top_p=0.3), dict(min_p=0.2, temperature=0.8), dict(temperature=0),
]


def make_logits(vocab: int, device: str, seed: int) -> torch.Tensor:
    """Logits with the awkward cases planted: a tie across the top-k boundary (row 1: 30 equal
    maxima for top_k 20), most of a row -inf (row 2), bf16-rounded values with many ties (row
    6, top_k 40), a row of -inf but one token (row 9), a flat row (row 10)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(ROW_PARAMS), vocab, generator=g) * 3
    x[1, 5:35] = 40.0
    x[2, vocab // 3:] = float("-inf")
    x[6] = x[6].to(torch.bfloat16).float().round()
    x[9] = float("-inf")
    x[9, vocab // 2] = 1.0
    x[10] = 0.5
    return x.to(device)


def _info(vocab: int, device: str, params=ROW_PARAMS, step: int = 0):
    from radixlm.sampling.batch_info import SamplingBatchInfo
    from radixlm.sampling.params import SamplingParams
    from radixlm.sampling.request import SamplingRequest
    reqs = [SamplingRequest(params=SamplingParams(**({"temperature": 1.0} | p)), seed=i,
                            prompt_ids=[1], output_ids=[7] * step) for i, p in enumerate(params)]
    return SamplingBatchInfo.build(reqs, vocab, torch.device(device))


def _cutoffs(x: torch.Tensor, info, bf16_values: bool = False) -> torch.Tensor:
    from radixlm.sampling.cutoff_kernels import sampling_cutoffs
    return sampling_cutoffs(x, info.temperatures, info.top_ks, info.top_p_limits,
                            info.log_min_ps, top_k=info.need_top_k, top_p=info.need_top_p,
                            min_p=info.need_min_p, bf16_values=bf16_values)


def _reference_cutoffs(scaled: torch.Tensor, info) -> torch.Tensor:
    """The sampler's PyTorch cut-off: the value filter_logits masks below."""
    from radixlm.sampling.sampler import Sampler
    return Sampler.cutoffs(scaled, info)


def check_cutoffs(vocab: int, device: str, seed: int = 0, chunk: int | None = None,
                  dtype=torch.float32, bf16_values: bool = False) -> float:
    """The kernels' kept sets against the sort's: equal on the CPU (the interpreter, small
    vocabularies); on the GPU against the sort in float64, equal up to tokens whose softmax
    mass sums to < 1e-4 per row (float32 sums over 10**5 tokens, the sort's cumsum included,
    can move a token that sits at the top_p boundary). Returns the largest such mass.
    bf16 / fp16 logits take the 16-bit key search, float32 ones the 32-bit one, or with
    `bf16_values` (float32 logits rounded to bf16, as a bf16 model's) the 16-bit one."""
    from radixlm.sampling import cutoff_kernels
    x = make_logits(vocab, device, seed)
    x = x.to(torch.bfloat16).float() if bf16_values else x.to(dtype)
    info = _info(vocab, device)
    old = cutoff_kernels.CHUNK
    cutoff_kernels.CHUNK = chunk or old       # several chunks a row at a small vocabulary
    try:
        got = _cutoffs(x, info, bf16_values)
    finally:
        cutoff_kernels.CHUNK = old
    assert got.dtype == torch.float32 and got.shape == (len(ROW_PARAMS),)
    scaled = x.float() / info.temperatures
    kept_got = (scaled >= got.unsqueeze(1)).cpu()
    assert kept_got.any(dim=-1)[[i for i in range(len(ROW_PARAMS)) if i != 9]].all()
    if device == "cpu":
        ref = _reference_cutoffs(scaled, info)
        assert torch.equal(kept_got, scaled >= ref.unsqueeze(1)), (ref, got)
        return 0.0
    x64 = scaled.double().cpu()
    ref = _reference_cutoffs(x64, _info(vocab, "cpu"))
    kept_ref = x64 >= ref.unsqueeze(1)
    probs = torch.softmax(x64, dim=-1).nan_to_num()
    moved = ((kept_ref ^ kept_got) * probs).sum(dim=-1)
    assert moved.max().item() < 1e-4, (moved, ref, got)
    return moved.max().item()


def check_only(vocab: int, device: str, which: str) -> float:
    """Batches that use one filter kind only run only its search."""
    params = {"top_k": [dict(top_k=5), dict(top_k=60), dict()],
              "top_p": [dict(top_p=0.8), dict(), dict(top_p=0.3, temperature=0.5)],
              "min_p": [dict(min_p=0.05), dict(), dict(min_p=0.5, temperature=2.0)]}[which]
    x = make_logits(vocab, device, 4)[:len(params)].to(torch.bfloat16)
    info = _info(vocab, device, params)
    got = _cutoffs(x, info)
    scaled = x.float() / info.temperatures
    ref = _reference_cutoffs(scaled, info)
    kept_got, kept_ref = scaled >= got.unsqueeze(1), scaled >= ref.unsqueeze(1)
    assert torch.equal(kept_got, kept_ref), (which, got, ref)
    return 0.0


def check_draw(vocab: int, device: str, seed: int = 0, dtype=torch.float32,
               adjusted: bool = False) -> float:
    """Tokens of the one-pass draw equal `Sampler._sample`'s (same noise bits, cut-offs by
    the sort), its logprobs log_softmax(raw logits) at them; greedy row 14 takes the argmax.
    `adjusted`: scores differ from the raw logits (penalties), as the sampler passes them."""
    from radixlm.sampling.draw_kernels import draw_with_logprobs
    from radixlm.sampling.sampler import Sampler
    raw = make_logits(vocab, device, seed).to(dtype)
    scores = raw.float() - 0.25 * (torch.arange(vocab, device=device) % 3) if adjusted else raw
    for step in (0, 5):
        info = _info(vocab, device, step=step)
        scaled = scores.float() / info.temperatures
        cut = _reference_cutoffs(scaled, info).float()
        ids, logprobs = draw_with_logprobs(scores, raw, info.temperatures, cut,
                                           info.greedy_mask, info.row_keys)
        ref = Sampler()._sample(scores.float(), info)
        same = ids == ref
        # Only an ulp-level difference of the two logs can split a near-tie of noisy scores.
        assert same.sum().item() >= len(ROW_PARAMS) - 1, (ids, ref)
        assert ids[14].item() == torch.argmax(scores[14].float()).item()
        want = raw.float().log_softmax(dim=-1).gather(1, ids.unsqueeze(1)).squeeze(1)
        ok = torch.isclose(logprobs, want, atol=1e-4, rtol=1e-4) | (want.isnan() &
                                                                   logprobs.isnan())
        assert ok.all(), (logprobs, want)
    return (logprobs - want).abs().nan_to_num().max().item()


def check_draw_no_cutoffs(vocab: int, device: str) -> float:
    """cutoffs None: plain temperature sampling, as the sampler's unfiltered rows."""
    from radixlm.sampling.draw_kernels import draw_with_logprobs
    from radixlm.sampling.sampler import Sampler
    params = [dict(temperature=0.7), dict(temperature=1.3), dict(temperature=0)]
    raw = make_logits(vocab, device, 5)[:3].contiguous()
    info = _info(vocab, device, params)
    ids, _ = draw_with_logprobs(raw, raw, info.temperatures, None, info.greedy_mask,
                                info.row_keys)
    assert torch.equal(ids, Sampler()._sample(raw, info)), ids
    return 0.0


def _masked_batch(vocab: int, device: str, seed: int, words: bool, table: bool):
    """Six rows (greedy and temperature 0.8 alternating) with random masks: `words` for rows
    0-3 (row 1's allows one token), automaton states for rows 2-5 in slots 6, 1, 4, 0 of
    eight (row 5 in state 0, a state allowing every token)."""
    from radixlm.sampling.token_mask import AutomatonRows, TokenMask
    g = torch.Generator().manual_seed(seed)
    width = (vocab + 31) // 32

    def random_words(n: int) -> torch.Tensor:
        return torch.randint(-2**31, 2**31, (n, width), generator=g, dtype=torch.int64).to(
            torch.int32)

    w = None
    if words:
        w = random_words(6)
        w[4:] = -1                      # (rows without a filled mask allow everything)
        w[1] = 0
        bit = (vocab - 1) % 32          # (the last token; bit 31 is the int32 sign bit)
        w[1, (vocab - 1) // 32] = 1 << bit if bit < 31 else -2**31
        w = w.to(device)
    auto = None
    if table:
        states = 5
        allowed = random_words(states)
        allowed[0] = -1
        next_state = torch.randint(0, states, (states, vocab), generator=g, dtype=torch.int32)
        slots = torch.tensor([-1, -1, 6, 1, 4, 0], dtype=torch.int64)
        state_of_slot = torch.tensor([0, 3, 0, 0, 2, 0, 1, 0], dtype=torch.int64)
        rows = torch.tensor([2, 3, 4, 5], dtype=torch.int64)
        auto = AutomatonRows(allowed.to(device), next_state.to(device),
                             state_of_slot.to(device), slots.to(device), rows.to(device),
                             slots[2:].to(device))
    params = [dict(temperature=0), dict(temperature=0.8)] * 3
    return TokenMask(w, auto), _info(vocab, device, params, step=seed)


def check_draw_masked(vocab: int, device: str, words: bool = True, table: bool = True,
                      dtype=torch.float32) -> float:
    """The draw kernel with a mask draws the tokens the sampler's PyTorch code draws over the
    masked logits (TokenMask.apply_), every one allowed, with log_softmax of the raw logits;
    it moves the automaton rows' states as TokenMask.advance does."""
    from radixlm.sampling.draw_kernels import draw_with_logprobs
    from radixlm.sampling.sampler import Sampler
    for seed in (0, 1):
        raw = (torch.randn(6, vocab, generator=torch.Generator().manual_seed(seed)) * 3).to(
            dtype).to(device)
        mask, info = _masked_batch(vocab, device, seed, words, table)
        ref_mask, _ = _masked_batch(vocab, device, seed, words, table)
        allowed_logits = raw.float().clone()
        ref_mask.apply_(allowed_logits)
        ids, logprobs = draw_with_logprobs(raw, raw, info.temperatures, None,
                                           info.greedy_mask, info.row_keys, mask)
        ref = Sampler()._sample(allowed_logits, info)
        assert torch.equal(ids, ref), (ids, ref)
        assert torch.isfinite(allowed_logits.gather(1, ids.unsqueeze(1))).all()
        assert not words or ids[1].item() == vocab - 1     # (its one allowed token)
        want = raw.float().log_softmax(dim=-1).gather(1, ids.unsqueeze(1)).squeeze(1)
        assert torch.allclose(logprobs, want, atol=1e-4, rtol=1e-4), (logprobs, want)
        if table:
            assert mask.moved and not ref_mask.moved
            ref_mask.advance(ids)
            assert torch.equal(mask.automaton.states, ref_mask.automaton.states)
            mask.advance(ids)      # (moved once only)
            assert torch.equal(mask.automaton.states, ref_mask.automaton.states)
    return (logprobs - want).abs().max().item()


def check_noise_bits(vocab: int, device: str) -> float:
    """The draw kernel's noise comes from noise.py's hash bits, bit for bit (seeds with the
    high bit set, steps past 2**31, token ids past 2**16)."""
    from radixlm.sampling.draw_kernels import draw_noise_bits
    from radixlm.sampling.noise import hash_bits, row_key, token_keys
    keys = torch.tensor([row_key(s, t) for s, t in ((0, 0), (2**63 + 5, 7), (123, 2**31 + 3))],
                        dtype=torch.int64, device=device)
    got = draw_noise_bits(keys, vocab)
    assert torch.equal(got, hash_bits(keys, token_keys(vocab, torch.device(device))))
    return 0.0


def check_empty() -> float:
    from radixlm.sampling.cutoff_kernels import sampling_cutoffs
    from radixlm.sampling.draw_kernels import draw_with_logprobs
    z = torch.zeros(0)
    out = sampling_cutoffs(torch.zeros(0, 10), z, torch.zeros(0, dtype=torch.int64), z, z,
                           top_k=True, top_p=True, min_p=True)
    ids, logprobs = draw_with_logprobs(torch.zeros(0, 10), torch.zeros(0, 10), z, None,
                                       torch.zeros(0, dtype=torch.bool),
                                       torch.zeros(0, dtype=torch.int64))
    assert out.shape == ids.shape == logprobs.shape == (0,)
    return 0.0


def _interpreter_cases():
    # float32 keys: one chunk a row, and three, the last partial (the 16-bit cases below take
    # vocabulary 3000)
    yield "cutoffs vocab=100 seed=0", lambda: check_cutoffs(100, "cpu", 0)
    yield "cutoffs vocab=1300, 3 chunks", lambda: check_cutoffs(1300, "cpu", 2, chunk=512)
    for dtype in (torch.bfloat16, torch.float16):
        yield f"cutoffs vocab=3000 {dtype}", lambda d=dtype: check_cutoffs(3000, "cpu", 3,
                                                                            dtype=d)
    yield "cutoffs vocab=3000 float32 holding bf16", lambda: check_cutoffs(
        3000, "cpu", 4, bf16_values=True)
    for which in ("top_k", "top_p", "min_p"):
        yield f"only {which}", lambda w=which: check_only(1000, "cpu", w)
    yield "draw vocab=3000", lambda: check_draw(3000, "cpu")
    # (2 and 3 chunks of draw_kernels.CHUNK a row, the last one partial)
    yield "draw vocab=4500 bf16, adjusted", lambda: check_draw(4500, "cpu", 1, torch.bfloat16,
                                                                adjusted=True)
    yield "draw without cut-offs", lambda: check_draw_no_cutoffs(500, "cpu")
    yield "noise bits", lambda: check_noise_bits(70000, "cpu")
    # (3 chunks a row, the last token on a word's sign bit; each mask source alone)
    yield "draw masked, words and automata", lambda: check_draw_masked(4480, "cpu")
    yield "draw masked, words only", lambda: check_draw_masked(1000, "cpu", table=False)
    yield "draw masked, automata only, bf16", lambda: check_draw_masked(
        1000, "cpu", words=False, dtype=torch.bfloat16)
    yield "no rows", check_empty


def test_interpreter_cases():
    run_cpu_interpreter_cases(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [151936, 128256, 49152, 100])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_cutoffs_match_sort(vocab, seed, dtype):
    check_cutoffs(vocab, "cuda", seed, dtype=dtype)
    if dtype == torch.float32:
        check_cutoffs(vocab, "cuda", seed, bf16_values=True)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["top_k", "top_p", "min_p"])
def test_gpu_single_filter(which):
    check_only(49152, "cuda", which)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [151936, 49152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_draw_matches_sampler(vocab, dtype):
    check_draw(vocab, "cuda", 0, dtype)
    check_draw(vocab, "cuda", 1, dtype, adjusted=True)
    check_draw_no_cutoffs(vocab, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [151936, 49152])
def test_gpu_draw_masked_matches_sampler(vocab):
    check_draw_masked(vocab, "cuda")
    check_draw_masked(vocab, "cuda", table=False, dtype=torch.bfloat16)
    check_draw_masked(vocab, "cuda", words=False)


@pytest.mark.gpu
def test_gpu_warm_up_compiles_what_batches_use():
    """After Sampler.warm_up, sampled batches of any size and mix of filters compile nothing
    more (the kernels do not specialise on batch size or on the per-row tensors' alignment)."""
    from radixlm.sampling import cutoff_kernels as ck
    from radixlm.sampling import draw_kernels as dk
    from radixlm.sampling.sampler import Sampler
    vocab = 151936
    sampler = Sampler(logits_hold_bf16=True)
    sampler.warm_up(vocab, torch.float32, torch.device("cuda"))
    kernels = [ck._stats_kernel, ck._search_kernel, ck._topk_mass_kernel, ck._finish_kernel,
               dk._draw_chunk_kernel, dk._draw_combine_kernel]

    def compiled() -> int:
        return sum(len(c[0]) for k in kernels for c in k.device_caches.values())

    before = compiled()
    kinds = [dict(top_p=0.9), dict(top_k=20), dict(min_p=0.1), dict(), dict(temperature=0),
             dict(top_k=40, top_p=0.8)]
    for batch in (1, 3, 27, 64, 65, 256):
        for mix in (kinds, kinds[1:2], kinds[3:4], kinds[2:3]):
            params = [mix[i % len(mix)] for i in range(batch)]
            logits = torch.randn(batch, vocab, device="cuda").to(torch.bfloat16).float()
            sampler(logits, _info(vocab, "cuda", params))
    assert compiled() == before


@pytest.mark.gpu
def test_gpu_noise_bits_match_noise_py():
    check_noise_bits(151936, "cuda")


@pytest.mark.gpu
def test_gpu_sampler_draws_same_tokens(monkeypatch):
    """The Sampler with the kernels draws the tokens its PyTorch code draws (the noise is a
    function of seed, position and token), at batch 64 and bf16 logits."""
    from radixlm.sampling.sampler import Sampler
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 49152, generator=g) * 4).to(torch.bfloat16).cuda()
    for params in (dict(temperature=0.8, top_p=0.9), dict(temperature=0.7, top_k=40),
                   dict(temperature=1.0, top_k=100, top_p=0.8, min_p=0.05),
                   dict(temperature=0.9)):
        info = _info(49152, "cuda", [params] * 64)
        # bf16 logits, and float32 ones holding bf16 values (a bf16 model's: 16-bit keys)
        for logits, hold_bf16 in ((x, False), (x.float(), True)):
            outs = []
            for disable in ("", "1"):
                monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", disable)
                outs.append(Sampler(logits_hold_bf16=hold_bf16)(logits, info))
            same = outs[0].next_token_ids == outs[1].next_token_ids
            assert same.sum().item() >= 63, params
            assert torch.allclose(outs[0].next_token_logprobs, outs[1].next_token_logprobs,
                                  atol=1e-4), params


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
