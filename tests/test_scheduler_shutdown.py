"""Server shutdown (`Scheduler.abort_all`): every request, waiting, running or part-way through
a chunked prefill, ends with finish_reason abort (503), and the KV it held goes back to the
cache: nothing stays locked or owned."""

from __future__ import annotations

from helpers import cpu_scheduler
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.sampling.params import SamplingParams


def test_abort_all_ends_every_request_and_frees_its_kv():
    from radixlm.config import ServerArgs

    args = ServerArgs(device="cpu", max_total_tokens=2048, disable_overlap_schedule=True,
                      chunked_prefill_size=32, max_running_requests=2)
    sent: list = []
    sched = cpu_scheduler(args, sent.append)
    kv = sched.kv
    short = sched.tokenizer.encode("The capital of France is")
    params = SamplingParams.from_dict({"max_new_tokens": 64, "ignore_eos": True})
    for rid, ids in [("a", short), ("b", list(range(100, 180))), ("c", short + [7]),
                     ("d", short + [8])]:
        sched.handle_message(TokenizedGenerateReq(rid=rid, input_ids=ids,
                                                  sampling_params=params))
    for _ in range(2):
        sched.step()
    # One running, one part-way through its prefill (80 tokens in chunks of 32), two waiting.
    assert [r.rid for r in sched.running] == ["a"] and sched.chunked_req.rid == "b"
    assert len(sched.waiting) == 2
    sched.abort_all()
    done = {o.rid: o.finish_reason for batch in sent for o in getattr(batch, "outputs", [])
            if o.finish_reason is not None}
    assert sorted(done) == ["a", "b", "c", "d"]
    assert all(fr.type == "abort" and fr.status_code == 503 for fr in done.values())
    assert not (sched.waiting or sched.running or sched.chunked_req)
    cache = sched.prefix_cache
    assert cache.protected_size() == 0
    assert kv.available_size() == kv.allocator.total_size


def test_a_crashed_scheduler_is_named_not_the_detokenizer_it_stopped():
    """A scheduler going down stops the detokenizer first (code 0), then exits itself: the
    engine's reason names the scheduler and its code."""
    import subprocess
    import sys

    from radixlm.entrypoints.engine_children import EngineChildren

    children = object.__new__(EngineChildren)
    scheduler = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); "
                                  "sys.exit(3)"])
    detokenizer = subprocess.Popen([sys.executable, "-c", "pass"])
    detokenizer.wait()
    children.processes = [("scheduler (TP rank 0)", scheduler), ("detokenizer", detokenizer)]
    reason = children.dead_child()
    assert reason == "the scheduler (TP rank 0) process exited with code 3", reason
    scheduler.wait()
