"""SiLU-and-multiply for gated MLPs: silu(gate) * up over a fused [gate | up] tensor."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
