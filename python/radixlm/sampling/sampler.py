"""The sampler: logits of one batch -> next token ids and their logprobs.

Sampling is separate from the forward pass: the model runner hands over raw logits, the scheduler
builds a `SamplingBatchInfo` (device tensors, once per step) from its requests, and `Sampler` turns
the two into a `SampleOutput`.

Order of operations, per row (all rows at once, as whole-batch tensor ops):

1. raw logits -> float32 (kept for logprobs: reported logprobs are log_softmax of these);
2. + logit_bias, repetition / frequency / presence penalties, min_new_tokens bans
   (`penalties.LogitAdjustments`);
3. greedy rows (temperature < 1e-6 or top_k == 1): argmax;
4. other rows: / temperature, then top-k, then top-p (on the distribution renormalised after
   top-k), then min-p, then a Gumbel-max draw with counter-based noise (`sampling.noise`).

On CUDA the logprob of the chosen token, and for all-greedy batches without adjustments the
argmax too, come from one pass over the logits (`logprob_kernels.py`) instead of the float32
copy, argmax, logsumexp and gather; top logprobs and the redraw list (`alternatives`) from a
top-k kernel pair (`topk_kernels.py`) instead of topk, gathers and casts; a sampled batch's
top-k / top-p / min-p cut-offs from a value search (`cutoff_kernels.py`) instead of a sort,
and its draw (temperature, cut-off, noise, argmax, logprob) from one pass
(`draw_kernels.py`) (RADIXLM_DISABLE_FUSED_OPS=1: the PyTorch code). The same tokens and
logprobs, except that a NaN logit is never the greedy token there, equal values are listed by
lower token id, and a draw can differ where two noisy scores are within the last bit of a
`log` (the kernels' and torch's may differ there).

Filters are applied as a per-row logit threshold (keep tokens whose scaled logit >= threshold), so
ties at a cut-off are all kept and the result does not depend on how a sort orders equal values
(which differs between CPU and CUDA). Which filters run is decided on the host when the info is
built, so the hot path has no device->host syncs and no per-row Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.core.logprobs import TopLogprobs, logprobs_of_tokens
from radixlm.layers.kernels import use_fused
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.noise import gumbel_argmax, token_keys


# Logit dtypes the kernels take (the sampling cut-offs search over their bit patterns).
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # [B] int64
    # [B] float32: log_softmax of the RAW logits (before any adjustment) at the chosen token.
    next_token_logprobs: torch.Tensor
    # Per row (logprobs, token ids), sorted by logprob descending; empty lists for rows that did
    # not ask; None when no row asked.
    top_logprobs: list[tuple[list[float], list[int]]] | None = None
    # [3, B, K] when asked (`alternatives`): per row the K best tokens by the score greedy
    # rows take the argmax of (the logits after adjustments, and after the grammar mask for
    # masked rows), best first, as [ids, scores, logprobs]; one tensor, so one host copy. What
    # a greedy grammar row drawn without its mask and rejected is redrawn from (only such rows
    # read it: grammar_sampling.py).
    alternatives: torch.Tensor | None = None
    # Per row, [(logprob, id)] of the token ids it asked about (`token_ids_logprob`), raw
    # logits' log_softmax; None when no row asked.
    token_ids_logprobs: list[TopLogprobs] | None = None


class Sampler:
    """All per-request state comes in through `SamplingBatchInfo`; the only thing kept is a cache
    of the per-token half of the noise hash, which depends on nothing but (vocab, device)."""

    def __init__(self, logits_hold_bf16: bool = False) -> None:
        self._token_keys: dict[tuple[int, torch.device], torch.Tensor] = {}
        # The model's float32 logits are bf16 values (a bf16 lm_head's output, converted):
        # the cut-off search then runs over 16-bit keys (cutoff_kernels.py).
        self.logits_hold_bf16 = logits_hold_bf16

    def _get_token_keys(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        key = (vocab_size, device)
        if key not in self._token_keys:
            self._token_keys[key] = token_keys(vocab_size, device)
        return self._token_keys[key]

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo,
                 top_logprobs_nums: list[int] | None = None,
                 alternatives: int = 0,
                 token_ids: list[list[int] | None] | None = None) -> SampleOutput:
        """`token_ids`: per row, the token ids whose logprobs it reports (or None)."""
        out = self._sample_batch(logits, info, top_logprobs_nums, alternatives)
        if info.vocab_mask is not None:
            info.vocab_mask.advance(out.next_token_ids)   # (unless the draw kernel did)
        if token_ids:
            out.token_ids_logprobs = logprobs_of_tokens(logits, token_ids)
        return out

    def _sample_batch(self, logits: torch.Tensor, info: SamplingBatchInfo,
                      top_logprobs_nums: list[int] | None,
                      alternatives: int) -> SampleOutput:
        if logits.dim() != 2 or logits.shape[1] != info.vocab_size:
            raise ValueError(f"logits of shape {tuple(logits.shape)} do not match vocab size "
                             f"{info.vocab_size}")
        k_top = max(top_logprobs_nums) if top_logprobs_nums else 0
        if top_logprobs_nums and len(top_logprobs_nums) != logits.shape[0]:
            raise ValueError(f"top_logprobs_nums has {len(top_logprobs_nums)} entries for "
                             f"{logits.shape[0]} rows")
        if use_fused(logits) and self._fused_takes(logits, k_top, alternatives):
            return self._fused(logits, info, top_logprobs_nums, k_top, alternatives)
        raw = logits.float()
        x = self.process_logits(raw, info)
        next_ids = torch.argmax(x, dim=-1) if info.all_greedy else self._sample(x, info)
        # log_softmax at one index = logit - logsumexp; avoids materialising a [B, V] result.
        lse = torch.logsumexp(raw, dim=-1)
        chosen = raw.gather(1, next_ids.unsqueeze(1)).squeeze(1) - lse
        top = self._top_logprobs(raw, lse, top_logprobs_nums)
        alts = self._alternatives(raw, x, lse, alternatives) if alternatives > 0 else None
        return SampleOutput(next_token_ids=next_ids, next_token_logprobs=chosen, top_logprobs=top,
                            alternatives=alts)

    def warm_up(self, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Compile the sampled-batch kernels (cut-off search, draw) at start-up rather than in
        the first sampled step (seconds on a cold Triton cache): one batch using every filter,
        on logits of `dtype` (the model runner's: float32). The kernels do not specialise on
        the batch size; penalised rows' variants (scores apart from the logits) compile on
        first use."""
        if device.type != "cuda" or not use_fused(torch.empty(0, device=device)):
            return
        from radixlm.sampling.params import SamplingParams
        from radixlm.sampling.request import SamplingRequest
        reqs = [SamplingRequest(params=SamplingParams(temperature=0.8, **kind), seed=0,
                                prompt_ids=[1], output_ids=[])
                for kind in (dict(top_p=0.9), dict(top_k=20, top_p=0.8, min_p=0.05))]
        info = SamplingBatchInfo.build(reqs, vocab_size, device)
        self(torch.zeros(len(reqs), vocab_size, dtype=dtype, device=device), info)

    @staticmethod
    def _fused_takes(logits: torch.Tensor, k_top: int, alternatives: int) -> bool:
        """Whether the kernels of logprob_kernels.py / topk_kernels.py take this batch."""
        if logits.stride(1) != 1 or logits.dtype not in _KERNEL_DTYPES:
            return False
        if k_top <= 0 and alternatives <= 0:
            return True
        from radixlm.sampling import topk_kernels
        vocab = logits.shape[1]
        return all(k <= 0 or topk_kernels.supports(logits, min(k, vocab))
                   for k in (k_top, alternatives))

    def _fused(self, logits: torch.Tensor, info: SamplingBatchInfo,
               nums: list[int] | None, k_top: int, alternatives: int) -> SampleOutput:
        """The same outputs as the PyTorch code in __call__, from a few Triton kernels that read
        the logits in their own dtype: no float32 copy unless adjustments or a mask apply."""
        from radixlm.sampling.draw_kernels import draw_with_logprobs
        from radixlm.sampling.logprob_kernels import chosen_logprobs, greedy_with_logprobs
        from radixlm.sampling.topk_kernels import top_k_with_logprobs
        vocab = logits.shape[1]
        mask = info.vocab_mask
        plain = info.adjustments.is_noop and mask is None
        if info.all_greedy and plain and not (k_top > 0 or alternatives > 0):
            # The common greedy step: argmax and its logprob in one pass.
            next_ids, chosen = greedy_with_logprobs(logits)
            return SampleOutput(next_token_ids=next_ids, next_token_logprobs=chosen)
        if (mask is not None and alternatives <= 0
                and not (info.need_top_k or info.need_top_p or info.need_min_p)):
            # A constrained greedy or plain-temperature batch: the draw kernel reads the masks
            # (and moves the device automata) in its pass over the (adjusted) logits.
            x = self.adjusted_logits(logits.float(), info)
            next_ids, chosen = draw_with_logprobs(x, logits, info.temperatures, None,
                                                  info.greedy_mask, info.row_keys, mask)
            tops = top_k_with_logprobs(logits, logits, min(k_top, vocab)) if k_top > 0 else None
            return SampleOutput(next_token_ids=next_ids, next_token_logprobs=chosen,
                                top_logprobs=_top_lists(tops, nums))
        # What greedy rows take the argmax of, and alternatives are ranked by.
        x = logits if plain else self.process_logits(logits.float(), info)
        alts = (top_k_with_logprobs(x, logits, min(alternatives, vocab)) if alternatives > 0
                else None)
        tops = top_k_with_logprobs(logits, logits, min(k_top, vocab)) if k_top > 0 else None
        # A greedy batch's tokens are the first of a top-k list over x (first index of the
        # maximum, as torch.argmax), and their logprobs come with them.
        first = alts if alts is not None else tops if plain else None
        if info.all_greedy and first is not None:
            next_ids, chosen = first[0, :, 0].long(), first[2, :, 0].contiguous()
        else:
            if info.all_greedy:
                next_ids = torch.argmax(x, dim=-1)
                chosen = chosen_logprobs(logits, next_ids)
            else:
                next_ids, chosen = self._fused_draw(x, logits, info)
        return SampleOutput(next_token_ids=next_ids, next_token_logprobs=chosen,
                            top_logprobs=_top_lists(tops, nums), alternatives=alts)

    def _fused_draw(self, x: torch.Tensor, logits: torch.Tensor,
                    info: SamplingBatchInfo) -> tuple[torch.Tensor, torch.Tensor]:
        """`_sample` and the chosen tokens' logprobs from the kernels: the cut-offs from a
        value search (cutoff_kernels.py) instead of a sort, then one pass for noise, argmax
        and logprob (draw_kernels.py)."""
        from radixlm.sampling.cutoff_kernels import sampling_cutoffs
        from radixlm.sampling.draw_kernels import draw_with_logprobs
        cutoffs = None
        if info.need_top_p and not info.top_p_needs_full_sort:
            # Every top-p row has a top-k: torch.topk of width max_top_k and a softmax over it
            # beat the two searches (1.0 vs 1.5 ms at batch 256 over 151,936 tokens, top_k 40).
            cutoffs = self.cutoffs(x.float() / info.temperatures, info)
        elif info.need_top_k or info.need_top_p or info.need_min_p:
            cutoffs = sampling_cutoffs(x, info.temperatures, info.top_ks, info.top_p_limits,
                                       info.log_min_ps, top_k=info.need_top_k,
                                       top_p=info.need_top_p, min_p=info.need_min_p,
                                       bf16_values=self.logits_hold_bf16 and x is logits)
        return draw_with_logprobs(x, logits, info.temperatures, cutoffs, info.greedy_mask,
                                  info.row_keys)

    @staticmethod
    def _alternatives(raw: torch.Tensor, x: torch.Tensor, lse: torch.Tensor,
                      k: int) -> torch.Tensor:
        """[3, B, k]: the k best tokens of each row by x, as [ids, x, logprobs], in float32
        (exact for ids below 2**24; float64 for a larger vocabulary). Few ops: each is a
        kernel launch on the host's critical path."""
        scores, ids = torch.topk(x, min(k, x.shape[1]), dim=-1)   # sorted, best first
        logprobs = raw.gather(1, ids) - lse.unsqueeze(1)
        dtype = torch.float32 if x.shape[1] <= 1 << 24 else torch.float64
        return torch.stack([ids.to(dtype), scores.to(dtype), logprobs.to(dtype)])

    @staticmethod
    def process_logits(raw: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """float32 logits after logit_bias, penalties, min_new_tokens and the grammar mask
        (before temperature).

        Returns `raw` itself when nothing applies; otherwise a fresh tensor (raw is never touched,
        it is needed for logprobs and may be the caller's buffer).
        """
        x = Sampler.adjusted_logits(raw, info)
        if info.vocab_mask is not None:
            if x is raw:
                x = raw.clone(memory_format=torch.contiguous_format)
            info.vocab_mask.apply_(x)
        return x

    @staticmethod
    def adjusted_logits(raw: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """process_logits without the grammar mask: `raw` itself when no adjustment applies,
        else a fresh tensor."""
        if info.adjustments.is_noop:
            return raw
        return info.adjustments.apply_(raw.clone(memory_format=torch.contiguous_format))

    @staticmethod
    def filter_logits(x: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """Temperature-scaled logits with tokens outside top-k / top-p / min-p set to -inf."""
        scaled = x / info.temperatures
        if not (info.need_top_k or info.need_top_p or info.need_min_p):
            return scaled
        threshold = Sampler.cutoffs(scaled, info)
        return scaled.masked_fill(scaled < threshold.unsqueeze(1), float("-inf"))

    @staticmethod
    def cutoffs(scaled: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """Per row of temperature-scaled logits, the smallest kept value after top-k, top-p
        and min-p (-inf where none applies): what filter_logits masks below."""
        if info.need_top_k or info.need_top_p:
            threshold = _top_k_top_p_threshold(scaled, info)
        else:
            threshold = scaled.new_full((scaled.shape[0],), float("-inf"))
        if info.need_min_p:
            # prob_i < min_p * prob_max  <=>  scaled_i < scaled_max + log(min_p); fmax: a row
            # without min-p whose max is +inf has inf + -inf = NaN here, which must not count
            row_max = scaled.amax(dim=-1)
            threshold = torch.fmax(threshold, row_max + info.log_min_ps)
        return threshold

    def _sample(self, x: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        filtered = self.filter_logits(x, info)
        tok_keys = self._get_token_keys(info.vocab_size, x.device)
        sampled = gumbel_argmax(filtered, info.row_keys, tok_keys)
        if info.any_greedy:
            # Greedy rows have temperature 1 and no filters, so argmax(x) is their answer.
            sampled = torch.where(info.greedy_mask, torch.argmax(x, dim=-1), sampled)
        return sampled

    @staticmethod
    def _top_logprobs(raw: torch.Tensor, lse: torch.Tensor,
                      nums: list[int] | None) -> list[tuple[list[float], list[int]]] | None:
        if not nums or max(nums) <= 0:
            return None
        k = min(max(nums), raw.shape[1])
        values, ids = torch.topk(raw, k, dim=-1)  # one topk for the batch, sliced per row below
        values = (values - lse.unsqueeze(1)).tolist()
        ids = ids.tolist()
        return [(values[i][:n], ids[i][:n]) if n > 0 else ([], []) for i, n in enumerate(nums)]


def _top_k_top_p_threshold(scaled: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Per-row smallest kept scaled logit after top-k then top-p (-inf for rows using neither).

    Only the descending prefix of each row matters. When every top-p row also has a top-k, that
    prefix is one batched topk of width max_top_k; otherwise one full sort of the batch.
    """
    vocab = info.vocab_size
    if info.top_p_needs_full_sort:
        vals = torch.sort(scaled, dim=-1, descending=True).values
    else:
        vals = torch.topk(scaled, info.max_top_k, dim=-1).values  # sorted, descending
    width = vals.shape[1]
    n_keep = info.top_ks.clamp(max=width)
    if info.need_top_p:
        if info.need_top_k:
            # Top-p works on the distribution renormalised over the top-k survivors (HF, vLLM).
            positions = torch.arange(width, device=scaled.device)
            vals_k = vals.masked_fill(positions >= info.top_ks.unsqueeze(1), float("-inf"))
        else:
            vals_k = vals
        probs = torch.softmax(vals_k, dim=-1)
        # Mass strictly before each position; shifting the cumsum (instead of cumsum - p) keeps
        # it monotone in floating point, so the kept set is a prefix and a count describes it.
        cum = torch.cumsum(probs, dim=-1)
        mass_before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)
        # The smallest prefix whose mass reaches top_p: a token stays while the mass before it is
        # still short of top_p. Position 0 always stays (mass 0 < top_p, as top_p > 0).
        n_top_p = (mass_before < info.top_p_limits.unsqueeze(1)).sum(dim=-1)
        n_keep = torch.minimum(n_keep, n_top_p)
    kth = vals.gather(1, (n_keep.clamp(min=1) - 1).unsqueeze(1)).squeeze(1)
    active = (info.top_ks < vocab) | (info.top_p_limits < 1.0)
    return torch.where(active, kth, torch.full_like(kth, float("-inf")))


def _top_lists(tops: torch.Tensor | None,
               nums: list[int] | None) -> list[tuple[list[float], list[int]]] | None:
    """Each row's first nums[i] (logprob, id) lists from the top-k kernel's [3, B, k] output,
    in one host copy (ids are exact in float32)."""
    if tops is None or nums is None:
        return None
    ids, logprobs = tops[[0, 2]].tolist()
    return [([float(v) for v in logprobs[i][:n]], [int(t) for t in ids[i][:n]])
            if n > 0 else ([], []) for i, n in enumerate(nums)]
