"""Speculative decoding (issue 18, first part: NGRAM drafts, greedy verification): the drafter
and the accept rule in isolation, then whole engines on the bundled model, whose outputs must be
token for token those of the engine without speculation (mixed batches, stops, overlap)."""

from __future__ import annotations

import random
import re

import pytest

from radixlm.scheduler.request import Req
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.spec_policy import (FIRST_PAUSE_STEPS, MAX_PAUSE_STEPS, DraftPolicy,
                                           StepTimes)
from radixlm.scheduler.speculation import NgramDrafter, Speculator
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


def _candidates_by_scan(text: list[int], lo: int, hi: int, keep: int, max_tokens: int,
                        limit: int) -> list[list[int]]:
    """NgramIndex.candidates by scanning the text: for each window, longest first, the latest
    `keep` earlier occurrences of the text's suffix of that length, latest first, each
    continuation once."""
    end, found, seen = len(text), [], set()
    for w in range(min(hi, end - 1), lo - 1, -1):
        ends = [e for e in range(w, end) if text[e - w:e] == text[end - w:]][-keep:]
        for e in reversed(ends):
            if e not in seen:
                seen.add(e)
                found.append(text[e:e + max_tokens])
                if len(found) == limit:
                    return found
    return found


@pytest.mark.parametrize("lo,hi,keep", [(1, 12, 1), (2, 4, 1), (1, 3, 3), (3, 5, 2)])
def test_index_matches_a_scan_of_the_text(lo, hi, keep):
    """The incremental index proposes what a scan of the whole text finds, as the text grows by
    a few tokens at a time (random texts over a small alphabet: many repeats)."""
    rng = random.Random(lo * 100 + hi * 10 + keep)
    for _ in range(20):
        ix, text = NgramIndex(lo, hi, occurrences=keep), []
        for _ in range(30):
            text += [rng.randrange(4) for _ in range(rng.randrange(1, 5))]
            k, limit = rng.randrange(1, 6), rng.randrange(1, 4)
            assert ix.candidates(text, k, limit) == _candidates_by_scan(text, lo, hi, keep, k,
                                                                        limit), text


def _req(max_new: int = 64) -> Req:
    return Req("r", [1, 2, 3], SamplingParams(max_new_tokens=max_new, temperature=0.0), seed=0)


def test_accept_keeps_drafts_up_to_the_first_mismatch_then_the_targets_token():
    spec, req = Speculator(NgramDrafter(1, 4), 4), _req()
    req.spec_drafts = [5, 6, 7, 8]
    assert (got := spec.accept(req, [5, 6, 9, 1, 2])) == [5, 6, 9]
    spec.record_used(got, 3)
    req.spec_drafts = [5, 6]
    assert (got := spec.accept(req, [5, 6, 4])) == [5, 6, 4]    # all accepted + the bonus token
    spec.record_used(got, 1)       # a stop condition after the first: the others are dropped
    req.spec_drafts = [5]
    assert (got := spec.accept(req, [3, 4])) == [3]
    spec.record_used(got, 1)
    assert req.spec_verify_ct == 3 and req.spec_drafts == []
    t = spec.totals
    assert (t.verify_steps, t.proposed, t.accepted, t.emitted) == (3, 7, 3, 5)


def test_rejected_drafts_pause_drafting_for_longer_each_time():
    spec, req = Speculator(NgramDrafter(1, 4), 2), _req()
    req.output_ids = [1, 2, 3]                       # the text repeats: drafts are proposed
    pauses = []
    for _ in range(200):
        if spec.plan([req], free_tokens=100, max_rows=None, context_len=512):
            spec.accept(req, [0] * (len(req.spec_drafts) + 1))    # the target never agrees
            if req.spec_cooldown:
                pauses.append(req.spec_cooldown)
    assert pauses[:5] == [FIRST_PAUSE_STEPS << i for i in range(5)]
    assert max(pauses) == MAX_PAUSE_STEPS
    # Rejected drafts cost a waiting step each: a few per pause, far fewer than the steps.
    assert spec.totals.verify_steps < 200 // 8


def test_a_pause_runs_down_while_steps_overlap():
    """Under the overlap scheduler a paused request has a token in flight at every plan (its
    steps overlap because it may not draft); the pause must still end."""
    spec, req = Speculator(NgramDrafter(1, 4), 2), _req()
    req.output_ids = [1, 2, 3]
    req.spec_cooldown = FIRST_PAUSE_STEPS
    assert not spec.may_draft([req])
    for _ in range(FIRST_PAUSE_STEPS):
        req.num_pending = 1
        assert spec.plan([req], 100, None, 512) == 0
    assert req.spec_cooldown == 0 and spec.may_draft([req])
    req.num_pending = 0          # the scheduler processes the pending step first
    assert spec.plan([req], 100, None, 512) > 0


def test_drafts_that_pay_never_pause_and_a_paying_attempt_resets_the_pauses():
    spec, req = Speculator(NgramDrafter(1, 4), 4), _req(max_new=1000)
    req.output_ids = [1, 2, 3, 1, 2, 3, 1]
    for _ in range(50):      # two drafts kept every time: 3 tokens a 1.5x step
        assert spec.plan([req], 100, None, 4096) == 3
        spec.accept(req, req.spec_drafts[:2] + [9, 9])
    assert req.spec_cooldown == 0 and req.spec_pauses == 0
    req.spec_pauses = 3
    spec.plan([req], 100, None, 4096)
    spec.accept(req, list(req.spec_drafts) + [9])          # all kept: 5 tokens
    assert req.spec_pauses == 0


def test_the_measured_cost_ratio_sets_the_bar():
    """A verify step timed at 3x a plain overlapped one: 2 tokens an attempt no longer pay,
    where at the default ratio (1.5) they would."""
    times = StepTimes()
    t = 0.0
    for verify, dt in [(False, 1.0)] * 3 + [(True, 3.0)] * 3:
        t += dt
        times.on_processed(True, 1, verify, waited=verify, now=t)
    assert times.cost_ratio == pytest.approx(3.0)
    # A prefill between two steps, or another batch size, is not a step's time.
    times.on_processed(False, 1, False, waited=True, now=t + 50)
    times.on_processed(True, 1, True, waited=True, now=t + 53)
    times.on_processed(True, 2, False, waited=False, now=t + 90)
    assert times.cost_ratio == pytest.approx(3.0)
    for ratio_times, pauses in ((StepTimes(), False), (times, True)):
        policy, req = DraftPolicy(ratio_times), _req()
        for _ in range(10):
            policy.after_attempt(req, 2)
        assert (req.spec_cooldown > 0) == pauses
    # A batch: one request's drafts must pay for everyone's waiting step.
    policy, a, b = DraftPolicy(times), _req(), _req()
    a.spec_gain, b.spec_gain = 5.0, 1.0
    assert policy.batch_pays([a], 1) and policy.batch_pays([a, b], 2)
    assert not policy.batch_pays([a], 3) and not policy.batch_pays([], 1)


def test_drafts_respect_limits_and_eligibility():
    spec = Speculator(NgramDrafter(1, 4), 8)
    req = _req(max_new=3)
    req.output_ids = [1, 2]                          # one token left to produce: no draft
    assert spec.plan([req], 100, None, 512) == 0
    req = _req()
    req.output_ids = [1, 2, 3, 1, 2]
    assert spec.plan([req], 1, None, 512) == 1       # one free KV slot
    assert spec.plan([req], 100, 3, 512) == 2        # rows: a CUDA graph of 3
    # A request feeding 4 tokens from the host (a jump, or a short prompt riding the step)
    # takes 4 of the graph's rows: of 6, 6 - 1 - 4 are left for drafts.
    fed = _req()
    fed.output_ids, fed.kv_allocated_len, fed.input_on_host = [1, 2, 3, 1, 2], 4, True
    assert fed.num_decode_tokens == 4
    assert spec.plan([req, fed], 100, 6, 512) == 1 and not fed.spec_drafts
    sampled = Req("s", [1, 2, 3], SamplingParams(temperature=0.8, top_p=0.9), seed=0)
    sampled.output_ids = [1, 2, 3]
    assert spec.plan([sampled], 100, None, 512) == 3     # verified by sampling (verify_targets)
    # Penalties, logit bias, min_new_tokens and logprobs are verified row by row as well.
    for params in (SamplingParams(temperature=0.8, frequency_penalty=0.5),
                   SamplingParams(temperature=0.0, logit_bias={"7": 3.0}),
                   SamplingParams(temperature=0.0, min_new_tokens=8)):
        adjusted = Req("a", [1, 2, 3], params, seed=0)
        adjusted.output_ids = [1, 2, 3]
        assert spec.plan([adjusted], 100, None, 512) == 3
    jumping = Req("j", [1, 2, 3], SamplingParams(temperature=0.0), seed=0)
    jumping.output_ids, jumping.input_on_host = [1, 2, 3], True   # feeds forced tokens
    assert spec.plan([jumping], 100, None, 512) == 0 and not jumping.spec_drafts
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
    # Streamed: each chunk's text is the whole text so far (SGLang's shape); a verify step
    # streams the tokens it accepted in one chunk.
    chunks = list(engine.generate(COPY, {**greedy, "stop": ["lazy"], "max_new_tokens": 30},
                                  stream=True))
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and texts[-1] == stopped["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == stopped["meta_info"]["finish_reason"]
    if spec:
        assert len(chunks) < stopped["meta_info"]["completion_tokens"], len(chunks)
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


def test_pipelined_verify_steps_keep_the_output(make_engine, monkeypatch):
    """Under the overlap scheduler (with RADIXLM_SPEC_PIPELINE=1) a verify step of greedy n-gram
    chains is followed by one built before its results are read, on the guess that it accepts
    every draft; where it does not, the step built on the guess is dropped for that request
    (its KV released, its input corrected). Outputs equal the engine's without speculation
    (the overlap case of the test above has n-gram steps that wait), batch 1 and mixed batches
    (stops, short max_new_tokens, a sampled request), KV accounting checked after every step,
    nothing leaked."""
    from helpers import assert_pool_empty
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    monkeypatch.setenv("RADIXLM_CHECK_INVARIANTS", "1")
    # Pipelined whatever the accept rate, so that many steps built on the guess are dropped;
    # drafting never paused (at a ratio of 1 every attempt pays), so that stops are found by
    # verify steps with a step built on them in flight.
    monkeypatch.setenv("RADIXLM_SPEC_PIPELINE_MIN_FULL_RATE", "0")
    monkeypatch.setenv("RADIXLM_SPEC_COST_RATIO", "1")
    greedy = {"max_new_tokens": 32, "temperature": 0}
    prompts = [COPY, CODE, COPY, PROMPTS[3], "The capital of France is", COPY]
    params = [greedy, {**greedy, "stop": ["mul"]}, {**greedy, "max_new_tokens": 9}, greedy,
              {"max_new_tokens": 16, "temperature": 0.7, "sampling_seed": 3},
              {**greedy, "stop": ["river"]}]
    outs, stats, stop_ids = {}, {}, []
    monkeypatch.setenv("RADIXLM_SPEC_PIPELINE", "1")
    for name, spec in (("off", None), ("pipelined", "NGRAM")):
        engine = make_engine(max_total_tokens=4096, speculative_algorithm=spec,
                             speculative_num_draft_tokens=4)
        alone = [engine.generate(p, q) for p, q in zip(prompts[:2] + prompts[5:],
                                                       params[:2] + params[5:])]
        # Stop tokens inside a copied run, where steps are built on a guess.
        stop_ids = stop_ids if name != "off" else alone[0]["output_ids"][10:32:10]
        alone += [engine.generate(COPY, {**greedy, "stop_token_ids": [t]}) for t in stop_ids]
        outs[name] = alone + engine.generate(prompts, params)
        stats[name] = engine.get_stats()
        assert_pool_empty(engine)
        engine.shutdown()
    for a, b in zip(outs["off"], outs["pipelined"]):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    assert stats["off"].spec_pipelined_steps == 0
    assert stats["pipelined"].spec_pipelined_steps > 5, stats["pipelined"]


def test_sampled_outputs_equal_the_engine_without_speculation(make_engine, monkeypatch):
    """A sampled request keeps a draft exactly when sampling would have drawn it (the noise is
    a function of seed and position), so with the same seeds the texts are the same token for
    token: the output distribution is the target's. Many seeds, and filters of each kind, under
    the overlap scheduler (the plain loop samples in the tests below)."""
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    filters = [{"temperature": 0.6}, {"temperature": 0.9, "top_p": 0.9},
               {"temperature": 1.0, "top_k": 20}, {"temperature": 0.8, "min_p": 0.05}]
    prompts, params = [], []
    for seed in range(8):
        prompts.append([COPY, CODE][seed % 2])
        params.append({"max_new_tokens": 24, "sampling_seed": seed, **filters[seed % 4]})
    outs = {}
    for spec in (False, True):
        engine = make_engine(max_total_tokens=4096, max_running_requests=4,
                             speculative_algorithm="NGRAM" if spec else None)
        outs[spec] = engine.generate(prompts, params)
        stats = engine.get_stats()
        engine.shutdown()
    assert [o["output_ids"] for o in outs[True]] == [o["output_ids"] for o in outs[False]]
    assert len({tuple(o["output_ids"]) for o in outs[False]}) > 4     # the seeds differ
    assert sum(o["meta_info"]["spec_verify_ct"] > 0 for o in outs[True]) >= 4
    # Sampled drafts were kept: more than one token per verify step on average.
    assert stats.spec_accept_length > 1.2, stats


def test_adjusted_and_logprob_outputs_equal_the_engine_without_speculation(
        make_engine, monkeypatch):
    """Penalties, logit bias and min_new_tokens are applied to each verify row as if the drafts
    before it were already output, and logprobs of accepted tokens are their rows' logprobs:
    tokens and logprobs are those of decoding without drafts (under the overlap scheduler; the
    plain loop verifies penalised and sampled rows in the draft-model tests)."""
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    base = {"max_new_tokens": 24}
    params = [{**base, "temperature": 0, "frequency_penalty": 0.4},
              {**base, "temperature": 0.8, "presence_penalty": 0.5, "repetition_penalty": 1.1,
               "sampling_seed": 3},
              {**base, "temperature": 0, "logit_bias": {"253": 4.0, "260": -100}},
              {**base, "temperature": 0, "min_new_tokens": 20},
              {**base, "temperature": 0.7, "top_k": 30, "sampling_seed": 9}]
    prompts = [COPY, CODE, COPY, CODE, COPY]
    outs, stats = {}, {}
    for spec in (False, True):
        engine = make_engine(max_total_tokens=4096, max_running_requests=8,
                             speculative_algorithm="NGRAM" if spec else None)
        outs[spec] = engine.generate(prompts, params, return_logprob=True,
                                     top_logprobs_num=3, token_ids_logprob=[13, 253])
        stats[spec] = engine.get_stats()
        engine.shutdown()
    for a, b in zip(outs[False], outs[True]):
        assert b["output_ids"] == a["output_ids"]
        la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in lb] == b["output_ids"]
        assert [t for _, t, _ in lb] == [t for _, t, _ in la]
        assert [lp for lp, _, _ in lb] == pytest.approx([lp for lp, _, _ in la], abs=1e-4)
        ta, tb = a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]
        assert len(tb) == len(b["output_ids"]) and all(len(t) == 3 for t in tb)
        assert [[tok for _, tok, _ in t] for t in tb] == [[tok for _, tok, _ in t] for t in ta]
        ia, ib = (x["meta_info"]["output_token_ids_logprobs"] for x in (a, b))
        assert len(ib) == len(b["output_ids"])
        assert [lp for e in ib for lp, _, _ in e] == pytest.approx(
            [lp for e in ia for lp, _, _ in e], abs=1e-4)
        assert all([t for _, t, _ in e] == [13, 253] for e in ib)
    # All but the penalised sampled one (whose text does not repeat itself) drafted.
    assert sum(o["meta_info"]["spec_verify_ct"] > 0 for o in outs[True]) >= 4
    assert len(outs[True][3]["output_ids"]) >= 20        # min_new_tokens held under drafts
    assert stats[True].spec_accept_length > 1.2, stats[True]


def test_sampled_tokens_follow_the_target_distribution(make_engine, smollm_dir, tmp_path):
    """A statistical test against an independent computation: a random 8-token-vocabulary
    Llama (HF transformers gives the exact distribution of the first three sampled tokens by
    enumerating every path) is sampled from 1200 seeds with NGRAM drafts, which are both kept
    and rejected; the empirical joint distribution of the tokens the verify steps decide must
    be within a total-variation bound of the exact one."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=7, torch_dtype="float32")
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():   # peaked enough that drafts are often right, not always
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    prompt, temperature, seeds = [0, 3, 1, 4, 1, 5, 6, 2, 6, 5, 3, 5, 4, 3, 1, 4], 1.0, 1200

    # Exact P(t1, t2, t3): softmax(logits / T) at each position, every path enumerated.
    exact: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.no_grad():
        for _ in range(3):
            paths = list(exact)
            ids = torch.tensor([prompt + list(p) for p in paths])
            probs = torch.softmax(model(ids).logits[:, -1].double() / temperature, -1)
            exact = {p + (t,): exact[p] * float(probs[i, t])
                     for i, p in enumerate(paths) for t in range(8)}

    engine = make_engine(model_path=str(tmp_path), tokenizer_path=smollm_dir,
                         max_running_requests=8, speculative_algorithm="NGRAM",
                         speculative_num_draft_tokens=2)
    outs = engine.generate(input_ids=[prompt] * seeds, sampling_params=[
        {"max_new_tokens": 3, "temperature": temperature, "ignore_eos": True,
         "sampling_seed": s} for s in range(seeds)])
    stats = engine.get_stats()
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        key = tuple(o["output_ids"])
        counts[key] = counts.get(key, 0) + 1
    assert sum(counts.values()) == seeds and all(len(k) == 3 for k in counts)
    assert sum(o["meta_info"]["spec_verify_ct"] > 0 for o in outs) > seeds // 2
    assert 0.2 < stats.spec_accept_rate < 0.9, stats        # drafts kept and rejected
    keys = list(exact)
    seen = torch.tensor([counts.get(k, 0) / seeds for k in keys], dtype=torch.float64)
    p = torch.tensor([exact[k] for k in keys], dtype=torch.float64)
    # The bound: what exact sampling gives at the 99.9th percentile, from 4000 simulated runs
    # of `seeds` draws each (a wrong accept rule moves far more mass than that).
    gen = torch.Generator().manual_seed(0)
    sims = torch.stack([torch.bincount(torch.multinomial(p, seeds, True, generator=gen),
                                       minlength=len(keys)) for _ in range(4000)]) / seeds
    by_pos = [torch.tensor([k[pos] for k in keys]) for pos in range(3)]

    def tv(q: torch.Tensor, pos: int | None = None) -> torch.Tensor:
        """Total variation to the exact distribution: joint, or one position's marginal."""
        d = q - p
        if pos is not None:
            d = torch.zeros(*d.shape[:-1], 8, dtype=d.dtype).index_add_(-1, by_pos[pos], d)
        return 0.5 * d.abs().sum(-1)

    for pos in (None, 0, 1, 2):
        bound = float(torch.quantile(tv(sims, pos), 0.999))
        assert float(tv(seen, pos)) < bound, (pos, float(tv(seen, pos)), bound)


PEOPLE = {"type": "array", "minItems": 3, "maxItems": 3, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                     "city": {"type": "string", "maxLength": 12}},
    "required": ["name", "city"]}}


@pytest.mark.parametrize("jump_forward", [False, True], ids=["no_jump", "jump"])
def test_grammar_outputs_equal_the_engine_without_speculation(make_engine, monkeypatch,
                                                              jump_forward):
    """Grammar requests draft too: drafts are cut at the first token the grammar rejects, each
    verify row is sampled under the grammar's mask after the drafts before it, and jump-forward
    is tried after each accepted token, as decoding one token a step would. Outputs (JSON that
    repeats its keys, a regex) equal the engine without drafts, and validate."""
    import json

    import jsonschema

    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    prompt = ("Give three people as JSON, for example "
              '[{"name": "Ann", "city": "Oslo"}, {"name": "Bob", "city": "Rome"}]: ')
    schema = json.dumps(PEOPLE)
    params = [{"max_new_tokens": 64, "temperature": 0, "json_schema": schema},
              {"max_new_tokens": 64, "temperature": 0.8, "sampling_seed": 4,
               "json_schema": schema},
              {"max_new_tokens": 40, "temperature": 0, "regex": r"(ab, ){3,8}done\."}]
    prompts = [prompt, prompt, "Repeat 'ab, ' a few times, then say done: ab, ab, "]
    outs = {}
    for spec in (False, True):
        engine = make_engine(max_total_tokens=4096, disable_jump_forward=not jump_forward,
                             speculative_algorithm="NGRAM" if spec else None)
        outs[spec] = engine.generate(prompts, params)
        engine.shutdown()
    for a, b in zip(outs[False], outs[True]):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    for o in outs[True][:2]:
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(o["text"]), PEOPLE)
    assert re.fullmatch(r"(ab, ){3,8}done\.", outs[True][2]["text"])
    # Repeated keys and punctuation are drafted and kept: fewer verify steps than tokens.
    json_out = outs[True][0]
    assert json_out["meta_info"]["spec_verify_ct"] > 0
    assert json_out["meta_info"]["completion_tokens"] > json_out["meta_info"]["spec_verify_ct"]


# ---------------------------------------------------------------------- draft models (STANDALONE)


def test_standalone_flags_are_checked():
    from radixlm.config import ServerArgs
    with pytest.raises(ValueError, match="--speculative-draft-model-path: is required"):
        ServerArgs(speculative_algorithm="standalone")
    with pytest.raises(ValueError, match="--speculative-draft-model-path: needs"):
        ServerArgs(speculative_draft_model_path="/m")
    for kwargs, flag in (({"speculative_eagle_topk": 9}, "--speculative-eagle-topk"),
                         ({"speculative_num_steps": 0}, "--speculative-num-steps"),
                         ({"page_size": 16}, "--page-size"), ({"tp_size": 2}, "--tp-size"),
                         ({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache")):
        with pytest.raises(ValueError, match=flag):
            ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path="/m",
                       **kwargs)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_identical_draft_model_accepts_everything(make_engine, smollm_dir, monkeypatch,
                                                  overlap):
    """The target as its own draft model: every draft is the token the target will choose
    (greedy, or sampled with the request's seed and penalties), so nearly all are kept (fp32
    rows computed one by one vs together may differ in the last bits), and the outputs, mixed
    in one batch with prefix sharing, equal the engine without speculation."""
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    import json
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                          "age": {"type": "integer"}},
                         "required": ["name", "age"]})
    prompts = [COPY, CODE, "The capital of France is", COPY]
    params = [{"max_new_tokens": 24, "temperature": 0},
              {"max_new_tokens": 24, "temperature": 0, "stop": ["mul"]},
              {"max_new_tokens": 16, "temperature": 0.7, "sampling_seed": 5},
              {"max_new_tokens": 20, "temperature": 0, "frequency_penalty": 0.3},
              # The draft model drafts the grammar's stop token (EOS) at the end of the JSON.
              {"max_new_tokens": 40, "temperature": 0.8, "sampling_seed": 3,
               "json_schema": schema}]
    # The draft as an HF directory, and as the GGUF file itself (converted like a target).
    from radixlm.model_executor.gguf_convert import bundled_gguf_path
    draft = bundled_gguf_path() if overlap else smollm_dir
    outs = {}
    for spec in (False, True):
        extra = (dict(speculative_algorithm="STANDALONE", speculative_draft_model_path=draft,
                      speculative_num_steps=3) if spec else {})
        engine = make_engine(max_total_tokens=4096, **extra)
        chat = engine.apply_chat_template([{"role": "user", "content":
                                            "Give a JSON object with name and age."}])
        outs[spec] = engine.generate(prompts + [chat], params)
        stats = engine.get_stats()
        engine.shutdown()
    for a, b in zip(outs[False], outs[True]):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    assert outs[True][4]["meta_info"]["finish_reason"]["type"] == "stop"
    json.loads(outs[True][4]["text"])
    # The draft model drafts as each request samples (its seeded noise, its penalties).
    assert stats.spec_verify_steps > 0 and stats.spec_accept_rate > 0.95, stats
    greedy = outs[True][0]["meta_info"]
    assert greedy["completion_tokens"] / greedy["spec_verify_ct"] >= 3.0, greedy


def test_small_draft_model_keeps_the_target_output(make_engine, smollm_dir, tmp_path):
    """A random tiny draft model (same vocabulary) is mostly wrong: the output is still the
    target's, token for token, and what it drafts is mostly rejected."""
    from helpers import tiny_checkpoint
    draft = tiny_checkpoint(tmp_path / "draft", "llama")     # 512 positions
    outs = {}
    with pytest.raises(Exception, match="--speculative-draft-model-path: .*lower --context-length"):
        make_engine(speculative_algorithm="STANDALONE", speculative_draft_model_path=draft)
    # (the draft's path named by its own flag, not the target's --model-path)
    with pytest.raises(Exception, match="--speculative-draft-model-path '/nonexistent' does "):
        make_engine(speculative_algorithm="STANDALONE",
                    speculative_draft_model_path="/nonexistent")
    for spec in (False, True):
        extra = (dict(speculative_algorithm="STANDALONE", speculative_draft_model_path=draft,
                      speculative_num_steps=2) if spec else {})
        engine = make_engine(max_total_tokens=4096, context_length=512, **extra)
        outs[spec] = engine.generate([COPY, CODE], {"max_new_tokens": 16, "temperature": 0})
        stats = engine.get_stats()
        engine.shutdown()
    assert [o["output_ids"] for o in outs[True]] == [o["output_ids"] for o in outs[False]]
    assert stats.spec_verify_steps > 0 and stats.spec_accept_rate < 0.5, stats


def test_draft_model_with_another_vocabulary_is_refused(make_engine, smollm_dir, tmp_path):
    from helpers import write_tiny_config
    draft = write_tiny_config(tmp_path / "draft", vocab_size=1000)
    with pytest.raises(Exception, match="--speculative-draft-model-path: the draft model's "
                                        "vocabulary has 1000 tokens"):
        make_engine(speculative_algorithm="STANDALONE", speculative_draft_model_path=draft,
                    load_format="dummy", context_length=1024)


def test_bench_spec_reports_a_draft_model_run(smollm_dir, tmp_path, monkeypatch):
    """`radixlm bench spec --draft-model-path`: the bundled model drafting for itself, a few
    tokens a prompt; the JSON says which algorithm ran and that the texts are the same."""
    import json

    from radixlm.bench import spec
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "spec.json"
    assert spec.main(["--device", "cpu", "--max-new-tokens", "6", "--repeats", "1",
                      "--draft-model-path", smollm_dir, "--num-steps", "2",
                      "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["algorithm"] == "STANDALONE"
    for name in ("copy", "chat"):
        r = res[name]
        assert r["identical_text"] and r["tokens"] > 0 and r["verify_steps"] > 0, r
        assert r["speedup"] == pytest.approx(r["spec_tok_s"] / r["off_tok_s"])


def test_decode_log_reports_the_accept_length(smollm_dir, tmp_path, caplog):
    """Every 40 decode steps the scheduler logs SGLang's "decode batch" line, with the accept
    length while speculation is on (the scheduler driven in-process on a tiny model)."""
    import logging

    from helpers import tiny_checkpoint
    from radixlm.config import ServerArgs
    from radixlm.managers.messages import TokenizedGenerateReq
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from radixlm.scheduler.config import SchedulerConfig
    from radixlm.scheduler.scheduler import Scheduler

    args = ServerArgs(model_path=tiny_checkpoint(tmp_path, "llama"), device="cpu",
                      max_total_tokens=2048, speculative_algorithm="NGRAM",
                      decode_log_interval=10)
    runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(args))
    sched = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda t: [],
                      lambda m: None)
    sched.handle_message(TokenizedGenerateReq(
        rid="r", input_ids=[5, 6, 7, 8] * 8,
        sampling_params=SamplingParams(max_new_tokens=200, temperature=0, ignore_eos=True)))
    with caplog.at_level(logging.INFO, logger="radixlm.scheduler.scheduler"):
        while sched.has_work:
            sched.step()
    lines = [r.getMessage() for r in caplog.records if "decode batch" in r.getMessage()]
    assert len(lines) == sched.decode_steps // 10 >= 1, lines     # (--decode-log-interval)
    assert "#running-req: 1" in lines[0] and "gen throughput (token/s)" in lines[0]
    assert sched.speculator.totals.verify_steps > 0      # the random model repeats itself
    assert "accept len:" in lines[-1], lines
