"""Grammar states on the device: the constrained requests whose grammar is a token automaton
(constrained/token_automaton.py) keep their automaton state in a device tensor, one entry per
request slot. A step's sampling masks those rows with their state's table row and, right after
drawing, moves each state by the drawn token: both queued on the device behind the forward pass,
so the mask needs neither the previous token on the host (no deferred sampling) nor a host call
per row, and it is the exact mask (the tokens are masked sampling's, never redrawn).

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
from radixlm.scheduler.request import Req
from radixlm.utils.device import to_device


@dataclass
class DeviceGrammarRows:
    """A step's sampled rows whose grammar state is on the device."""
    flags: list[bool]        # per sampled row
    rows: torch.Tensor       # their indices among the sampled rows (int64, device)
    pool: torch.Tensor       # their request slots (int64, device)
    states: torch.Tensor     # their states before this step's token (int64, device)
    masks: torch.Tensor      # [rows, words] int32: their masks, xgrammar's layout
    table: AutomataTable
    every: bool = False      # every sampled row is one (rows is 0..n-1)


class GrammarStates:
    def __init__(self, slots: int, device: torch.device):
        self.device = device
        self.states = torch.zeros(slots, dtype=torch.int64, device=device)   # (index dtype)
        self.rows_sampled = 0     # rows masked here since start (Stats.grammar_device_rows)
        # (rows, slots) of the last step and their device indices: reused while they repeat
        # (a decode batch's do, step after step).
        self._last: tuple[list[int], list[int], torch.Tensor, torch.Tensor] | None = None

    def rows(self, reqs: list[Req], live: list[bool],
             table: AutomataTable | None) -> DeviceGrammarRows | None:
        """The step's rows sampled under a device automaton (None when it has none), their
        states written from the host where needed and their masks gathered."""
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
        if self._last is not None and self._last[0] == picks and self._last[1] == slots:
            rows, pool = self._last[2], self._last[3]
        else:
            rows = to_device(picks, torch.int64, self.device)
            pool = to_device(slots, torch.int64, self.device)
            self._last = (picks, slots, rows, pool)
        states = self.states[pool]
        every = len(picks) == len(reqs)    # (then the rows are all, in order)
        return DeviceGrammarRows(flags, rows, pool, states, allowed[states], table, every)

    def advance(self, dev: DeviceGrammarRows, next_token_ids: torch.Tensor) -> None:
        """Move the rows' states by the tokens just drawn (queued on the device)."""
        next_state = dev.table.next_state
        tokens = next_token_ids if dev.every else next_token_ids[dev.rows]
        # (clamped: an id past the table would be a device-side fault, not an error)
        tokens = tokens.clamp(0, next_state.shape[1] - 1)
        self.states[dev.pool] = next_state[dev.states, tokens].to(torch.int64)
