"""The overlap scheduler (step N+1 launched before step N's results are read) gives the same
outputs as the plain loop. On the CPU it only runs when RADIXLM_OVERLAP_ON_CPU=1 (on a GPU it is
the default); the logic under test (input ids read on the device, stop conditions applied one
step late, the extra token dropped, KV accounting) is the same on both."""

from __future__ import annotations

import pytest

from helpers import assert_pool_empty, hf_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woman who kept bees. Every morning she",
    "A list of three colours: red,",
]


@pytest.fixture
def overlap_engine(make_engine, monkeypatch):
    def make(**kwargs):
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
        return make_engine(**kwargs)
    return make


@pytest.mark.parametrize("engine_args", [
    {},
    {"page_size": 16, "chunked_prefill_size": 16},
], ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_overlap_greedy_matches_hf(overlap_engine, hf_model, tokenizer, engine_args):
    engine = overlap_engine(max_total_tokens=4096, **engine_args)
    # Different lengths, so requests finish (one step late under overlap) while others decode.
    lengths = [5, 24, 9, 17]
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in lengths]
    outs = engine.generate(PROMPTS, params)
    for prompt, n, out in zip(PROMPTS, lengths, outs):
        assert out["output_ids"] == hf_greedy(hf_model, tokenizer(prompt).input_ids, n)
        assert out["meta_info"]["completion_tokens"] == n
    assert engine.get_stats().overlapped_steps > 10
    assert_pool_empty(engine)


def test_overlap_matches_plain_loop_on_stops_and_sampling(overlap_engine, make_engine):
    params = [
        {"max_new_tokens": 40, "temperature": 0},                             # may stop at EOS
        {"max_new_tokens": 40, "temperature": 0, "stop": ["\n"]},             # stop string
        {"max_new_tokens": 30, "temperature": 0.8, "top_p": 0.9, "sampling_seed": 7},
        {"max_new_tokens": 30, "temperature": 0.7, "frequency_penalty": 0.5,  # forces a sync
         "sampling_seed": 3, "min_new_tokens": 4},
        # min_new_tokens alone: the EOS ban must count the token still on the device.
        {"max_new_tokens": 30, "temperature": 0, "min_new_tokens": 3},
        {"max_new_tokens": 0},                     # prefill only, in a pending step
    ]
    prompts = PROMPTS + ["Hello!", "What is 2 + 2?"]
    plain = make_engine(max_total_tokens=4096, disable_overlap_schedule=True)
    want = plain.generate(prompts, params)
    overlapped = overlap_engine(max_total_tokens=4096)
    got = overlapped.generate(prompts, params)
    for w, g in zip(want, got):
        assert g["output_ids"] == w["output_ids"]
        assert g["text"] == w["text"]
        assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]
    # Streaming under overlap delivers the same tokens.
    chunks = list(overlapped.generate(PROMPTS[0], params[0], stream=True))
    assert chunks[-1]["output_ids"] == want[0]["output_ids"]
    assert_pool_empty(overlapped)


def test_overlap_survives_memory_pressure(overlap_engine, make_engine):
    """A pool too small for every request at once: retraction has to happen (after the pending
    step is processed) and outputs still equal the plain loop's."""
    params = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    prompts = [f"({i}) " + p for i in range(3) for p in PROMPTS]  # distinct from the start
    # (12 requests of ~10-35 prompt tokens + 32 new: ~570 tokens against 448 slots)
    plain = make_engine(max_total_tokens=448, disable_overlap_schedule=True)
    want = [o["output_ids"] for o in plain.generate(prompts, params)]
    overlapped = overlap_engine(max_total_tokens=448)
    got = [o["output_ids"] for o in overlapped.generate(prompts, params)]
    assert got == want
    stats = overlapped.get_stats()
    assert stats.num_retractions > 0 and stats.overlapped_steps > 0
    assert_pool_empty(overlapped)


SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, '
          '"age": {"type": "integer"}, "city": {"type": "string", "maxLength": 12}}, '
          '"required": ["name", "age", "city"]}')


@pytest.mark.parametrize("jump_forward", [True, False], ids=["jump-forward", "no-jump"])
def test_overlap_structured_matches_plain_loop(overlap_engine, make_engine, jump_forward):
    """Constrained requests under overlap: step N+1's forward runs before step N's tokens are
    read, its grammar masks are filled after (deferred sampling), and requests that jump forward
    or finish meanwhile drop N+1's row. Outputs equal the plain loop's, token for token."""
    import json
    params = [
        {"max_new_tokens": 60, "temperature": 0, "json_schema": SCHEMA},
        {"max_new_tokens": 60, "temperature": 0.9, "sampling_seed": 5, "json_schema": SCHEMA},
        {"max_new_tokens": 24, "temperature": 0, "regex": r"(red|green|blue), [a-z ]{3,20}\."},
        {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True},       # unconstrained
        {"max_new_tokens": 30, "temperature": 0.7, "frequency_penalty": 0.4, "sampling_seed": 2},
    ]
    prompts = ["Describe a person as JSON:", "Give me a JSON record of someone:",
               "A colour and a short phrase:", PROMPTS[2], PROMPTS[1]]
    kwargs = dict(max_total_tokens=4096, disable_jump_forward=not jump_forward)
    plain = make_engine(disable_overlap_schedule=True, **kwargs)
    # A chat prompt: the model opens with '{' and the forced '"name": "' that follows merges
    # with it ('{"'), so the jump replaces the first output token, whose KV the overlapped next
    # step is already writing when the prefill's results are processed.
    params.append({"max_new_tokens": 60, "temperature": 0, "json_schema": SCHEMA})
    prompts.append(plain.apply_chat_template([{"role": "user", "content":
                                               "Describe Luna Lovegood as JSON."}]))
    want = plain.generate(prompts, params)
    overlapped = overlap_engine(**kwargs)
    got = overlapped.generate(prompts, params)
    for w, g in zip(want, got):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]
    for out in got[:2]:
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            assert set(json.loads(out["text"])) == {"name", "age", "city"}
    # Decode steps of constrained requests overlapped with the previous step's processing.
    assert overlapped.get_stats().overlapped_steps > 10
    assert_pool_empty(overlapped)


@pytest.mark.parametrize("min_tokens", [16, 100000], ids=["overlapped", "small-prefills-first"])
def test_overlap_runs_consecutive_prefill_chunks_back_to_back(overlap_engine, make_engine,
                                                              monkeypatch, min_tokens):
    """A long prompt's prefill chunks are launched one after another without reading each
    chunk's results first (the chunk's KV enters the prefix cache at launch), when they are
    as big as RADIXLM_OVERLAP_PREFILL_MIN_TOKENS; smaller ones are processed first. Prompt
    logprobs, which each chunk's processing records, and the output equal the plain loop's."""
    monkeypatch.setenv("RADIXLM_OVERLAP_PREFILL_MIN_TOKENS", str(min_tokens))
    prompt = " ".join(PROMPTS * 3)
    params = {"max_new_tokens": 1, "temperature": 0}
    kwargs = dict(max_total_tokens=4096, chunked_prefill_size=16)
    plain = make_engine(disable_overlap_schedule=True, **kwargs)
    want = plain.generate(prompt, params, return_logprob=True, logprob_start_len=0)
    overlapped = overlap_engine(**kwargs)
    got = overlapped.generate(prompt, params, return_logprob=True, logprob_start_len=0)
    n_prompt = got["meta_info"]["prompt_tokens"]
    assert n_prompt > 64
    assert got["output_ids"] == want["output_ids"]
    lp_got = got["meta_info"]["input_token_logprobs"]
    lp_want = want["meta_info"]["input_token_logprobs"]
    assert len(lp_got) == n_prompt and [t for _, t, *_ in lp_got] == [t for _, t, *_ in lp_want]
    assert lp_got[0][0] is None
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(lp_got[1:], lp_want[1:]))
    # Every chunk after the first was launched while the one before it was still pending (or,
    # below the threshold, none was: only the decode step after the last chunk overlaps).
    steps = overlapped.get_stats().overlapped_steps
    assert steps >= n_prompt // 16 - 1 if min_tokens <= 16 else steps <= 1
    # The prompt went into the prefix cache chunk by chunk: a second request reuses it.
    again = overlapped.generate(prompt, params)
    assert again["meta_info"]["cached_tokens"] >= n_prompt - 16
    assert again["output_ids"] == want["output_ids"]
    assert_pool_empty(overlapped)


def test_min_new_tokens_alone_does_not_defer_sampling():
    """The min_new_tokens ban needs only how many tokens precede the sampled one (output_ids
    plus the rows in flight), known at launch: no deferred sampling for it; penalties read the
    tokens themselves."""
    from radixlm.sampling.params import SamplingParams
    from radixlm.scheduler.request import Req

    def req(**kw):
        return Req(rid="r", origin_input_ids=[1, 2], sampling_params=SamplingParams(**kw),
                   seed=0)

    only_min = req(temperature=0, min_new_tokens=5)
    assert only_min.logit_adjustments_read_output and not only_min.sampling_reads_output
    assert req(temperature=0, frequency_penalty=0.5).sampling_reads_output
    assert req(temperature=0, repetition_penalty=1.1).sampling_reads_output


def test_greedy_step_sampling_counts_tokens_in_flight_for_the_ban():
    import torch

    from radixlm.sampling.params import SamplingParams
    from radixlm.sampling.sampler import Sampler
    from radixlm.scheduler.request import Req
    from radixlm.scheduler.step_sampling import StepSampling

    sampling = StepSampling(vocab_size=10, eos_token_ids=(2,), device=torch.device("cpu"))
    banning = Req(rid="a", origin_input_ids=[1], seed=0, sampling_params=SamplingParams(
        temperature=0, min_new_tokens=3, stop_token_ids=[5]))
    free = Req(rid="b", origin_input_ids=[1], seed=0,
               sampling_params=SamplingParams(temperature=0))
    reqs = [free, banning]
    banning.output_ids, banning.num_pending = [7], 1      # token 3 of 3 is sampled next
    info = sampling.build(reqs, [False, False], None)
    assert sorted(info.adjustments.banned_index.tolist()) == [10 + 2, 10 + 5]
    logits = torch.zeros(2, 10)
    logits[:, 5] = 3.0
    logits[:, 2] = 2.0
    assert Sampler()(logits, info).next_token_ids.tolist() == [5, 0]
    banning.num_pending = 2                               # two before it: the ban is over
    info = sampling.build(reqs, [False, False], None)
    assert info.adjustments.is_noop
    assert Sampler()(logits, info).next_token_ids.tolist() == [5, 5]


@pytest.mark.parametrize("context_length", [None, 24])
def test_no_decode_row_for_a_request_its_tokens_in_flight_end(monkeypatch, context_length):
    """Under overlap, a request whose launched-but-unprocessed token is its max_new_tokens-th
    (or fills the context) finishes by length when that step is processed: the next decode
    step computes no row for it (before, every request ended with one computed and dropped;
    at batch 1, a whole step)."""
    from helpers import cpu_scheduler
    from radixlm.config import ServerArgs
    from radixlm.managers.messages import TokenizedGenerateReq
    from radixlm.sampling.params import SamplingParams

    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    sent: list = []
    sched = cpu_scheduler(ServerArgs(device="cpu", max_total_tokens=2048,
                                     context_length=context_length), sent.append)
    assert sched.overlap
    rows: list[int] = []
    launch_forward = sched.launch_forward

    def counting(batch):
        if batch.forward_mode.is_decode:
            rows.append(batch.batch_size)
        return launch_forward(batch)

    monkeypatch.setattr(sched, "launch_forward", counting)
    lengths = {"a": 1, "b": 4, "c": 7}
    prompts = {rid: sched.tokenizer.encode(f"({rid}) The capital of France is")
               for rid in lengths}
    for rid, n in lengths.items():
        if context_length is not None:   # max_new_tokens past the context: it ends there
            prompts[rid] = (prompts[rid] * 4)[:context_length - n]
        sched.handle_message(TokenizedGenerateReq(
            rid=rid, input_ids=prompts[rid], sampling_params=SamplingParams(
                max_new_tokens=n if context_length is None else 100, temperature=0,
                ignore_eos=True)))
    while sched.has_work:
        sched.step()
    outs = {o.rid: o for batch in sent for o in getattr(batch, "outputs", [])
            if o.finish_reason is not None}
    assert {rid: o.finish_reason.type for rid, o in outs.items()} == dict.fromkeys(lengths,
                                                                                   "length")
    assert {rid: o.completion_tokens for rid, o in outs.items()} == lengths
    assert sched.overlapped_steps > 0
    # The prefill samples each request's first token; decode rows sample the rest, no more.
    assert sum(rows) == sum(n - 1 for n in lengths.values()), rows
    assert sched.prefix_cache.protected_size() == 0
    assert sched.kv.available_size() == sched.kv.allocator.total_size
