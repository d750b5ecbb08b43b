"""Host-to-device copies that do not stall the GPU queue.

A copy from ordinary (pageable) host memory waits for every kernel already queued on the stream
before it starts, so the scheduler would block on the running step while building the next one.
Copies staged through pinned memory with non_blocking=True are queued like kernels instead (the
caching host allocator keeps the pinned block alive until the copy has run).
"""

from __future__ import annotations

from typing import Sequence

import torch


def to_device(values: Sequence | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype, device=device)
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    return host.to(dtype).pin_memory().to(device, non_blocking=True)
