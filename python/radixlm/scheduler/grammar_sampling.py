"""Optimistic grammar sampling: a constrained request's decode rows sample without the grammar
mask, and the grammar checks the sampled token afterwards, as it must anyway to advance.

Why: the mask is host work on every step of every constrained row (xgrammar walks the
vocabulary: ~20 us a row for a simple regex, ~400 us inside a bounded JSON string), and since it
needs the previous step's token it also makes the overlap scheduler wait for that token before
the step can sample (deferred sampling). A model asked for JSON mostly writes valid JSON, so most
masks change nothing.

Why the output does not change: for a row without top-k / top-p / min-p, masked sampling picks
the argmax, over the allowed tokens, of the adjusted logits (greedy) or of adjusted logits /
temperature + noise, where the noise is a function of (seed, position, token) only
(sampling/noise.py). When the unmasked winner is allowed it is also the winner among the allowed
tokens: the token masked sampling picks. When it is not, the request samples that position again
under the mask, with the same noise, and gets masked sampling's token. So the tokens are those of
masked sampling, one for one, logprobs included (they are log_softmax of the raw logits either
way). A filter's cut-off depends on which tokens remain after the mask, so rows with one always
sample masked (`may_sample_unmasked`).

A rejection costs the request one step. A greedy row is redrawn on the host from the step's
best REDRAW_CANDIDATES tokens (`redraw_from_alternatives`): the first the grammar allows is masked
sampling's argmax, when its score is strictly above the next one's (a tie goes to the device,
which picks the lowest id). Otherwise the step keeps a copy of its unmasked rows' logits
(`save_unmasked_logits`), and the rejected row is sampled again from them under the mask
(`MaskedResampler`), on a side stream, as the next step's forward runs on the main one. Under the
overlap scheduler that next step was launched with the rejected token, so its row for the request
is dropped and the step after computes the new token's row (ResultProcessor). Rows past the
copy's size cap, when rejected, recompute their last token's row instead (two steps). After its
r-th rejection a request samples masked for 2**r steps (at most MAX_MASKED_STEPS), so one that
keeps fighting the grammar soon pays for masks instead of rejections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from radixlm.sampling.params import TOP_K_ALL, SamplingParams
from radixlm.scheduler.request import Req
from radixlm.utils.device import to_device

if TYPE_CHECKING:
    from radixlm.constrained.base import GrammarBackend, GrammarMatcher
    from radixlm.sampling.sampler import Sampler
    from radixlm.scheduler.grammar_states import DeviceGrammarRows
    from radixlm.scheduler.launched_step import LaunchedStep
    from radixlm.scheduler.step_sampling import StepSampling

MAX_MASKED_STEPS = 64
# Best tokens a step reports for its unmasked greedy rows, for redrawing a rejected one on the
# host: a device redraw makes the host wait for a side stream (~0.5 ms a step at batch 64 on the
# bundled model), a walk over these a few accept calls.
REDRAW_CANDIDATES = 16
# The saved logits of one step are at most this large (float32 rows of the vocabulary: 64 MiB is
# 128 rows of a 128k vocabulary); rows beyond it, if rejected, recompute their last token's row
# instead (a step more). Under overlap two steps' copies are alive at once.
MAX_SAVED_LOGITS_BYTES = 64 << 20


def may_sample_unmasked(params: SamplingParams) -> bool:
    """Whether unmasked sampling gives masked sampling's token for these parameters: greedy,
    or a plain temperature draw (no top-k, top-p or min-p cut-off)."""
    if params.is_greedy:
        return True
    return params.top_k == TOP_K_ALL and params.top_p >= 1.0 and params.min_p <= 0.0


def on_masked_decode_sample(req: Req) -> None:
    """A decode row of `req` sampled under the mask: one step less of its masked period."""
    if req.grammar_masked_steps > 0:
        req.grammar_masked_steps -= 1


def on_rejection(req: Req) -> None:
    """The grammar rejected `req`'s unmasked token: it samples masked for the next 2**r steps."""
    req.grammar_rejections += 1
    req.grammar_masked_steps = min(2 ** min(req.grammar_rejections, 16), MAX_MASKED_STEPS)


def split_rows(reqs: list[Req], live: list[bool],
               on_device: list[bool] | None = None) -> tuple[list[bool], list[bool]]:
    """For a decode step's sampled rows: which the host checks after sampling (those sampling
    without their mask, and `on_device`: masked on the device from their state,
    scheduler/grammar_states.py; empty when none) and which the host masks (live constrained
    rows among the rest; the others' masks are moot). Counts down the masked periods of the
    masked ones."""
    on_device = on_device or [False] * len(reqs)
    unmasked = [d or r.samples_unmasked for r, d in zip(reqs, on_device)]
    if not any(unmasked):
        unmasked = []
    masked = [a and not u for a, u in zip(live, unmasked)] if unmasked else live
    for r, m in zip(reqs, masked):
        if m and r.grammar is not None:
            on_masked_decode_sample(r)
    return unmasked, masked


def alternatives_wanted(reqs: list[Req], unmasked: list[bool],
                        on_device: list[bool] | None = None) -> int:
    """How many best tokens a step's sampling should report (SampleOutput.alternatives):
    REDRAW_CANDIDATES if it has a greedy row sampling without its mask (not `on_device`: those
    are masked exactly, never redrawn), else 0."""
    on_device = on_device or [False] * len(reqs)
    if REDRAW_CANDIDATES and any(u and not d and r.sampling_params.is_greedy
                                 for u, d, r in zip(unmasked, on_device, reqs)):
        return REDRAW_CANDIDATES
    return 0


@dataclass
class GrammarRows:
    """How a step's sampled rows meet their grammars."""
    unmasked: list[bool]       # the host checks their tokens after sampling (empty: none)
    masked: list[bool]         # the host fills their masks
    device: "DeviceGrammarRows | None"   # masked on the device from their states
    saved_rows: list[int]      # unmasked rows whose logits are kept for a redraw
    alternatives: int          # best tokens the sampling reports (redraw_from_alternatives)


def plan_grammar_rows(step_sampling: "StepSampling", reqs: list[Req], live: list[bool],
                      decode: bool, backend: "GrammarBackend | None") -> GrammarRows:
    """Which of a step's sampled rows (`live`: not ended or jumped since its forward was
    launched) sample unmasked, which under a host mask and which under a device one. Extend
    rows never sample unmasked (their first token is drawn under the mask)."""
    device = step_sampling.device_grammar_rows(reqs, live, backend)
    on_device = device.flags if device is not None else None
    masked = live if on_device is None else [a and not d for a, d in zip(live, on_device)]
    unmasked: list[bool] = []
    if decode and backend is not None:
        unmasked, masked = split_rows(reqs, live, on_device)
    if not unmasked or on_device == unmasked:   # (none redrawn: no logits kept, no list)
        return GrammarRows(unmasked, masked, device, [], 0)
    redrawable = [u and a and not (on_device and on_device[j])
                  for j, (u, a) in enumerate(zip(unmasked, live))]
    return GrammarRows(unmasked, masked, device, [j for j, k in enumerate(redrawable) if k],
                       alternatives_wanted(reqs, unmasked, on_device))


def redraw_from_alternatives(grammar: "GrammarMatcher", rejected: int, ids: list[int],
                             scores: list[float],
                             logprobs: list[float]) -> tuple[int, float] | None:
    """A greedy row's masked-sampling token, from its step's best tokens (best first), when
    they settle it: the first one the grammar accepts, if its score is strictly above the next
    one's (else a token outside the list, or an equal one with a lower id, could be the
    answer). The grammar has then accepted it. None (the grammar untouched) when the list does
    not settle it."""
    for k in range(len(ids) - 1):
        if scores[k] == float("-inf"):
            return None
        if ids[k] == rejected:
            continue
        if scores[k + 1] == scores[k]:
            return None
        if grammar.accept_token(ids[k]):
            return ids[k], logprobs[k]
    return None


def save_unmasked_logits(step: "LaunchedStep", logits: torch.Tensor, rows: list[int]) -> None:
    """Keep a copy of the logits of the step's sampled rows `rows` (sample-row order), which
    sampled without their mask: the next step's forward overwrites the step's own (the CUDA
    graph's output buffer) before the host reads the sampled tokens. At most
    MAX_SAVED_LOGITS_BYTES: the first rows that fit."""
    row_bytes = logits.shape[1] * logits.element_size()
    rows = rows[:max(MAX_SAVED_LOGITS_BYTES // row_bytes, 1)]
    if len(rows) == logits.shape[0]:
        saved = logits.clone()
    else:
        saved = logits.index_select(0, to_device(rows, torch.int64, logits.device))
    step.saved_logits = saved
    step.saved_row = {j: k for k, j in enumerate(rows)}
    if saved.device.type == "cuda":
        step.saved_ready = torch.cuda.Event()
        step.saved_ready.record()


class MaskedResampler:
    """Samples a rejected row again under its grammar mask, from the logits its step saved, with
    the request's own seed and position (so the same noise): the token masked sampling would
    have drawn there. On CUDA it runs on a side stream that waits only for the saved copy, not
    for the forward pass queued on the main stream since."""

    def __init__(self, sampler: "Sampler", step_sampling: "StepSampling",
                 backend: Callable[[], "GrammarBackend | None"], device: torch.device):
        self.sampler = sampler
        self.step_sampling = step_sampling
        self.backend = backend
        # High priority: its few small kernels should not queue behind the next step's forward
        # on the device while the host waits for them.
        self.stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None

    def resample(self, step: "LaunchedStep", rows: list[int],
                 reqs: list[Req]) -> list[tuple[int, float] | None]:
        """(token, logprob) for each sampled row rows[i] of `step`, drawn under reqs[i]'s
        grammar in its current state (before the rejected token), in one batch; None for a
        row whose logits the step did not keep."""
        saved = step.saved_row or {}
        backend = self.backend()
        drawn: list[tuple[int, float] | None] = [None] * len(rows)
        have = [k for k, j in enumerate(rows) if j in saved]
        if backend is None or not have:
            return drawn
        index = [saved[rows[k]] for k in have]
        which = [reqs[k] for k in have]
        if self.stream is None:
            got = self._sample(step.saved_logits, index, which, backend)
        else:
            # The saved copy is read on this stream only until the blocking read in _sample
            # returns, so it needs no record_stream (it would, were this made asynchronous).
            self.stream.wait_event(step.saved_ready)
            with torch.cuda.stream(self.stream):
                got = self._sample(step.saved_logits, index, which, backend)
        for k, g in zip(have, got):
            drawn[k] = g
        return drawn

    def _sample(self, saved: torch.Tensor, index: list[int], reqs: list[Req],
                backend: "GrammarBackend") -> list[tuple[int, float]]:
        logits = saved[index[0]:index[0] + 1] if len(index) == 1 else \
            saved.index_select(0, to_device(index, torch.int64, saved.device))
        # Position len(output_ids), no token pending: the rejected token's own (its step
        # counted it as pending).
        info = self.step_sampling.build(reqs, [True] * len(reqs), backend, pending=0)
        out = self.sampler(logits, info)
        both = torch.stack([out.next_token_ids.double(), out.next_token_logprobs.double()])
        tokens, logprobs = both.cpu().tolist()   # waits for this stream only
        return [(int(t), lp) for t, lp in zip(tokens, logprobs)]
