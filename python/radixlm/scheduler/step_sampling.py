"""How a step's sampled rows sample: their SamplingBatchInfo (device tensors built from the
requests as they are now) and the grammar masks of the constrained ones."""

from __future__ import annotations

import dataclasses

import torch

from radixlm.constrained.base import GrammarBackend
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.penalties import LogitAdjustments, min_tokens_ban_index
from radixlm.sampling.request import SamplingRequest
from radixlm.sampling.token_mask import TokenMask
from radixlm.scheduler.grammar_states import DeviceGrammarRows, GrammarStates
from radixlm.scheduler.request import Req
from radixlm.utils.device import to_device


class StepSampling:
    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device,
                 grammar_slots: int = 0):
        """`grammar_slots`: request slots whose grammar state can live on the device (0: none;
        scheduler/grammar_states.py)."""
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.device = device
        self._greedy_infos: dict[int, SamplingBatchInfo] = {}
        self.grammar_states = GrammarStates(grammar_slots, device) if grammar_slots else None

    @property
    def device_rows_sampled(self) -> int:
        return self.grammar_states.rows_sampled if self.grammar_states is not None else 0

    def device_grammar_rows(self, reqs: list[Req], live: list[bool],
                            backend: GrammarBackend | None) -> DeviceGrammarRows | None:
        """The sampled rows whose grammar runs on the device (see GrammarStates.rows)."""
        if self.grammar_states is None or backend is None:
            return None
        return self.grammar_states.rows(reqs, live, backend.automata_table())

    def build(self, reqs: list[Req], masked: list[bool],
              grammar_backend: GrammarBackend | None,
              pending: int | None = None,
              device_rows: DeviceGrammarRows | None = None) -> SamplingBatchInfo:
        """The rows' sampling tensors, with the grammar masks of the constrained rows that
        `masked` names (not those that ended or jumped since the forward was launched, nor
        those sampling unmasked: scheduler/grammar_sampling.py) and of `device_rows` (masks
        from their states on the device). `pending`: the tokens each request has in flight,
        for the noise position (default: its own num_pending)."""
        info = self._info(reqs, pending)
        info.vocab_mask = self._grammar_mask(reqs, masked, grammar_backend, device_rows)
        return info

    def _info(self, reqs: list[Req], pending: int | None) -> SamplingBatchInfo:
        """Those of an all-greedy batch with no logit bias and no penalties depend on its size
        alone, so they are built once per size (building them is a per-request Python loop the
        host would otherwise pay every step); min_new_tokens bans, a few ids a row, are added
        per step. Greedy grammar requests share them too: their mask is set per step
        (`vocab_mask`)."""
        params = [r.sampling_params for r in reqs]
        if not all(p.is_greedy and not p.logit_bias and not p.has_penalties for p in params):
            return SamplingBatchInfo.build(
                [SamplingRequest(r.sampling_params, r.seed, r.origin_input_ids, r.output_ids,
                                 self.eos_token_ids,
                                 r.num_pending if pending is None else pending)
                 for r in reqs],
                self.vocab_size, self.device)
        info = self._greedy_infos.get(len(reqs))
        if info is None:
            info = SamplingBatchInfo.build(
                [SamplingRequest(p, r.seed, (), (), ()) for p, r in zip(params, reqs)],
                self.vocab_size, self.device)
            info = self._greedy_infos[len(reqs)] = dataclasses.replace(
                info, adjustments=LogitAdjustments(self.vocab_size))
        if any(p.min_new_tokens for p in params):
            banned = min_tokens_ban_index(
                ((r.sampling_params,
                  len(r.output_ids) + (r.num_pending if pending is None else pending),
                  self.eos_token_ids) for r in reqs), self.vocab_size)
            if banned:
                info = dataclasses.replace(info, adjustments=LogitAdjustments.bans_only(
                    banned, self.vocab_size, self.device))
        return info

    def _grammar_mask(self, reqs: list[Req], masked: list[bool],
                      backend: GrammarBackend | None,
                      device_rows: DeviceGrammarRows | None) -> TokenMask | None:
        """Masked rows: their grammar's mask, filled on the host now. Device rows: their
        state's mask, read on the device by the sampler. Other constrained rows (sampling
        without the mask): their grammar's static mask (the tokens it never accepts), already
        on the device (constrained/alphabet.py)."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None and masked[i]]
        on_device = device_rows.flags if device_rows is not None else [False] * len(reqs)
        static_rows = [r.grammar.static_mask_row if r.grammar is not None and not m and not d
                       else 0 for r, m, d in zip(reqs, masked, on_device)]
        static = backend.static_masks(static_rows, self.device) if backend is not None else None
        automaton = device_rows.automaton if device_rows is not None else None
        if not rows:
            if static is None and automaton is None:
                return None
            assert backend is not None
            return TokenMask(static, automaton, backend.apply_mask)
        assert backend is not None, "a grammar request without the grammar backend"
        mask = backend.allocate_mask(len(reqs))
        backend.fill_vocab_masks([reqs[i].grammar for i in rows], mask, rows)
        words = to_device(mask, torch.int32, self.device)
        if static is not None:
            # (a filled row's static row is 0, allowing every token: its own mask stands)
            words = torch.bitwise_and(words, static)
        return TokenMask(words, automaton, backend.apply_mask)
