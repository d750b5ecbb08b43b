"""A draft model's tree of drafts (--speculative-algorithm STANDALONE --speculative-eagle-topk K,
K > 1), for plain greedy requests.

Each of --speculative-num-steps draft steps feeds the frontier (at first the request's last
token alone) as decode rows, each seeing its ancestors only (ForwardBatch.tree_start /
tree_mask, as the target's verify step), and gives every fed node its K most likely children.
A candidate's score is the sum of its path's log-probabilities under the draft model; the K
best new candidates of a request are fed in the next step (their KV goes to scratch slots,
freed at the end like a chain's). The tree verified is the ks[i] best candidates over all
steps: a child never scores above its parent, so the best ones always include their
ancestors. Greedy verification keeps the path the target's argmax follows, so every top-1
chain of a draft equal to the target is kept, and the other branches give a weaker draft a
second and third guess at each depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.core.forward_batch import ForwardBatch, ForwardMode
from radixlm.scheduler.request import Req
from radixlm.speculative.ngram import DraftTree
from radixlm.utils.device import to_device

if TYPE_CHECKING:
    from radixlm.mem_cache.kv_cache_manager import KVCacheManager
    from radixlm.model_executor.model_runner import ModelRunner


@dataclass
class _Candidate:
    score: float          # sum of the path's log-probabilities (root: 0)
    parent: int           # candidate index (root: -1)
    token: int            # (root: -1, its token is on the device)
    depth: int
    fed_at: int = -1      # scratch position (relative to the request's start) once fed
    bits: int = 0         # the fed positions it sees: itself and its ancestors


class _RequestTree:
    """One request's candidates while the draft model expands them."""

    def __init__(self, start: int, pool_row: int):
        self.start, self.pool_row = start, pool_row
        self.cands = [_Candidate(0.0, -1, -1, 0, fed_at=0, bits=1)]
        self.frontier = [0]
        self.fed = 1          # scratch positions taken (the root's first)

    def feed(self, c: int) -> None:
        cand = self.cands[c]
        cand.fed_at = self.fed
        cand.bits = self.cands[cand.parent].bits | (1 << self.fed)
        self.fed += 1

    def best(self, n: int) -> DraftTree:
        """The n best candidates as a tree, parents before children."""
        order = sorted(range(1, len(self.cands)),
                       key=lambda c: (-self.cands[c].score, self.cands[c].depth, c))
        chosen = sorted(order[:n])          # creation order: a parent before its children
        index = {-1: None, 0: 0} | {c: j for j, c in enumerate(chosen, start=1)}
        return DraftTree([self.cands[c].token for c in chosen],
                         [index[self.cands[c].parent] for c in chosen])


def forward_on_scratch(runner: "ModelRunner", kv: "KVCacheManager", tokens: torch.Tensor,
                       pool_rows: torch.Tensor, pos_t: torch.Tensor, positions: list[int],
                       rope: torch.Tensor | None = None, tree_start: torch.Tensor | None = None,
                       tree_mask: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft step: rows feeding `tokens` at KV positions `positions` of their requests'
    table rows (fed at text positions `rope`, default the same), their KV in fresh scratch
    slots; returns (logits, the slots), which the caller frees."""
    locs = kv.alloc_decode(pool_rows, pos_t, positions)
    kv.req_to_token_pool.req_to_token[pool_rows, pos_t] = locs.to(torch.int32)
    n = len(positions)
    fb = ForwardBatch(ForwardMode.DECODE, n, tokens, pos_t if rope is None else rope, locs,
                      pool_rows, pos_t + 1, [p + 1 for p in positions], positions, [1] * n,
                      tree_start=tree_start, tree_mask=tree_mask)
    return runner.forward(fb).next_token_logits, locs


def propose_tree(runner: "ModelRunner", kv: "KVCacheManager", last_token_ids: torch.Tensor,
                 steps: int, topk: int, reqs: list[Req], ks: list[int],
                 active: list[int]) -> list[list[int] | DraftTree]:
    """Trees of up to ks[i] drafts for reqs[i], i in `active` (every one plain greedy; each
    request's last token is in last_token_ids, the target's): `steps` draft steps of the
    draft model `runner`, `topk` candidates a node; [] for the requests not active."""
    device = last_token_ids.device
    table = kv.req_to_token_pool.req_to_token
    trees = {i: _RequestTree(reqs[i].kv_allocated_len, reqs[i].req_pool_idx) for i in active}
    root_rows = to_device([trees[i].pool_row for i in active], torch.int64, device)
    root_tokens = last_token_ids[root_rows]
    scratch = []
    for step in range(steps):
        rows = [(i, c) for i in active for c in trees[i].frontier]
        if not rows:
            break
        cands = [trees[i].cands[c] for i, c in rows]
        positions = [trees[i].start + cand.fed_at for (i, _), cand in zip(rows, cands)]
        n = len(rows)
        packed = to_device([trees[i].pool_row for i, _ in rows] + positions
                           + [trees[i].start + cand.depth for (i, _), cand in zip(rows, cands)]
                           + [trees[i].start for i, _ in rows] + [cand.bits for cand in cands]
                           + [cand.token for cand in cands], torch.int64, device)
        pool_rows, pos_t, rope, tree_start, tree_mask, fed_tokens = packed.view(6, n)
        logits, locs = forward_on_scratch(runner, kv, root_tokens if step == 0 else fed_tokens,
                                          pool_rows, pos_t, positions, rope, tree_start,
                                          tree_mask)
        scratch.append(locs)
        top = torch.log_softmax(logits.float(), -1).topk(topk, dim=-1)
        values, tokens = top.values.tolist(), top.indices.tolist()     # one wait a step
        new: dict[int, list[int]] = {i: [] for i in active}
        for row, (i, c) in enumerate(rows):
            tree, parent = trees[i], cands[row]
            for value, token in zip(values[row], tokens[row]):
                new[i].append(len(tree.cands))
                tree.cands.append(_Candidate(parent.score + value, c, token, parent.depth + 1))
        for i in active:
            tree = trees[i]
            tree.frontier = []
            if step + 1 < steps:      # the best new ones are fed next
                # ... unless their children could not be verified: a tree of ks[i] nodes
                # holds no node deeper than ks[i] (which also keeps positions inside the
                # request's context), and the scratch stays inside its table row.
                best = sorted((c for c in new[i] if tree.cands[c].depth < ks[i]),
                              key=lambda c: -tree.cands[c].score)[:topk]
                for c in sorted(best):
                    if tree.start + tree.fed >= table.shape[1]:
                        break
                    tree.feed(c)
                    tree.frontier.append(c)
    # The verify step allocates its own slots (and its mirror writes the draft KV there).
    kv.allocator.free(torch.cat(scratch))
    out: list[list[int] | DraftTree] = [[] for _ in reqs]
    for i in active:
        out[i] = trees[i].best(ks[i])
    return out
