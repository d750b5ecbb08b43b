"""A grammar backend that cannot start (xgrammar, or transformers' tokenizer it reads the
vocabulary through, failing to load on the first constrained request) ends constrained requests
with a message and leaves the scheduler serving the others; it is tried once, not per request."""

from __future__ import annotations

import time

import radixlm.scheduler.grammars as grammars_module
from helpers import cpu_scheduler
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.sampling.params import SamplingParams


def _finished(sent: list) -> dict:
    return {o.rid: o for batch in sent for o in getattr(batch, "outputs", [])
            if o.finish_reason is not None}


def test_a_backend_that_cannot_start_ends_constrained_requests_only(monkeypatch):
    from radixlm.config import ServerArgs

    attempts = []

    def broken(*args):
        attempts.append(args)
        raise RuntimeError("xgrammar is broken")

    monkeypatch.setattr(grammars_module, "create_grammar_backend", broken)
    args = ServerArgs(device="cpu", max_total_tokens=2048, disable_overlap_schedule=True)
    sent: list = []
    sched = cpu_scheduler(args, sent.append)
    ids = sched.tokenizer.encode("My phone number is")
    for rid, extra in [("c1", {"regex": r"[0-9]{3}"}), ("free", {}),
                       ("c2", {"json_schema": '{"type": "object"}'})]:
        sched.handle_message(TokenizedGenerateReq(rid=rid, input_ids=ids,
                                                  sampling_params=SamplingParams.from_dict(
                                                      {"max_new_tokens": 4, **extra})))
    deadline = time.monotonic() + 60
    while len(_finished(sent)) < 3 and time.monotonic() < deadline:
        sched.step()
    done = _finished(sent)
    for rid in ("c1", "c2"):
        fr = done[rid].finish_reason
        assert fr.type == "abort" and fr.status_code == 503
        assert fr.message == "constrained decoding is unavailable: xgrammar is broken"
    assert done["free"].finish_reason.type == "length"
    assert done["free"].completion_tokens == 4
    assert len(attempts) == 1
