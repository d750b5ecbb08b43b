"""Optimistic grammar sampling (scheduler/grammar_sampling.py): constrained decode rows sample
without the mask and a rejected token is sampled again under it. The outputs must be masked
sampling's, token for token and logprob for logprob, under the plain loop and the overlap
scheduler, with rejections actually happening."""

from __future__ import annotations

import json
import re

import pytest

from helpers import assert_pool_empty
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.grammar_sampling import (MAX_MASKED_STEPS, may_sample_unmasked,
                                                on_masked_decode_sample, on_rejection,
                                                redraw_from_alternatives)
from radixlm.scheduler.request import Req

SCHEMA = json.dumps({"type": "object",
                     "properties": {"name": {"type": "string", "maxLength": 10},
                                    "colour": {"enum": ["red", "green", "blue"]},
                                    "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                     "required": ["name", "colour", "age"]})

# Prompts whose natural continuation the constraint forbids (prose under a digits regex), so
# unmasked tokens get rejected; greedy and seeded draws; one top-p row (always masked); logprobs.
CASES = [
    ("The capital of France is", {"temperature": 0, "regex": r"\d{3}-\d{4} [a-z]{2,6}"}),
    ("Once upon a time", {"temperature": 1.0, "sampling_seed": 4, "regex": r"[0-9 ]{6,20}"}),
    ("Describe a person as JSON:", {"temperature": 0, "json_schema": SCHEMA}),
    ("Give me a JSON record:", {"temperature": 0.8, "sampling_seed": 11, "json_schema": SCHEMA}),
    ("A colour:", {"temperature": 0.9, "top_p": 0.8, "sampling_seed": 2,
                   "regex": r"(red|green|blue)!"}),
    ("Numbers:", {"temperature": 0, "regex": r"[a-z]+ \d+", "frequency_penalty": 0.5}),
]


def _generate(engine):
    prompts = [p for p, _ in CASES]
    params = [{"max_new_tokens": 28, **c} for _, c in CASES]
    return engine.generate(prompts, params, return_logprob=True)


@pytest.fixture(scope="module")
def masked_outputs():
    """The reference: every row masked by xgrammar on the host, in the plain loop."""
    from radixlm.entrypoints.engine import Engine
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")
        engine = Engine(device="cpu", log_level="warning", max_total_tokens=4096,
                        disable_overlap_schedule=True, disable_optimistic_grammar=True)
    try:
        outs = _generate(engine)
        assert engine.get_stats().grammar_rejections == 0
        assert engine.get_stats().grammar_device_rows == 0
        return outs
    finally:
        engine.shutdown()


def _assert_masked_sampling_outputs(got, masked_outputs):
    for (prompt, case), want, out in zip(CASES, masked_outputs, got):
        assert out["output_ids"] == want["output_ids"], (prompt, case)
        assert out["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
        assert ([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
                == pytest.approx([lp for lp, _, _ in want["meta_info"]["output_token_logprobs"]],
                                 abs=1e-4))
    assert re.fullmatch(r"\d{3}-\d{4} [a-z]{2,6}", got[0]["text"]), got[0]["text"]


@pytest.mark.parametrize("overlap", [False, True], ids=["plain-loop", "overlap"])
def test_device_automata_give_masked_sampling_tokens(make_engine, monkeypatch, masked_outputs,
                                                     overlap):
    """The regexes run as token automata with their states on the device
    (scheduler/grammar_states.py): masked exactly there (top-p and penalty rows included), so
    never rejected; the tokens and logprobs are xgrammar's masked sampling's."""
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    engine = make_engine(max_total_tokens=4096, disable_overlap_schedule=not overlap)
    _assert_masked_sampling_outputs(_generate(engine), masked_outputs)
    stats = engine.get_stats()
    # Every decode row of the four regex requests, and their first tokens.
    regex_tokens = sum(len(o["output_ids"]) for (_, c), o in zip(CASES, masked_outputs)
                       if "regex" in c)
    assert stats.grammar_device_rows >= regex_tokens - 4 * 8, stats.grammar_device_rows
    assert_pool_empty(engine)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain-loop", "overlap"])
def test_optimistic_sampling_gives_masked_sampling_tokens(make_engine, monkeypatch,
                                                           masked_outputs, overlap):
    """xgrammar's host matchers (automata off): unmasked draws, rejections redrawn."""
    monkeypatch.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    engine = make_engine(max_total_tokens=4096, disable_overlap_schedule=not overlap)
    _assert_masked_sampling_outputs(_generate(engine), masked_outputs)
    stats = engine.get_stats()
    assert stats.grammar_rejections > 0          # the redo path ran
    if overlap:
        assert stats.overlapped_steps > 10
    assert_pool_empty(engine)                    # redone rows gave their KV back


def test_only_unfiltered_draws_sample_unmasked():
    assert may_sample_unmasked(SamplingParams(temperature=0))
    assert may_sample_unmasked(SamplingParams(temperature=0, top_p=0.5))      # greedy
    assert may_sample_unmasked(SamplingParams(temperature=1.3, frequency_penalty=1.0))
    assert not may_sample_unmasked(SamplingParams(temperature=1.0, top_p=0.95))
    assert not may_sample_unmasked(SamplingParams(temperature=1.0, top_k=40))
    assert not may_sample_unmasked(SamplingParams(temperature=1.0, min_p=0.05))


def test_rejections_lengthen_the_masked_period():
    req = Req(rid="r", origin_input_ids=[1, 2], sampling_params=SamplingParams(), seed=0,
              grammar_optimistic=True)
    assert req.samples_unmasked
    periods = []
    for _ in range(8):
        on_rejection(req)
        periods.append(req.grammar_masked_steps)
    assert periods == [2, 4, 8, 16, 32, 64, 64, 64] and MAX_MASKED_STEPS == 64
    assert not req.samples_unmasked
    for _ in range(64):
        on_masked_decode_sample(req)
    assert req.samples_unmasked and req.grammar_masked_steps == 0


def test_device_grammars_sample_without_the_previous_token():
    """A masked (top-p) constrained row needs its grammar moved by the previous token before it
    samples (the scheduler defers its sampling), unless the grammar's state is on the device."""
    req = Req(rid="r", origin_input_ids=[1, 2], seed=0, grammar=_AllowOnly([]),
              sampling_params=SamplingParams(temperature=0.9, top_p=0.8))
    assert req.sampling_reads_output
    req.grammar_on_device = True
    assert not req.sampling_reads_output
    req.sampling_params = SamplingParams(temperature=0.9, frequency_penalty=0.5)
    assert req.sampling_reads_output           # (penalties read the output all the same)


class _AllowOnly:
    """A grammar that accepts the given tokens (and records what it accepted)."""
    def __init__(self, allowed):
        self.allowed, self.accepted = set(allowed), []

    def accept_token(self, token):
        if token in self.allowed:
            self.accepted.append(token)
            return True
        return False


NEG_INF = float("-inf")


@pytest.mark.parametrize("allowed, ids, scores, want", [
    # The first allowed candidate after the rejected one, with a strictly lower next score.
    ({7}, [5, 7, 9, 11], [3.0, 2.0, 1.0, 0.5], 7),
    ({9}, [5, 7, 9, 11], [3.0, 2.0, 1.0, 0.5], 9),
    # The rejected token need not come first (a tie at the top).
    ({5}, [7, 9, 5, 11], [3.0, 3.0, 1.0, 0.5], None),   # 7 and 9 tie: the device decides
    ({5}, [9, 7, 5, 11], [3.0, 2.5, 1.0, 0.5], 5),      # 9 rejected, 7 refused, 5 settles it
    # A tie with the next candidate: an equal token with a lower id could be the answer.
    ({7, 9}, [5, 7, 9, 11], [3.0, 2.0, 2.0, 0.5], None),
    # The last candidate cannot be settled (a token outside the list may tie with it).
    ({11}, [5, 7, 9, 11], [3.0, 2.0, 1.0, 0.5], None),
    # Banned tokens (-inf) are never taken.
    ({7}, [5, 7, 9, 11], [3.0, NEG_INF, NEG_INF, NEG_INF], None),
    ({12}, [5, 7, 9, 11], [3.0, 2.0, 1.0, 0.5], None),   # none allowed
])
def test_redraw_from_alternatives(allowed, ids, scores, want):
    grammar = _AllowOnly(allowed)
    logprobs = [-0.1 * (k + 1) for k in range(len(ids))]
    rejected = 9 if ids[0] == 9 else 5
    got = redraw_from_alternatives(grammar, rejected, ids, scores, logprobs)
    if want is None:
        assert got is None and grammar.accepted == []    # the grammar is left as it was
    else:
        assert got == (want, logprobs[ids.index(want)]) and grammar.accepted == [want]


def _run_in_process(resample: bool, optimistic: bool = True) -> tuple[list[list[int]], int, int]:
    """The first three CASES through a Scheduler in this process (plain loop, CPU): outputs,
    request-steps (steps summed over the requests they served: a rejection recomputed costs
    its request one, whether or not that request was the last to finish) and rejections;
    `resample` False drops the saved-logits path (the recompute one)."""
    from helpers import cpu_scheduler, submit_and_wait_for_grammars
    from radixlm.config import ServerArgs
    from radixlm.model_executor.weight_source import load_tokenizer

    args = ServerArgs(device="cpu", max_total_tokens=2048, disable_overlap_schedule=True,
                      disable_optimistic_grammar=not optimistic)
    sched = cpu_scheduler(args, lambda m: None, load_tokenizer=load_tokenizer)
    if not resample:
        sched.results.resampler = None
    reqs = submit_and_wait_for_grammars(
        sched, [(prompt, SamplingParams.from_dict({"max_new_tokens": 20, **case}))
                for prompt, case in CASES[:3]])
    steps = 0
    while sched.has_work:
        steps += sum(not r.finished for r in reqs)
        sched.step()
    return [r.output_ids for r in reqs], steps, sched.grammar_rejections


def test_a_rejection_costs_no_step_in_the_plain_loop_with_saved_logits(monkeypatch):
    monkeypatch.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")   # (xgrammar's host path)
    masked, masked_steps, _ = _run_in_process(resample=True, optimistic=False)
    saved, saved_steps, saved_rejections = _run_in_process(resample=True)
    recomputed, recomputed_steps, recomputed_rejections = _run_in_process(resample=False)
    # Logits kept for one row a step only: the other rows' rejections recompute.
    import radixlm.scheduler.grammar_sampling as gs
    monkeypatch.setattr(gs, "MAX_SAVED_LOGITS_BYTES", 1)
    capped, capped_steps, _ = _run_in_process(resample=True)
    assert saved == masked and recomputed == masked and capped == masked
    assert saved_steps <= capped_steps <= recomputed_steps
    assert saved_rejections > 0 and recomputed_rejections > 0
    # In the plain loop a row drawn again from the saved logits costs no step (no later step
    # was launched with the rejected token); recomputing the last token's row costs one.
    assert saved_steps == masked_steps < recomputed_steps


def test_greedy_rejections_are_redrawn_on_the_host(monkeypatch):
    """Greedy rows redraw from the step's best tokens: masked sampling's outputs, and the
    device redraw (MaskedResampler) runs only for rows those do not settle. Without the best
    tokens (REDRAW_CANDIDATES 0) every rejection goes to the device."""
    import radixlm.scheduler.grammar_sampling as gs
    monkeypatch.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")   # (xgrammar's host path)
    device_rows = []
    real = gs.MaskedResampler.resample

    def counting(self, step, rows, reqs):
        device_rows.extend((r.rid, r.sampling_params.is_greedy) for r in reqs)
        return real(self, step, rows, reqs)

    monkeypatch.setattr(gs.MaskedResampler, "resample", counting)
    masked, _, _ = _run_in_process(resample=True, optimistic=False)
    host, _, host_rejections = _run_in_process(resample=True)
    greedy_on_device_with_host = sum(greedy for _, greedy in device_rows)
    device_rows.clear()
    monkeypatch.setattr(gs, "REDRAW_CANDIDATES", 0)
    device, _, device_rejections = _run_in_process(resample=True)
    greedy_rejections = sum(greedy for _, greedy in device_rows)   # all went to the device
    assert host == masked and device == masked
    assert host_rejections == device_rejections > 0
    assert greedy_rejections > 0
    assert greedy_on_device_with_host < greedy_rejections   # some settled on the host


def test_device_automata_under_retraction_and_overlap(make_engine, monkeypatch, tokenizer):
    """A pool too small for every request at once: requests are retracted and prefilled again
    (Req.kv_epoch moves, so their device states are written again from the host's) while the
    overlap scheduler has steps in flight, and jump-forward replaces tokens. The outputs are a
    roomy engine's, and every one is a prefix of a match (cut by max_new_tokens)."""
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    regex = r"[a-z]+ (is|was) [0-9]{2}\. [a-z ]{60,200}"   # (longer than max_new_tokens)
    prompts = [f"({i}) Tell me about the {w}." for i, w in
               enumerate(["fox", "king", "robot", "sailor", "child", "painter"])]
    params = {"max_new_tokens": 20, "temperature": 0, "regex": regex}
    roomy = make_engine(max_total_tokens=4096)
    want = [o["output_ids"] for o in roomy.generate(prompts, params)]
    tight = make_engine(max_total_tokens=150, schedule_conservativeness=0.05)
    outs = tight.generate(prompts, params)
    assert [o["output_ids"] for o in outs] == want
    stats = tight.get_stats()
    assert stats.num_retractions > 0, "the pool was sized to force retraction"
    assert stats.grammar_device_rows > 0 and stats.grammar_rejections == 0
    assert_pool_empty(tight)
    # Each output is a prefix of a match: xgrammar's own matcher accepts every token.
    import xgrammar as xgr
    from radixlm.model_executor.light_tokenizer import full_tokenizer
    info = xgr.TokenizerInfo.from_huggingface(full_tokenizer(tokenizer),
                                              stop_token_ids=[tokenizer.eos_token_id])
    compiled = xgr.GrammarCompiler(info).compile_regex(regex)
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "length"
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(t) for t in o["output_ids"]), o["text"]
