"""The tensor-parallel group handed to every layer.

Size 1 (the only size today) makes every collective a no-op; the layers are written against this
object so that tensor parallelism can arrive later without rewriting the models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        torch.distributed.all_reduce(x)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def shard(self, total: int, what: str) -> int:
        """This rank's share of a dimension that must divide evenly."""
        if total % self.size != 0:
            raise ValueError(f"{what} ({total}) is not divisible by tp size {self.size}")
        return total // self.size


SINGLE = TPGroup()
