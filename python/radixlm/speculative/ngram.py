"""The n-gram drafter (--speculative-algorithm NGRAM): a request's own text predicts itself.

When the last w tokens of a request (prompt + output) occurred earlier in it, the tokens that
followed that occurrence are proposed as the continuation: an edit, a summary quoting its
source, code rewritten with small changes all repeat long runs of their input. The longest
window from max_window down to min_window that matches wins; among occurrences, the latest.

With a breadth above 1 (--speculative-ngram-max-bfs-breadth) the proposal is a tree instead of
a chain: the continuations of several occurrences (longest window first, latest first), merged
where they agree and branching where they differ, so that a verify step can try the second-best
continuation where the best one turns out wrong (`DraftTree`, `weighted_tree`).

`NgramIndex` keeps the ends of the latest occurrences of each n-gram (a trie over the text read
backwards), and is updated with the tokens appended since the last proposal, so a proposal
costs a few dict lookups, not a scan of the text.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class DraftTree:
    """Draft tokens as a tree under the request's last token (node 0, the root). Node j >= 1
    holds tokens[j - 1] and hangs under node parents[j - 1]; a parent always comes before its
    children. A chain has parents [0, 1, 2, ...]."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    @classmethod
    def chain(cls, tokens: list[int]) -> "DraftTree":
        return cls(list(tokens), list(range(len(tokens))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == j for j, p in enumerate(self.parents))

    def path(self, node: int) -> list[int]:
        """The nodes from the root's first child down to `node` (empty for the root)."""
        nodes = []
        while node > 0:
            nodes.append(node)
            node = self.parents[node - 1]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[j - 1] for j in self.path(node)]

    def depths(self) -> list[int]:
        return tree_depths(self.parents)

    def ancestor_bits(self) -> list[int]:
        return tree_ancestor_bits(self.parents)

    def main_chain(self) -> "DraftTree":
        """The first child at every level: the best candidate alone."""
        chain, node = [], 0
        for j, p in enumerate(self.parents, start=1):
            if p == node:
                chain.append(self.tokens[j - 1])
                node = j
        return DraftTree.chain(chain)



def tree_depths(parents: list[int]) -> list[int]:
    """Each node's depth, the root's (0) first (`DraftTree.parents`)."""
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return depth


def tree_ancestor_bits(parents: list[int]) -> list[int]:
    """For each node, the root's first, a bit mask of the nodes it sees: itself and its
    ancestors (bit j: node j)."""
    bits = [1]
    for j, p in enumerate(parents, start=1):
        bits.append(bits[p] | (1 << j))
    return bits


def weighted_tree(candidates: list[list[int]], max_nodes: int, min_breadth: int,
                  max_breadth: int) -> DraftTree:
    """Merge candidate continuations (best first) into a tree of at most max_nodes nodes.
    Candidate r weighs 2^-r, a node the weight of the candidates through it; heavier
    nodes are drafted first, a node only after its parent (a child never outweighs it) and
    while its parent has fewer children than its depth allows: max_breadth under the last
    token, one fewer per level below, never under min_breadth. A candidate's nodes outweigh
    every node only later candidates pass (2^-r > the sum of 2^-s over s > r): the tree is the
    chain the best candidate would have drafted alone, then the next candidates' branches
    where budget is left (a continuation cut short by the text's end), heavier where several
    candidates agree."""
    # The trie of every candidate: children by token, weight through each node.
    kids: list[dict[int, int]] = [{}]
    weight, token, depth, parent = [0.0], [-1], [0], [-1]
    for r, cont in enumerate(candidates):
        node = 0
        for t in cont:
            nxt = kids[node].get(t)
            if nxt is None:
                nxt = kids[node][t] = len(kids)
                kids.append({})
                weight.append(0.0)
                token.append(t)
                depth.append(depth[node] + 1)
                parent.append(node)
            weight[nxt] += 0.5 ** r
            node = nxt
    tree = DraftTree()
    index = {0: 0}           # trie node -> tree node
    taken = [0] * len(kids)  # children drafted under each trie node
    heap = [(-weight[c], c) for c in kids[0].values()]
    heapq.heapify(heap)
    while heap and len(tree) < max_nodes:
        _, node = heapq.heappop(heap)
        up = parent[node]
        if taken[up] >= max(min_breadth, max_breadth - depth[up]):
            continue
        taken[up] += 1
        tree.tokens.append(token[node])
        tree.parents.append(index[up])
        index[node] = len(tree)
        for c in kids[node].values():
            heapq.heappush(heap, (-weight[c], c))
    return tree


_ENDS = None   # a trie node's key for the ends stored there (token ids are ints)


@dataclass
class NgramIndex:
    """A trie of every n-gram of the text read backwards: the node reached from the root by
    tokens[e - 1], tokens[e - 2], ..., tokens[e - w] stands for the n-gram tokens[e - w:e] and
    keeps where its latest occurrences end (exclusive; with occurrences > 1, a list of the
    latest ends, oldest first). Indexing a token and matching the text's suffix are each one
    walk of at most max_window dict lookups: no n-gram is copied into a tuple, which made
    this index a visible part of a verify step's host time."""
    min_window: int
    max_window: int
    occurrences: int = 1   # ends kept per n-gram (the latest ones)
    _root: dict = field(default_factory=dict)
    _indexed_to: int = 0     # n-grams ending at or before this position are indexed

    def propose(self, tokens: list[int], max_tokens: int) -> list[int]:
        """Up to max_tokens tokens that followed the latest earlier occurrence of the longest
        matching suffix of `tokens` (empty when no window matches)."""
        found = self.candidates(tokens, max_tokens, 1)
        return found[0] if found else []

    def candidates(self, tokens: list[int], max_tokens: int, limit: int) -> list[list[int]]:
        """Up to `limit` continuations of up to max_tokens tokens, from different earlier
        occurrences of suffixes of `tokens`: longest window first, latest occurrence first."""
        if max_tokens <= 0:
            return []
        end = len(tokens)
        self._index(tokens, end - 1)
        matches = []          # the ends stored for each matching window, shortest first
        node = self._root
        for w in range(1, min(self.max_window, end - 1) + 1):
            node = node.get(tokens[end - w])
            if node is None:
                break
            if w >= self.min_window and _ENDS in node:
                matches.append(node[_ENDS])
        seen: set[int] = set()
        found: list[list[int]] = []
        for ends in reversed(matches):
            for start in reversed(ends) if isinstance(ends, list) else (ends,):
                if start in seen:      # (a longer window's match ends here too)
                    continue
                seen.add(start)
                found.append(tokens[start:start + max_tokens])
                if len(found) == limit:
                    return found
        return found

    def _index(self, tokens: list[int], upto: int) -> None:
        """Index the n-grams ending at positions (_indexed_to, upto] (ends are exclusive)."""
        keep, lo = self.occurrences, self.min_window
        for e in range(self._indexed_to + 1, upto + 1):
            node = self._root
            for w in range(1, min(self.max_window, e) + 1):
                tok = tokens[e - w]
                child = node.get(tok)
                if child is None:
                    child = node[tok] = {}
                node = child
                if w < lo:
                    continue
                if keep == 1:
                    node[_ENDS] = e
                    continue
                ends = node.get(_ENDS)
                if ends is None:
                    ends = node[_ENDS] = []
                ends.append(e)
                if len(ends) > keep:
                    del ends[0]
        self._indexed_to = max(self._indexed_to, upto)
