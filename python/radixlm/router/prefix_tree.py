"""An approximate prefix tree of what one worker has been sent, for the cache-aware policy.

The router cannot see a worker's real radix cache, so it keeps its own guess: every request's
routing text (the prompt, or the chat messages flattened) is inserted into the tree of the
worker it was sent to. A new request's longest match in a worker's tree estimates how much of
its prompt that worker still holds. Keys are Python strings (characters of text; token ids are
mapped to one character each, see routing_key.py), stored as a radix tree: each edge holds a
run of characters. Trees are trimmed to a size in characters by evicting least recently used
leaves, as the worker's own cache would evict them.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Node:
    label: str = ""                                   # the edge from the parent into this node
    parent: "_Node | None" = None
    children: dict[str, "_Node"] = field(default_factory=dict)   # first character -> child
    last_access: float = 0.0


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n        # a[:lo] == b[:lo] and a[:hi] != b[:hi]: binary search on slices
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixTree:
    def __init__(self) -> None:
        self.root = _Node()
        self.size = 0          # characters stored (the sum of all edge labels)

    def match(self, key: str, touch: bool = True) -> int:
        """Length of the longest prefix of `key` in the tree (marks the path as used)."""
        node, pos, now = self.root, 0, time.monotonic()
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_prefix_len(child.label, key[pos:pos + len(child.label)])
            pos += n
            if touch:
                child.last_access = now
            if n < len(child.label):
                break
            node = child
        return pos

    def insert(self, key: str) -> None:
        node, pos, now = self.root, 0, time.monotonic()
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                node.children[key[pos]] = _Node(key[pos:], node, last_access=now)
                self.size += len(key) - pos
                return
            n = _common_prefix_len(child.label, key[pos:pos + len(child.label)])
            if n < len(child.label):   # split the edge: node -> mid -> child
                mid = _Node(child.label[:n], node, {child.label[n]: child}, now)
                child.label, child.parent = child.label[n:], mid
                node.children[key[pos]] = mid
                child = mid
            child.last_access = now
            node, pos = child, pos + n

    def evict(self, max_size: int) -> int:
        """Drop least recently used leaves until at most `max_size` characters remain (a leaf
        whose parent becomes a leaf is a candidate in turn). Returns the characters dropped."""
        if self.size <= max_size:
            return 0
        dropped = 0
        heap = [(n.last_access, id(n), n) for n in self._leaves()]
        heapq.heapify(heap)
        while heap and self.size > max_size:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.label[0]]
            self.size -= len(leaf.label)
            dropped += len(leaf.label)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return dropped

    def clear(self) -> None:
        self.root, self.size = _Node(), 0

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            else:
                out.append(n)
        return out
