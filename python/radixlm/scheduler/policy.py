"""Orders the waiting queue before admission (--schedule-policy).

- fcfs: arrival order.
- lpm: longest cached prefix first, so requests that reuse the cache run while it is warm. It
  costs a tree lookup per waiting request, so past LPM_FALLBACK_QUEUE_LEN it falls back to fcfs.
- dfs-weight: walk the radix tree depth-first, heavier subtrees (more waiting requests) first,
  so requests sharing a prefix are admitted together.
- lof: longest output (max_new_tokens) first.
- random: shuffled.
"""

from __future__ import annotations

import random
from collections import defaultdict

from radixlm.scheduler.request import Req

LPM_FALLBACK_QUEUE_LEN = 128


class SchedulePolicy:
    def __init__(self, name: str, prefix_cache, seed: int = 0):
        self.name = name
        self.prefix_cache = prefix_cache
        self.rng = random.Random(seed)

    def order(self, waiting: list[Req]) -> list[Req]:
        name = self.name
        if name in ("lpm", "dfs-weight") and len(waiting) > LPM_FALLBACK_QUEUE_LEN:
            name = "fcfs"
        if name == "fcfs":
            return sorted(waiting, key=lambda r: r.arrival)
        if name == "lof":
            return sorted(waiting, key=lambda r: (-r.max_new_tokens, r.arrival))
        if name == "random":
            out = list(waiting)
            self.rng.shuffle(out)
            return out
        # peek, not match: sorting must not split nodes or refresh the LRU order of prefixes
        # whose requests only wait.
        peeks = {id(r): self.prefix_cache.peek_prefix(r.fill_ids[:r.max_prefix_match()])
                 for r in waiting}
        if name == "lpm":
            return sorted(waiting, key=lambda r: (-peeks[id(r)][0], r.arrival))
        return self._dfs_weight(waiting, {k: node for k, (_, node) in peeks.items()})

    def _dfs_weight(self, waiting: list[Req], last_nodes: dict) -> list[Req]:
        root = self.prefix_cache.peek_prefix([])[1]
        weight: dict[int, int] = defaultdict(int)
        at_node: dict[int, list[Req]] = defaultdict(list)
        for r in sorted(waiting, key=lambda r: r.arrival):
            node = last_nodes[id(r)]
            at_node[id(node)].append(r)
            while node is not None:
                weight[id(node)] += 1
                node = node.parent
        out: list[Req] = []
        stack = [root]
        while stack:
            node = stack.pop()
            out.extend(at_node[id(node)])
            kids = [c for c in node.children.values() if weight[id(c)] > 0]
            # Push lightest first so the heaviest subtree is visited next.
            stack.extend(sorted(kids, key=lambda c: weight[id(c)]))
        return out
