"""FusedMoE: one layer's routed experts, stacked into two tensors at load time.

    w13_weight [E, 2I/tp, H]   every expert's gate rows then up rows (this rank's slice)
    w2_weight  [E, H, I/tp]    every expert's down projection (this rank's columns)

Tensor parallelism splits each expert like a dense MLP: gate/up by output rows, down by input
columns, so each rank computes a partial sum of every token's output; the caller all-reduces
once (together with the shared experts' partial sums, see models/moe_block.py).

Checkpoints store each expert separately (`experts.<e>.gate_proj.weight`, Mixtral's
`experts.<e>.w1.weight`, ...); `expert_param_and_shard` maps those names onto the stacked
parameters and the shard their loader fills.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.moe.experts import fused_experts

# Checkpoint projection name -> (stacked parameter, which part: 0 gate, 1 up, None down).
_EXPERT_PARTS = {
    "gate_proj": ("w13_weight", 0), "w1": ("w13_weight", 0),
    "up_proj": ("w13_weight", 1), "w3": ("w13_weight", 1),
    "down_proj": ("w2_weight", None), "w2": ("w2_weight", None),
}
_EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def expert_param_and_shard(name: str) -> tuple[str, tuple[int, int | None]] | None:
    """'layers.3.mlp.experts.7.up_proj.weight' -> ('layers.3.mlp.experts.w13_weight', (7, 1));
    None for a tensor that is not a routed expert's."""
    m = _EXPERT_NAME.match(name)
    if m is None or m.group(3) not in _EXPERT_PARTS:
        return None
    param, part = _EXPERT_PARTS[m.group(3)]
    return f"{m.group(1)}.{param}", (int(m.group(2)), part)


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 tp: TPGroup = SINGLE):
        super().__init__()
        self.num_experts = num_experts
        self.tp = tp
        self.shard = tp.shard(intermediate_size, "moe_intermediate_size")
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * self.shard, hidden_size),
                                       requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, self.shard),
                                      requires_grad=False)
        for p in (self.w13_weight, self.w2_weight):
            p.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        # Which (expert, gate / up / down) the checkpoint filled: one loaded tensor must not
        # pass for the whole stack (the rest would stay uninitialised memory).
        self._filled = [[False] * 3 for _ in range(num_experts)]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard: tuple[int, int | None]) -> None:
        expert, part = shard
        if not 0 <= expert < self.num_experts:
            raise KeyError(f"checkpoint has expert {expert}; the config says "
                           f"{self.num_experts} experts")
        hidden = self.w2_weight.shape[1]
        full = self.shard * self.tp.size
        want = (hidden, full) if part is None else (full, hidden)
        if tuple(loaded.shape) != want:
            raise ValueError(f"expert {expert}: checkpoint tensor of shape "
                             f"{tuple(loaded.shape)}, expected {want}")
        mine = slice(self.tp.rank * self.shard, (self.tp.rank + 1) * self.shard)
        if part is None:        # down: [H, I] -> this rank's columns
            param.data[expert].copy_(loaded[:, mine])
        else:                   # gate (0) or up (1): [I, H] -> this rank's rows
            param.data[expert, part * self.shard:(part + 1) * self.shard].copy_(loaded[mine])
        self._filled[expert][2 if part is None else part] = True

    def missing_weights(self) -> list[str]:
        """The expert matrices no checkpoint tensor filled (checked after loading)."""
        names = ("gate_proj", "up_proj", "down_proj")
        return [f"{e}.{names[i]}" for e, parts in enumerate(self._filled)
                for i, done in enumerate(parts) if not done]

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                add: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's partial sum of the routed experts' output (not yet all-reduced), plus
        `add` when given."""
        return fused_experts(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, add)
