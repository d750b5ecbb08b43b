"""Short prefills ride in the decode step: an admitted request whose remaining prompt is a few
tokens (the next turn of a conversation, a cached prompt sent again, a fork) joins the running
batch, and the next decode step computes those tokens as rows fed from the host, the way a
jump-forward's forced tokens are (Req.input_on_host, ScheduleBatch.prepare_decode), in the
decode step's CUDA graph; its first token is sampled from its last row. The prefill batch keeps
everything else.
"""

from __future__ import annotations

from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.mem_cache.prefix_cache import PrefixCache
from radixlm.scheduler.request import Req
from radixlm.scheduler.schedule_batch import claim_pool_row

# Short prefills ride in the decode step (`decode_step_riders`). An extend step of its own runs
# eagerly, a kernel launch per operation: on an H200 a batch-1 prefill of SmolLM2-135M keeps the
# GPU busy 1 ms of its 17-29 ms, the rest is the host launching ~320 kernels; fed as rows of the
# decode step, the same tokens run in its CUDA graph. Each such row reads the request's whole KV
# as a decode row does (an extend reads it once per block of rows), hence the bound on
# rows x context as well as on rows.
SHORT_PREFILL_TOKENS = 64
SHORT_PREFILL_KV_READS = 1 << 15


def decode_step_riders(added: list[Req], running: list[Req], max_rows: int | None,
                       limit: int) -> list[Req]:
    """Which of a prefill batch's newly admitted requests should join the running batch and
    have their prompts computed as rows of the next decode step (Req.input_on_host, as after a
    jump-forward) rather than by the extend step: each computes its whole remaining prompt in
    at most `limit` tokens, and the step's rows fit the largest CUDA graph (`max_rows`).
    Requests asking for logprobs or generating nothing go the extend way (its paths for them
    are the tested ones), as does a chunked prompt's last chunk. A constrained request rides
    as a jump-forward's forced tokens do (its first token under the mask: `ShortPrefills.take`)."""
    if limit <= 0:
        return []
    # The next decode step's rows: the running requests', one for each request the extend step
    # keeps (it joins running before that step), and the riders' prompts.
    rows = sum(r.num_decode_tokens for r in running) + len(added)
    riders = []
    for req in added:
        n = req.extend_input_len
        if (n > limit or n != req.seq_len - req.prefix_len or req.req_pool_idx is not None
                or req.max_new_tokens == 0 or req.return_logprob
                or n * req.seq_len > SHORT_PREFILL_KV_READS
                or (max_rows is not None and rows + n - 1 > max_rows)):
            continue
        riders.append(req)
        rows += n - 1
    return riders


class ShortPrefills:
    """The riders' side of the scheduler: which requests of a prefill batch ride, giving them
    their req_to_token rows, and putting their prompt KV into the prefix cache once the step
    computing it is launched, as an extend step's goes in at launch (a request admitted after
    that launch shares it; one deferred in the same admission may be retried before it and
    compute the prefix itself)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.count = 0                      # prompts computed by decode steps, since start
        self._uncached: list[Req] = []      # rode; prompt KV not in the prefix cache yet

    def take(self, added: list[Req], running: list[Req], max_rows: int | None,
             kv: KVCacheManager) -> list[Req]:
        """Remove the riders from `added`, append them to `running` and return them."""
        riders = decode_step_riders(added, running, max_rows, self.limit)
        for req in riders:
            added.remove(req)
            claim_pool_row(req, kv)
            req.input_on_host = True
            if req.grammar is not None:
                # Its first token is drawn under the mask, as the extend step would: a rejected
                # unmasked draw there would be redone over KV the prefix cache already shares.
                req.grammar_masked_steps = max(req.grammar_masked_steps, 1)
            running.append(req)
            if req not in self._uncached:      # (retracted before its step, then back)
                self._uncached.append(req)
        return riders

    def cache_launched(self, prefix_cache: PrefixCache) -> list[Req]:
        """After a decode step's launch: riders whose every prompt row was in it; returns
        them (their prompts are done, for the statistics)."""
        rows_left, done = [], []
        for req in self._uncached:
            if req.finished or req.req_pool_idx is None:
                continue                        # aborted, or retracted before its step
            if req.input_on_host:
                rows_left.append(req)           # rows beyond the largest graph: next step
            else:
                prefix_cache.cache_unfinished_req(req)
                done.append(req)
        self._uncached = rows_left
        self.count += len(done)
        return done
