"""FusedMoE: one layer's routed experts, stacked into two tensors at load time.

    w13_weight [E, 2I/tp, H]   every expert's gate rows then up rows (this rank's slice)
    w2_weight  [E, H, I/tp]    every expert's down projection (this rank's columns)

Tensor parallelism splits each expert like a dense MLP: gate/up by output rows, down by input
columns, so each rank computes a partial sum of every token's output; the caller all-reduces
once (together with the shared experts' partial sums, see models/moe_block.py).

Checkpoints store each expert separately (`experts.<e>.gate_proj.weight`, Mixtral's
`experts.<e>.w1.weight`, ...); `expert_param_and_shard` maps those names onto the stacked
parameters and the shard their loader fills.

FP8 experts (`--quantization fp8`, or an FP8 checkpoint as DeepSeek-V3 and Qwen3-*-FP8 ship)
are `Fp8Experts` (layers/moe/fp8_experts.py): FP8 stacks with their scales, multiplied by the
same grouped-GEMM kernels, which widen each weight tile in registers.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.moe.experts import Fp8ExpertScales, fused_experts

# Checkpoint projection name -> (stacked parameter, which part: 0 gate, 1 up, None down).
_EXPERT_PARTS = {
    "gate_proj": ("w13", 0), "w1": ("w13", 0),
    "up_proj": ("w13", 1), "w3": ("w13", 1),
    "down_proj": ("w2", None), "w2": ("w2", None),
}
# Checkpoint tensor kind -> our parameter's suffix. HF FP8 block checkpoints call the
# (multiplying) block scale weight_scale_inv, the others weight_scale: one parameter here.
_TENSOR_KINDS = {"weight": "_weight", "weight_scale": "_weight_scale",
                 "weight_scale_inv": "_weight_scale", "input_scale": "_input_scale"}
_EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.(\w+)$")

# Which checkpoint tensor of an expert's part the loader filled.
WEIGHT, SCALE = 0, 1


def expert_param_and_shard(name: str) -> tuple[str, tuple[int, int | None]] | None:
    """'layers.3.mlp.experts.7.up_proj.weight' -> ('layers.3.mlp.experts.w13_weight', (7, 1));
    '...experts.7.up_proj.weight_scale_inv' -> ('...experts.w13_weight_scale', (7, 1));
    None for a tensor that is not a routed expert's."""
    m = _EXPERT_NAME.match(name)
    if m is None or m.group(3) not in _EXPERT_PARTS or m.group(4) not in _TENSOR_KINDS:
        return None
    param, part = _EXPERT_PARTS[m.group(3)]
    return f"{m.group(1)}.{param}{_TENSOR_KINDS[m.group(4)]}", (int(m.group(2)), part)


class FusedMoE(nn.Module):
    """Routed experts in the model's dtype (layers/moe/build.py picks this class or its FP8
    subclass from the quantization the model is served with)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 tp: TPGroup = SINGLE, weight_dtype: torch.dtype | None = None):
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.tp = tp
        self.shard = tp.shard(intermediate_size, "moe_intermediate_size")
        self.w13_weight = self._stacked((num_experts, 2 * self.shard, hidden_size),
                                        weight_dtype)
        self.w2_weight = self._stacked((num_experts, hidden_size, self.shard), weight_dtype)
        # Which (expert, gate / up / down, tensor kind) the checkpoint filled: one loaded
        # tensor must not pass for the whole stack (the rest would stay uninitialised memory).
        self._filled: set[tuple[int, int, int]] = set()

    def _stacked(self, shape: tuple[int, ...], dtype: torch.dtype | None) -> nn.Parameter:
        p = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        p.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        return p

    def _rows(self) -> slice:
        """This rank's rows of an expert's gate or up matrix (its columns of down)."""
        return slice(self.tp.rank * self.shard, (self.tp.rank + 1) * self.shard)

    def _check_expert(self, expert: int) -> None:
        if not 0 <= expert < self.num_experts:
            raise KeyError(f"checkpoint has expert {expert}; the config says "
                           f"{self.num_experts} experts")

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard: tuple[int, int | None]) -> None:
        expert, part = shard
        self._check_expert(expert)
        full = self.shard * self.tp.size
        want = (self.hidden_size, full) if part is None else (full, self.hidden_size)
        if tuple(loaded.shape) != want:
            raise ValueError(f"expert {expert}: checkpoint tensor of shape "
                             f"{tuple(loaded.shape)}, expected {want}")
        if part is None:        # down: [H, I] -> this rank's columns
            param.data[expert].copy_(loaded[:, self._rows()])
        else:                   # gate (0) or up (1): [I, H] -> this rank's rows
            param.data[expert, part * self.shard:(part + 1) * self.shard].copy_(
                loaded[self._rows()])
        self._filled.add((expert, 2 if part is None else part, WEIGHT))

    def _kinds(self) -> tuple[int, ...]:
        """The checkpoint tensors each expert part needs."""
        return (WEIGHT,)

    def missing_weights(self) -> list[str]:
        """The expert matrices no checkpoint tensor filled (checked after loading)."""
        names = ("gate_proj", "up_proj", "down_proj")
        suffix = {WEIGHT: "", SCALE: " scale"}
        return [f"{e}.{names[i]}{suffix[kind]}" for e in range(self.num_experts)
                for i in range(3) for kind in self._kinds()
                if (e, i, kind) not in self._filled]

    def fp8_scales(self) -> Fp8ExpertScales | None:
        return None

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                add: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's partial sum of the routed experts' output (not yet all-reduced), plus
        `add` when given."""
        return fused_experts(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, add,
                             scales=self.fp8_scales())
