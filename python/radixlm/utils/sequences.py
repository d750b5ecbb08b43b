"""Small helpers over token sequences."""

from __future__ import annotations

from typing import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
