"""Speculative decoding (issue 18, first part: NGRAM drafts, greedy verification): the drafter
and the accept rule in isolation, then whole engines on the bundled model, whose outputs must be
token for token those of the engine without speculation (mixed batches, stops, overlap)."""

from __future__ import annotations

import pytest

from radixlm.scheduler.request import Req
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.speculation import COOLDOWN_STEPS, NgramSpeculator
from radixlm.speculative.ngram import NgramIndex

# ---------------------------------------------------------------------- drafter


def test_longest_window_and_latest_occurrence_win():
    ix = NgramIndex(1, 3)
    # "7" occurs twice; the 2-gram (6, 7) once, followed by 9: the longer match wins.
    assert ix.propose([6, 7, 9, 1, 7, 8, 5, 6, 7], 2) == [9, 1]
    # Only the 1-gram matches: its latest occurrence (followed by 8) is proposed.
    assert NgramIndex(1, 3).propose([7, 9, 7, 8, 3, 7], 1) == [8]


def test_index_follows_appended_tokens():
    ix, text = NgramIndex(2, 4), [1, 2, 3, 4, 5]
    assert ix.propose(text, 3) == []                  # no earlier occurrence yet
    text += [1, 2]
    assert ix.propose(text, 3) == [3, 4, 5]
    text += [3, 4, 5, 1, 2]
    assert ix.propose(text, 8) == [3, 4, 5, 1, 2]     # up to the end of the text
    assert ix.propose(text, 0) == []


def _req(max_new: int = 64) -> Req:
    return Req("r", [1, 2, 3], SamplingParams(max_new_tokens=max_new, temperature=0.0), seed=0)


def test_accept_keeps_drafts_up_to_the_first_mismatch_then_the_targets_token():
    spec, req = NgramSpeculator(4, 1, 4), _req()
    req.spec_drafts = [5, 6, 7, 8]
    assert spec.accept(req, [5, 6, 9, 1, 2]) == [5, 6, 9]
    req.spec_drafts = [5, 6]
    assert spec.accept(req, [5, 6, 4]) == [5, 6, 4]            # all accepted + the bonus token
    req.spec_drafts = [5]
    assert spec.accept(req, [3, 4]) == [3]
    assert req.spec_verify_ct == 3 and req.spec_drafts == []
    t = spec.totals
    assert (t.verify_steps, t.proposed, t.accepted, t.emitted) == (3, 7, 4, 7)


def test_rejected_drafts_pause_drafting():
    spec, req = NgramSpeculator(2, 1, 4), _req()
    req.output_ids = [1, 2, 3]                       # the text repeats: drafts are proposed
    for _ in range(10):
        assert spec.plan([req], free_tokens=100, max_rows=None, context_len=512) > 0
        spec.accept(req, [0] * (len(req.spec_drafts) + 1))    # the target never agrees
        if req.spec_cooldown:
            break
    assert req.spec_cooldown == COOLDOWN_STEPS
    assert spec.plan([req], 100, None, 512) == 0 and req.spec_cooldown == COOLDOWN_STEPS - 1


def test_drafts_respect_limits_and_eligibility():
    spec = NgramSpeculator(8, 1, 4)
    req = _req(max_new=3)
    req.output_ids = [1, 2]                          # one token left to produce: no draft
    assert spec.plan([req], 100, None, 512) == 0
    req = _req()
    req.output_ids = [1, 2, 3, 1, 2]
    assert spec.plan([req], 1, None, 512) == 1       # one free KV slot
    assert spec.plan([req], 100, 3, 512) == 2        # rows: a CUDA graph of 3
    sampled = Req("s", [1, 2, 3], SamplingParams(temperature=0.8), seed=0)
    sampled.output_ids = [1, 2, 3]
    assert spec.plan([sampled], 100, None, 512) == 0 and not sampled.spec_drafts
    many = [_req() for _ in range(spec.max_batch + 1)]
    for r in many:
        r.output_ids = [1, 2, 3]
    assert spec.plan(many, 100, None, 512) == 0      # a large batch does not speculate


def test_flags_are_checked():
    from radixlm.config import ServerArgs
    with pytest.raises(ValueError, match="--speculative-algorithm"):
        ServerArgs(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_num_draft_tokens=0)
    with pytest.raises(ValueError, match="min-match-window"):
        ServerArgs(speculative_ngram_min_match_window_size=5,
                   speculative_ngram_max_match_window_size=2)


# ---------------------------------------------------------------------- engines

COPY = ("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the "
        "river bank. Repeat: The quick brown fox")
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
PROMPTS = [COPY, CODE, "The capital of France is", "List the numbers: 1, 2, 3, 4, 5, 6, 7,"]


def _run(make_engine, spec: bool, **kwargs):
    engine = make_engine(max_total_tokens=4096,
                         speculative_algorithm="NGRAM" if spec else None, **kwargs)
    greedy = {"max_new_tokens": 40, "temperature": 0}
    params = [greedy, {**greedy, "stop": ["mul"]}, {"max_new_tokens": 12, "temperature": 0.7,
                                                    "sampling_seed": 5}, greedy]
    outs = engine.generate(PROMPTS, params)
    stopped = engine.generate(COPY, {**greedy, "stop": ["lazy"], "max_new_tokens": 30})
    stats = engine.get_stats()
    if spec:     # what /metrics and /get_server_info report
        assert stats.spec_verify_steps > 0 and stats.spec_accept_length >= 1.0, stats
        assert 0.0 <= stats.spec_accept_rate <= 1.0
    else:
        assert (stats.spec_verify_steps, stats.spec_accept_length) == (0, 1.0)
    return outs, stopped


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_greedy_outputs_equal_the_engine_without_speculation(make_engine, monkeypatch,
                                                             overlap):
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    base, base_stop = _run(make_engine, False)
    spec, spec_stop = _run(make_engine, True)
    for a, b in zip(base + [base_stop], spec + [spec_stop]):
        assert b["output_ids"] == a["output_ids"]
        assert b["text"] == a["text"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    assert "spec_verify_ct" not in base[0]["meta_info"]
    copy = spec[0]["meta_info"]
    # The copy prompt repeats itself: several tokens per verify step on average.
    assert copy["completion_tokens"] / copy["spec_verify_ct"] >= 1.5, copy
    assert spec[2]["meta_info"]["spec_verify_ct"] == 0      # sampled: no drafts
