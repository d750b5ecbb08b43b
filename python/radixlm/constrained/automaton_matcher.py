"""A request's grammar state in a token automaton (constrained/token_automaton.py), on the host:
a table lookup per token. The scheduler keeps the same state on the device while the automaton is
in the device tables (scheduler/grammar_states.py)."""

from __future__ import annotations

import torch

from radixlm.constrained.base import GrammarMatcher
from radixlm.constrained.token_automaton import TokenAutomaton


class AutomatonMatcher(GrammarMatcher):
    """A request's position in a TokenAutomaton (host side). `device_base` is not None when
    the automaton is in the device tables: the scheduler then keeps the state on the device."""

    def __init__(self, automaton: TokenAutomaton, device_base: int | None,
                 static_mask_row: int = 0):
        self.automaton = automaton
        self.device_base = device_base
        self.static_mask_row = static_mask_row
        self.state = 0
        self.terminated = False
        self._history: list[int] = []
        # (the table and its stop value, read on every accept: the scheduler's critical path)
        self._next = automaton.next_state
        self._vocab = automaton.next_state.shape[1]
        self._end = automaton.terminated
        # (Req.kv_epoch, req_pool_idx) when the device state was last written from this one
        # (scheduler/grammar_states.py).
        self.device_key: tuple[int, int] | None = None

    def accept_token(self, token: int) -> bool:
        if self.terminated or not 0 <= token < self._vocab:
            return False
        nxt = int(self._next[self.state, token])
        if nxt < 0:
            return False
        self._history.append(self.state)
        if nxt == self._end:
            self.terminated = True
        else:
            self.state = nxt
        return True

    def rollback(self, num_tokens: int) -> None:
        for _ in range(min(num_tokens, len(self._history))):
            self.state = self._history.pop()
            self.terminated = False

    def is_terminated(self) -> bool:
        return self.terminated

    def find_jump_forward_string(self) -> str:
        return "" if self.terminated else self.automaton.forced[self.state]

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        mask[row].copy_(self.automaton.allowed[self.state])

    def device_state(self) -> int:
        """The global state the device tables know this one by (0, allowing everything, once
        terminated: the request has ended and its rows are dropped)."""
        assert self.device_base is not None
        return 0 if self.terminated else self.device_base + self.state
