"""A step whose forward pass and sampling are queued on the device, results not yet read.

The sampled ids (and their logprobs) are copied into pinned host memory by a non-blocking copy
queued right after the sampler; `wait()` blocks on that copy alone. This is the one
device-to-host synchronisation of a step: under the overlap scheduler it happens after the next
step has been queued, so the GPU never waits for the host's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.core.logprobs import TopLogprobs
from radixlm.sampling.sampler import SampleOutput
from radixlm.model_executor.model_runner import ForwardOutput
from radixlm.scheduler.schedule_batch import ScheduleBatch
from radixlm.utils.device import to_host_async


@dataclass
class RowTokens:
    """The tokens one sampled row of a step produced for its request. One token without
    speculation; a verify step (speculative decoding) or a multi-token jump may accept several,
    so the result processor always walks a list."""
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)   # per token, when sampled
    # Per token (logprobs, ids) where top logprobs were asked (verify rows; a plain sampled row
    # keeps them in SampleOutput.top_logprobs).
    top_logprobs: list[tuple[list[float], list[int]]] = field(default_factory=list)
    # Per token, the logprobs of the ids its request asked about (verify rows, as above).
    token_ids_logprobs: list[TopLogprobs] = field(default_factory=list)

    @property
    def accept_length(self) -> int:
        return len(self.token_ids)


@dataclass
class LaunchedStep:
    batch: ScheduleBatch
    out: ForwardOutput
    sample_rows: list[int]                 # rows of batch.reqs that sample a token
    # Each row's Req.kv_epoch when the forward was launched: a request whose KV was reset since
    # (jump-forward while this step ran) gets nothing from this step.
    epochs: list[int]
    pool_rows: torch.Tensor                # the batch's req-to-token rows (device), for sampling
    # Each row's kv_allocated_len once the batch was prepared. Under the overlap scheduler a
    # request's next prefill chunk may be launched before this step is processed, so whether
    # this step ended the request's prompt is read here, not from the request.
    kv_lens: list[int] = field(default_factory=list)
    new_tokens: int = 0                    # tokens the forward computes (rows of the batch)
    sampled: SampleOutput | None = None
    # Per sampled row (sample_rows order): sampled without its grammar mask, so the grammar
    # checks the token when it is processed (scheduler/grammar_sampling.py).
    unmasked: list[bool] = field(default_factory=list)
    # Their logits, kept for sampling a rejected row again (grammar_sampling.py): rows of
    # saved_logits by sampled row, and the event that marks the copy done (CUDA).
    saved_logits: torch.Tensor | None = None
    saved_row: dict[int, int] | None = None
    saved_ready: torch.cuda.Event | None = None
    # Verify steps: the target's token after every row and its logprob (batch.verify_rows says
    # whose rows), host copy queued; top logprobs per row where asked (already on the host).
    _verify_host: torch.Tensor | None = None
    _verify_logprobs_host: torch.Tensor | None = None
    _verify_top: list[tuple[list[float], list[int]]] | None = None
    _verify_ids: list[TopLogprobs] | None = None
    _verify_copied: torch.cuda.Event | None = None
    _ids_host: torch.Tensor | None = None
    _logprobs_host: torch.Tensor | None = None
    _copied: torch.cuda.Event | None = None
    _alternatives_host: torch.Tensor | None = None    # SampleOutput.alternatives, on the host

    def is_stale(self, row: int) -> bool:
        return self.batch.reqs[row].kv_epoch != self.epochs[row]

    def attach_samples(self, sampled: SampleOutput) -> None:
        """Record the sampler's output and queue its copy to the host."""
        self.sampled = sampled
        extra = [] if sampled.alternatives is None else [sampled.alternatives]
        (self._ids_host, self._logprobs_host, *alts), self._copied = to_host_async(
            sampled.next_token_ids, sampled.next_token_logprobs, *extra)
        self._alternatives_host = alts[0] if alts else None

    def attach_verify(self, targets: SampleOutput) -> None:
        """Queue the host copy of every row's target token and logprob (what drafts are
        checked against, scheduler/speculation.verify_targets)."""
        (self._verify_host, self._verify_logprobs_host), self._verify_copied = to_host_async(
            targets.next_token_ids, targets.next_token_logprobs)
        self._verify_top = targets.top_logprobs
        self._verify_ids = targets.token_ids_logprobs

    def verified(self, row: int) -> RowTokens:
        """The target's token after each of request `row`'s verify rows, with logprobs."""
        if self._verify_copied is not None:
            self._verify_copied.synchronize()
            self._verify_copied = None
        first, n = self.batch.verify_rows[row]
        tops = self._verify_top[first:first + n] if self._verify_top is not None else []
        asked = self._verify_ids[first:first + n] if self._verify_ids is not None else []
        return RowTokens(self._verify_host[first:first + n].tolist(),
                         self._verify_logprobs_host[first:first + n].tolist(), tops, asked)

    def alternatives(self, j: int) -> tuple[list[int], list[float], list[float]] | None:
        """Sampled row j's best tokens (ids, scores, logprobs; SampleOutput.alternatives), if
        the step asked for them; call after wait()."""
        if self._alternatives_host is None:
            return None
        ids, scores, logprobs = self._alternatives_host[:, j].tolist()
        return [int(t) for t in ids], scores, logprobs

    def wait(self) -> list[RowTokens]:
        """The tokens of each sampled row, in sample_rows order (blocks until the copy is
        done)."""
        if self._ids_host is None:
            return []
        if self._copied is not None:
            self._copied.synchronize()
        return [RowTokens([t], [lp]) for t, lp in zip(self._ids_host.tolist(),
                                                     self._logprobs_host.tolist())]
