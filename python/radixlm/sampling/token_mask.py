"""Which tokens the rows of a batch may draw (grammar constraints), as the sampler takes them.

A row's allowed tokens are the set bits of its mask: bit t % 32 of 32-bit word t // 32 (the
layout xgrammar fills). A mask comes from up to two sources, ANDed:

- `words` [B, W] int32 on the device: masks the host filled (xgrammar's matchers) or a
  grammar's static mask (constrained/alphabet.py); every bit set for a row without one;
- an automaton state (scheduler/grammar_states.py): a row with a request slot >= 0 takes the
  table row allowed[states[slot]], and once its token is drawn its state moves to
  next_state[states[slot], token].

The sampler's draw kernel (draw_kernels.py) reads both in its one pass over the logits and moves
the states in its second stage: a constrained greedy or plain-temperature batch costs the same
two launches as an unconstrained one. Other paths (cut-offs, penalties, the PyTorch code) set
the masked logits to -inf first (`apply_`) and move the states after drawing (`advance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class AutomatonRows:
    """The rows of a batch whose grammar state is on the device."""
    allowed: torch.Tensor      # [S, W] int32: each (global) state's mask
    next_state: torch.Tensor   # [S, V'] int32: the state after each token
    states: torch.Tensor       # [slots] int64: each request slot's state (moved by the draw)
    slots: torch.Tensor        # [B] int64: the row's request slot, -1 for rows without one
    rows: torch.Tensor         # [n] int64: the rows with a slot
    pool: torch.Tensor         # [n] int64: their slots (slots[rows])


@dataclass
class TokenMask:
    words: torch.Tensor | None = None
    automaton: AutomatonRows | None = None
    # Sets the logits of disallowed tokens to -inf in place, from [B, W] words (the grammar
    # backend's kernel; None: apply_words below).
    apply_words: Callable[[torch.Tensor, torch.Tensor], None] | None = None
    # The automaton states were moved by this batch's tokens (each draw moves them once).
    moved: bool = False

    def row_words(self, batch_size: int) -> torch.Tensor:
        """[B, W] int32: every row's mask, both sources ANDed."""
        a = self.automaton
        if a is None:
            assert self.words is not None
            return self.words
        if self.words is None:
            words = torch.full((batch_size, a.allowed.shape[1]), -1, dtype=torch.int32,
                               device=a.allowed.device)
        else:
            words = self.words.clone()    # (may be a cached tensor: never written)
        words[a.rows] &= a.allowed[a.states[a.pool]]
        return words

    def apply_(self, logits: torch.Tensor) -> None:
        """Set the logits of every row's disallowed tokens to -inf, in place."""
        words = self.row_words(logits.shape[0])
        (self.apply_words or apply_words)(logits, words)

    def advance(self, tokens: torch.Tensor) -> None:
        """Move the automaton rows' states by the tokens drawn ([B] int64), once (queued on
        the device; the draw kernel may have done it: `moved`)."""
        a = self.automaton
        if a is None or self.moved:
            return
        self.moved = True
        picked = tokens[a.rows].clamp(0, a.next_state.shape[1] - 1)   # (an id past the table:
        a.states[a.pool] = a.next_state[a.states[a.pool], picked].to(torch.int64)  # no fault)


def apply_words(logits: torch.Tensor, words: torch.Tensor) -> None:
    """logits [B, V] (V <= 32 W) set to -inf where the bit of `words` [B, W] int32 is clear."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = ((words.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :logits.shape[1]]
    logits.masked_fill_(bits == 0, float("-inf"))
