"""Linear layers that know their tensor-parallel shard.

Column-parallel layers split the output dimension across ranks, row-parallel layers split the
input dimension and all-reduce the result. Each parameter carries a `weight_loader` that takes a
full checkpoint tensor and copies this rank's shard into place (for fused layers, into the right
slice: q/k/v into qkv_proj, gate/up into gate_up_proj).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup


def _param(shape: tuple[int, ...], loader: Callable) -> nn.Parameter:
    p = nn.Parameter(torch.empty(shape), requires_grad=False)
    p.weight_loader = loader  # type: ignore[attr-defined]
    return p


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b) with W's output rows split across ranks; each rank keeps its slice.

    `output_sizes` lists the logical sub-matrices fused into this layer (one entry when unfused);
    each is sharded separately so a rank holds [its part of A, its part of B, ...].
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 tp: TPGroup = SINGLE):
        super().__init__()
        self.tp = tp
        self.input_size = input_size
        self.shard_sizes = [tp.shard(s, "output size") for s in output_sizes]
        self.shard_offsets = [sum(self.shard_sizes[:i]) for i in range(len(self.shard_sizes))]
        out = sum(self.shard_sizes)
        self.weight = _param((out, input_size), self.weight_loader)
        self.bias = _param((out,), self.weight_loader) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:
        size, offset = self.shard_sizes[shard_id], self.shard_offsets[shard_id]
        src = loaded.narrow(0, self.tp.rank * size, size)
        param.data.narrow(0, offset, size).copy_(src)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices with the same input fused into one matmul (gate_up)."""


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused; shard ids 'q', 'k', 'v'."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, tp: TPGroup = SINGLE):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim,
                                       num_kv_heads * head_dim], bias=bias, tp=tp)
        self.q_size, self.kv_size = self.shard_sizes[0], self.shard_sizes[1]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str = 0) -> None:
        idx = {"q": 0, "k": 1, "v": 2}.get(shard_id, shard_id)  # type: ignore[arg-type]
        super().weight_loader(param, loaded, idx)  # type: ignore[arg-type]


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's input columns split across ranks; partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPGroup = SINGLE):
        super().__init__()
        self.tp = tp
        self.input_shard = tp.shard(input_size, "input size")
        self.weight = _param((output_size, self.input_shard), self.weight_loader)
        self.bias = _param((output_size,), self._bias_loader) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded.narrow(1, self.tp.rank * self.input_shard, self.input_shard))

    @staticmethod
    def _bias_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias
