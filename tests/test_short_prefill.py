"""Short prefills ride in the decode step (scheduler/short_prefill.py): a request whose
remaining prompt is a few tokens joins the running batch and has them computed as rows of the
next decode step (in its CUDA graph on a GPU) instead of an eager extend step. The outputs must
be those of the extend path, token for token; the policy sends everything else the extend way."""

from __future__ import annotations

import pytest

from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.short_prefill import SHORT_PREFILL_KV_READS, decode_step_riders
from radixlm.scheduler.request import Req


def _req(prompt_len: int, prefix: int = 0, **params) -> Req:
    import torch
    req = Req("r", list(range(1, prompt_len + 1)), SamplingParams(**params), seed=0)
    req.prefix_indices = torch.arange(prefix)
    req.extend_input_len = prompt_len - prefix
    return req


def _riders(added, running, max_rows, limit):
    return [added.index(r) for r in decode_step_riders(added, running, max_rows, limit)]


def test_policy_takes_only_whole_short_plain_prompts():
    assert _riders([_req(10), _req(40, prefix=30)], [], None, 16) == [0, 1]
    assert _riders([_req(10)], [], None, 0) == []                    # off
    assert _riders([_req(20), _req(10)], [], None, 16) == [1]        # 20 new tokens > 16
    chunk = _req(40)
    chunk.extend_input_len = 8                                       # a chunk of the prompt
    last_chunk = _req(40, prefix=32)
    last_chunk.req_pool_idx = 3                                      # its earlier chunks' row
    logprobs = _req(10)
    logprobs.return_logprob = True
    assert _riders([chunk, last_chunk, _req(10, max_new_tokens=0), logprobs],
                   [], None, 16) == []
    constrained = _req(10)
    constrained.grammar = object()                                   # rides, as jumps do
    assert _riders([constrained], [], None, 16) == [0]
    # Rows: the running requests' next tokens plus the new ones must fit the largest graph.
    running = [_req(5) for _ in range(6)]
    for r in running:
        r.kv_allocated_len = r.seq_len - 1
    assert _riders([_req(10)], running, 16, 16) == [0]
    assert _riders([_req(11), _req(4), _req(7)], running, 16, 16) == [1]
    # Requests the extend step keeps join running before that decode step: a row each.
    assert _riders([_req(10)] + [_req(100) for _ in range(5)], running, 16, 16) == []
    # Each row reads the whole context: a long cached prefix under many new rows goes extend.
    long_ctx = SHORT_PREFILL_KV_READS // 8
    assert _riders([_req(long_ctx, prefix=long_ctx - 4)], [], None, 16) == [0]
    assert _riders([_req(long_ctx + 16, prefix=long_ctx)], [], None, 16) == []


PROMPTS = ["The capital of France is", "List the numbers: 1, 2, 3, 4, 5, 6, 7,",
           "Write a haiku about the sea.",
           # over the limit below: an extend step, in the same batch as short ones
           "Summarize: " + "the quick brown fox jumps over the lazy dog; " * 12]


def _outputs(make_engine, monkeypatch, limit: int, page_size: int, spec: str | None):
    monkeypatch.setenv("RADIXLM_SHORT_PREFILL_TOKENS", str(limit))
    engine = make_engine(max_total_tokens=4096, max_running_requests=8, page_size=page_size,
                         speculative_algorithm=spec)
    greedy = {"max_new_tokens": 16, "temperature": 0}
    params = [greedy, {**greedy, "stop": ["7"]},
              {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.9, "sampling_seed": 3},
              {**greedy, "frequency_penalty": 0.5}]
    first = engine.generate(PROMPTS, params)
    # Again: every prompt is cached now but its last token, one row each.
    again = engine.generate(PROMPTS, params)
    one = engine.generate(PROMPTS[0], greedy)          # alone, nothing else running
    streamed = [c["text"] for c in engine.generate(PROMPTS[1], greedy, stream=True)]
    stats = engine.get_stats()
    engine.shutdown()
    return first + again + [one], streamed, stats


@pytest.mark.parametrize("overlap,page_size,spec", [(False, 1, None), (True, 1, None),
                                                    (True, 4, None), (True, 1, "NGRAM")],
                         ids=["plain", "overlap", "overlap-pages", "overlap-ngram"])
def test_outputs_equal_the_extend_path(make_engine, monkeypatch, overlap, page_size, spec):
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    base, base_stream, base_stats = _outputs(make_engine, monkeypatch, 0, page_size, spec)
    rows, rows_stream, rows_stats = _outputs(make_engine, monkeypatch, 24, page_size, spec)
    for a, b in zip(base, rows):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        assert b["meta_info"]["cached_tokens"] == a["meta_info"]["cached_tokens"]
    # The same text, streamed as it grew. Not chunk for chunk: a stream hands over what has
    # arrived when its reader wakes, so two steps processed back to back (the last two under
    # overlap) may come as one chunk in one run and as two in another; and how many tokens a
    # verify step streams at once depends on timed decisions.
    assert rows_stream[-1] == base_stream[-1]
    for stream in (rows_stream, base_stream):
        assert len(stream) > 1 and all(b.startswith(a) for a, b in zip(stream, stream[1:]))
    assert base_stats.short_prefills == 0
    # The first pass's two prompts of under 24 tokens (the others have 25 and 125); the
    # second pass's four, cached but for one token; the lone and the streamed request.
    assert rows_stats.short_prefills == 8, rows_stats
    assert rows_stats.cache_hit_rate == pytest.approx(base_stats.cache_hit_rate)


GRAMMAR_PROMPTS = ["Pick a colour:", "A phone number:", "Describe a person as JSON:"]
SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, '
          '"age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"]}')


def _grammar_outputs(make_engine, monkeypatch, limit: int):
    monkeypatch.setenv("RADIXLM_SHORT_PREFILL_TOKENS", str(limit))
    engine = make_engine(max_total_tokens=4096, max_running_requests=8)
    params = [{"max_new_tokens": 8, "temperature": 0, "regex": "(red|green|blue)!"},
              # prose prompts under digits: the unmasked draws get rejected
              {"max_new_tokens": 12, "temperature": 0.9, "sampling_seed": 5,
               "regex": r"\d{3}-\d{4}"},
              {"max_new_tokens": 24, "temperature": 0, "json_schema": SCHEMA}]
    outs = engine.generate(GRAMMAR_PROMPTS, params)
    again = engine.generate(GRAMMAR_PROMPTS, params)          # cached but for a token
    stats = engine.get_stats()
    engine.shutdown()
    return outs + again, stats


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_constrained_prompts_ride_with_the_extend_paths_outputs(make_engine, monkeypatch,
                                                                overlap):
    """A constrained request's short prompt rides in the decode step; its first token is drawn
    under the mask, and every output is the extend path's (jump-forward on)."""
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    base, base_stats = _grammar_outputs(make_engine, monkeypatch, 0)
    rows, rows_stats = _grammar_outputs(make_engine, monkeypatch, 24)
    for a, b in zip(base, rows):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    assert base_stats.short_prefills == 0 and rows_stats.short_prefills == 6, rows_stats
    assert rows[0]["text"] in ("red!", "green!", "blue!")
