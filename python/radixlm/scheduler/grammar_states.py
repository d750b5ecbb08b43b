"""Grammar states on the device: the constrained requests whose grammar is a token automaton
(constrained/token_automaton.py) keep their automaton state in a device tensor, one entry per
request slot. A step's sampling masks those rows with their state's table row and, right after
drawing, moves each state by the drawn token (sampling/token_mask.py; in the draw kernel's own
two launches for a greedy or plain-temperature batch): both queued on the device behind the
forward pass, so the mask needs neither the previous token on the host (no deferred sampling)
nor a host call per row, and it is the exact mask (the tokens are masked sampling's, never
redrawn).

The host matcher follows the same tokens when it processes the step (a table lookup), for
stops, jump-forward and the end of the grammar. The device state is written from the host's
when the two may differ: a request's first sampled step, and whenever its rows were dropped
since (jump-forward, a retraction: Req.kv_epoch moves) or it moved to another slot. Every step
in flight for it then is stale, so the host's state is the one its next token is drawn in.
Speculative decoding verifies drafts against the host matcher, so it keeps the host path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.constrained.token_automaton import AutomataTable
from radixlm.sampling.token_mask import AutomatonRows
from radixlm.scheduler.request import Req
from radixlm.utils.device import to_device


@dataclass
class DeviceGrammarRows:
    """A step's sampled rows whose grammar state is on the device."""
    flags: list[bool]            # per sampled row
    automaton: AutomatonRows     # their tables, states and slots, as the sampler takes them


class GrammarStates:
    def __init__(self, slots: int, device: torch.device):
        self.device = device
        self.states = torch.zeros(slots, dtype=torch.int64, device=device)   # (index dtype)
        self.rows_sampled = 0     # rows masked here since start (Stats.grammar_device_rows)
        # The last step's rows, slots and batch size, with their device tensors: reused
        # while they repeat (a decode batch's do, step after step).
        self._last: _RowTensors | None = None

    def rows(self, reqs: list[Req], live: list[bool],
             table: AutomataTable | None) -> DeviceGrammarRows | None:
        """The step's rows sampled under a device automaton (None when it has none), their
        states written from the host where needed. The sampler masks them and moves their
        states (sampling/token_mask.py)."""
        if table is None:
            return None
        flags = [False] * len(reqs)
        picks: list[int] = []
        slots: list[int] = []
        writes: list[int] = []
        values: list[int] = []
        for j, (req, alive) in enumerate(zip(reqs, live)):   # (one pass: the hot loop)
            grammar = req.grammar
            if not alive or grammar is None or grammar.device_base is None:
                continue
            flags[j] = True
            picks.append(j)
            slot = req.req_pool_idx
            slots.append(slot)
            key = (req.kv_epoch, slot)
            if grammar.device_key != key:     # (type: AutomatonMatcher)
                writes.append(slot)
                values.append(grammar.device_state())
                grammar.device_key = key
        if not picks:
            return None
        self.rows_sampled += len(picks)
        next_state, allowed = table.tables(self.device)
        if writes:
            self.states[to_device(writes, torch.int64, self.device)] = to_device(
                values, torch.int64, self.device)
        last = self._last
        if last is None or (last.batch, last.picks, last.slots) != (len(reqs), picks, slots):
            per_row = [-1] * len(reqs)
            for j, slot in zip(picks, slots):
                per_row[j] = slot
            flat = to_device(per_row + picks + slots, torch.int64, self.device)   # (one copy)
            b, n = len(reqs), len(picks)
            last = self._last = _RowTensors(picks, slots, b, flat[:b], flat[b:b + n],
                                            flat[b + n:])
        return DeviceGrammarRows(flags, AutomatonRows(allowed, next_state, self.states,
                                                      last.row_slots, last.rows, last.pool))


@dataclass
class _RowTensors:
    """A step's automaton rows (`picks`, their `slots`, in a batch of `batch`) and the device
    tensors AutomatonRows takes for them."""
    picks: list[int]
    slots: list[int]
    batch: int
    row_slots: torch.Tensor
    rows: torch.Tensor
    pool: torch.Tensor
