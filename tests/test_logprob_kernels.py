"""The sampler's one-pass greedy / logprob kernels (sampling/logprob_kernels.py) and top-k
kernels (sampling/topk_kernels.py) against torch.argmax, torch.topk and logits.float() -
logsumexp, and the Sampler taking them on CUDA.

CPU: the cases below in a child process under TRITON_INTERPRET=1 (`run_cpu_interpreter_cases`),
the kernels against torch and the Sampler with its fused branch forced on against its PyTorch
path for every kind of batch it routes (penalties, bias, bans, mixed, top logprobs, ...);
GPU: the same cases on CUDA, at the vocabulary sizes of the benchmark models, and the sampler's
results with the fused path on against RADIXLM_DISABLE_FUSED_OPS=1.

    TRITON_INTERPRET=1 python tests/test_logprob_kernels.py
"""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import run_cpu_interpreter_cases, run_interpreter_cases


def make_logits(rows: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0
                ) -> torch.Tensor:
    """Random logits with the awkward cases planted: a maximum tied between two chunks, or two
    lanes of one chunk at small vocabularies (row 0), and within one lane, one load apart
    (row 1); -inf entries (row 2, as a vocabulary padding or a ban leaves them), and a row of
    -inf only (row 3)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    if rows > 0:
        x[0, [vocab - 5, 7000 % vocab]] = 60.0
    if rows > 1:
        x[1, [3, (3 + 2048) % vocab]] = 60.0
    if rows > 2:
        x[2, ::3] = float("-inf")
    if rows > 3:
        x[3] = float("-inf")
    return x.to(device)


def check(rows: int, vocab: int, dtype: torch.dtype, device: str) -> float:
    from radixlm.sampling.logprob_kernels import chosen_logprobs, greedy_with_logprobs
    x = make_logits(rows, vocab, dtype, device)
    ids, logprobs = greedy_with_logprobs(x)
    if rows == 0:
        assert ids.shape == (0,) and logprobs.shape == (0,)
        return 0.0
    ref = x.float()
    ref_ids = torch.argmax(ref, dim=-1)
    ref_lp = ref.gather(1, ref_ids.unsqueeze(1)).squeeze(1) - torch.logsumexp(ref, dim=-1)
    assert ids.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert torch.equal(ids.cpu(), ref_ids.cpu()), (ids, ref_ids)
    # Row 3 (-inf only): NaN on both sides.
    assert torch.equal(logprobs.isnan().cpu(), ref_lp.isnan().cpu())
    err = (logprobs - ref_lp).nan_to_num().abs().max().item()
    assert err <= 2e-5 * max(1.0, ref_lp.nan_to_num().abs().max().item()), err
    # Given tokens (a sampled batch): some other than the argmax.
    g = torch.Generator().manual_seed(1)
    given = torch.randint(0, vocab, (rows,), generator=g).to(device)
    lp = chosen_logprobs(x, given)
    ref_given = ref.gather(1, given.unsqueeze(1)).squeeze(1) - torch.logsumexp(ref, dim=-1)
    finite = ref_given.isfinite()
    assert torch.equal(lp.isfinite().cpu(), finite.cpu())
    err2 = (lp - ref_given)[finite].abs().max().item() if finite.any() else 0.0
    assert err2 <= 2e-5 * max(1.0, ref_given[finite].abs().max().item()), err2
    return max(err, err2)


def check_topk(rows: int, vocab: int, k: int, dtype: torch.dtype, device: str,
               adjusted: bool = False) -> float:
    """top_k_with_logprobs against torch.topk over the scores and logsumexp of the logits:
    the same scores and ids (equal scores by lower id), logprobs within float32 rounding; the
    first id torch.argmax's. `adjusted`: float32 scores that differ from the logits."""
    from radixlm.sampling.topk_kernels import top_k_with_logprobs
    x = make_logits(rows, vocab, dtype, device)
    scores = x
    if adjusted:
        g = torch.Generator().manual_seed(7)
        scores = x.float() + (torch.randn(rows, vocab, generator=g) * 3).to(device)
    out = top_k_with_logprobs(scores, x, k)
    assert out.shape == (3, rows, k) and out.dtype == torch.float32
    if rows == 0:
        return 0.0
    ref_s = scores.float()
    lse = torch.logsumexp(x.float(), dim=-1)
    vals, _ = torch.topk(ref_s, k, dim=-1)
    assert torch.equal(out[1].cpu(), vals.cpu()), (out[1], vals)
    ids = out[0].long()
    assert torch.equal(ids[:, 0].cpu(), torch.argmax(ref_s, dim=-1).cpu())
    # the ids hold those scores, no id twice, equal scores by lower id
    assert torch.equal(ref_s.gather(1, ids).cpu(), vals.cpu())
    for r in range(rows):
        row_ids = ids[r].tolist()
        assert len(set(row_ids)) == k, row_ids
        for j in range(k - 1):
            if out[1, r, j] == out[1, r, j + 1]:
                assert row_ids[j] < row_ids[j + 1], row_ids
    ref_lp = x.float().gather(1, ids) - lse.unsqueeze(1)
    assert torch.equal(out[2].isnan().cpu(), ref_lp.isnan().cpu())
    err = (out[2] - ref_lp).nan_to_num(posinf=0, neginf=0).abs().max().item()
    assert err <= 2e-5 * max(1.0, lse.nan_to_num().abs().max().item()), err
    return err


TOPK_CPU_CASES = [(4, 5000, 16, torch.float32, False), (4, 2048, 32, torch.bfloat16, True),
                  (3, 100, 1, torch.float16, False), (4, 37, 20, torch.float32, True),
                  (0, 300, 4, torch.float32, False)]

CPU_CASES = [(4, 20000, torch.float32), (5, 8192, torch.bfloat16), (1, 100, torch.float16),
             (0, 300, torch.float32)]


# Batches the Sampler sends down each path: (params of each row, top_logprobs_nums,
# alternatives). Plain greedy: both stages fused; penalties, a bias, a min_new_tokens ban, a
# mixed or sampled batch: PyTorch tokens, fused logprob; top logprobs, alternatives: PyTorch.
SAMPLER_BATCHES = [
    ([dict(temperature=0)] * 3, None, 0),
    ([dict(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5)] * 3, None, 0),
    ([dict(temperature=0, logit_bias={7: 50.0})] * 3, None, 0),
    ([dict(temperature=0, min_new_tokens=4)] * 3, None, 0),
    ([dict(temperature=0), dict(temperature=0.7, top_k=20), dict(temperature=0)], None, 0),
    ([dict(temperature=0.9, top_p=0.8)] * 3, None, 0),
    ([dict(temperature=0)] * 3, [0, 3, 1], 0),
    ([dict(temperature=0)] * 3, None, 4),
    ([dict(temperature=0, min_new_tokens=4)] * 3, None, 16),
    ([dict(temperature=0, logit_bias={7: 50.0})] * 3, [1, 1, 1], 0),
    ([dict(temperature=0), dict(temperature=0.7, top_k=20), dict(temperature=0)], [2, 0, 5], 4),
]


def by_value_then_id(pair: tuple[float, int]) -> tuple[float, int]:
    return (-pair[0], pair[1])


def canonical_alternatives(alts: torch.Tensor) -> torch.Tensor:
    """[3, B, K] alternatives with each row's equal scores listed by lower token id (the
    kernel's order; torch.topk's among ties is unspecified)."""
    out = alts.clone()
    for row in range(alts.shape[1]):
        order = sorted(range(alts.shape[2]),
                       key=lambda j: (-alts[1, row, j].item(), alts[0, row, j].item()))
        out[:, row] = alts[:, row, order]
    return out


def check_sampler(rows_params: list[dict], nums: list[int] | None, alternatives: int) -> float:
    """The Sampler with its fused branch forced on (the kernels run where the logits are;
    here the interpreter) against the PyTorch path: the same tokens, top logprobs and
    alternatives, the chosen logprobs within float32 rounding."""
    import radixlm.sampling.sampler as sampler_mod
    from radixlm.sampling.batch_info import SamplingBatchInfo
    from radixlm.sampling.params import SamplingParams
    from radixlm.sampling.request import SamplingRequest
    vocab = 300
    logits = make_logits(3, vocab, torch.float32, "cpu", seed=3)
    logits[1] = torch.randn(vocab, generator=torch.Generator().manual_seed(5))  # all finite
    reqs = [SamplingRequest(params=SamplingParams(**p), seed=i, prompt_ids=[1, 7, 9],
                            output_ids=[7, 7, 2], eos_token_ids=[0])
            for i, p in enumerate(rows_params)]
    info = SamplingBatchInfo.build(reqs, vocab, torch.device("cpu"))
    outs = []
    for fused in (True, False):
        sampler_mod.use_fused = lambda x, on=fused: on
        outs.append(sampler_mod.Sampler()(logits, info, nums, alternatives))
    assert torch.equal(outs[0].next_token_ids, outs[1].next_token_ids)
    if nums:
        # torch.topk lists equal values in no set order; the kernel by lower token id.
        for (lp_f, ids_f), (lp_t, ids_t) in zip(outs[0].top_logprobs, outs[1].top_logprobs):
            f = sorted(zip(lp_f, ids_f), key=by_value_then_id)
            t = sorted(zip(lp_t, ids_t), key=by_value_then_id)
            assert [i for _, i in f] == [i for _, i in t], (f, t)
            assert [v for v, _ in f] == pytest.approx([v for v, _ in t], abs=1e-5)
    else:
        assert outs[0].top_logprobs is None and outs[1].top_logprobs is None
    if alternatives:
        a, b = (canonical_alternatives(o.alternatives) for o in outs)
        assert torch.equal(a[:2], b[:2]), (a, b)
        torch.testing.assert_close(a[2], b[2], rtol=0, atol=1e-5)
    a, b = outs[0].next_token_logprobs, outs[1].next_token_logprobs
    assert torch.equal(a.isnan(), b.isnan())
    err = (a - b).nan_to_num().abs().max().item()
    assert err <= 1e-5, err
    return err


def _interpreter_cases():
    for rows, vocab, dtype in CPU_CASES:
        yield f"rows={rows} vocab={vocab} {dtype}", \
            lambda a=(rows, vocab, dtype): check(*a, "cpu")
    for rows, vocab, k, dtype, adjusted in TOPK_CPU_CASES:
        yield f"top-{k} rows={rows} vocab={vocab} {dtype} adjusted={adjusted}", \
            lambda a=(rows, vocab, k, dtype, "cpu", adjusted): check_topk(*a)
    for rows_params, nums, alternatives in SAMPLER_BATCHES:
        yield f"sampler {rows_params[0]}.. nums={nums} alternatives={alternatives}", \
            lambda a=(rows_params, nums, alternatives): check_sampler(*a)


def test_interpreter_cases():
    run_cpu_interpreter_cases(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, vocab", [(1, 151936), (64, 151936), (4, 128256), (5, 49152),
                                         (3, 100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_matches_torch(rows, vocab, dtype):
    check(rows, vocab, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("rows, vocab, k", [(64, 151936, 16), (1, 128256, 20), (5, 49152, 32),
                                            (64, 49152, 16), (3, 100, 5)])
@pytest.mark.parametrize("adjusted", [False, True])
def test_gpu_topk_matches_torch(rows, vocab, k, adjusted):
    check_topk(rows, vocab, k, torch.bfloat16, "cuda", adjusted)


@pytest.mark.gpu
def test_gpu_sampler_same_with_and_without_fused(monkeypatch):
    """The Sampler's outputs with the kernels (greedy batch; sampled batch) equal the PyTorch
    path's: the same tokens, logprobs within float32 rounding."""
    from radixlm.sampling.batch_info import SamplingBatchInfo
    from radixlm.sampling.params import SamplingParams
    from radixlm.sampling.request import SamplingRequest
    from radixlm.sampling.sampler import Sampler
    x = make_logits(6, 32000, torch.bfloat16, "cuda")
    x[3] = 0.0      # (no -inf-only row here: the sampled path's draw needs a finite logit)
    for params in (dict(temperature=0), dict(temperature=0.8, top_p=0.9)):
        reqs = [SamplingRequest(params=SamplingParams(**params), seed=i, prompt_ids=[1, 2],
                                output_ids=[]) for i in range(6)]
        info = SamplingBatchInfo.build(reqs, 32000, torch.device("cuda"))
        outs = []
        for disable in ("", "1"):
            monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", disable)
            outs.append(Sampler()(x, info))
        assert torch.equal(outs[0].next_token_ids, outs[1].next_token_ids)
        torch.testing.assert_close(outs[0].next_token_logprobs, outs[1].next_token_logprobs,
                                   rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
