"""The n-gram drafter (--speculative-algorithm NGRAM): a request's own text predicts itself.

When the last w tokens of a request (prompt + output) occurred earlier in it, the tokens that
followed that occurrence are proposed as the continuation: an edit, a summary quoting its
source, code rewritten with small changes all repeat long runs of their input. The longest
window from max_window down to min_window that matches wins; among occurrences, the latest.

`NgramIndex` keeps, for every window size, the end of the latest occurrence of each n-gram, and
is updated with the tokens appended since the last proposal, so a proposal costs a few dict
lookups, not a scan of the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    min_window: int
    max_window: int
    # window -> n-gram -> end (exclusive) of its latest occurrence that is not the text's end
    _latest: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    _indexed_to: int = 0     # n-grams ending at or before this position are indexed

    def propose(self, tokens: list[int], max_tokens: int) -> list[int]:
        """Up to max_tokens tokens that followed the latest earlier occurrence of the longest
        matching suffix of `tokens` (empty when no window matches)."""
        if max_tokens <= 0:
            return []
        end = len(tokens)
        self._index(tokens, end - 1)
        for w in range(min(self.max_window, end - 1), self.min_window - 1, -1):
            start = self._latest.get(w, {}).get(tuple(tokens[end - w:]))
            if start is not None:
                return tokens[start:start + max_tokens]
        return []

    def _index(self, tokens: list[int], upto: int) -> None:
        """Index the n-grams ending at positions (_indexed_to, upto] (ends are exclusive)."""
        for e in range(self._indexed_to + 1, upto + 1):
            for w in range(self.min_window, min(self.max_window, e) + 1):
                self._latest.setdefault(w, {})[tuple(tokens[e - w:e])] = e
        self._indexed_to = max(self._indexed_to, upto)
