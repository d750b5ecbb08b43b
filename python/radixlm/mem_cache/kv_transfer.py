"""Moving KV between the device pool and the hierarchical cache's host pool without making the
host wait for the GPU.

- Device -> host (`HostWriter`): the rows are gathered on the device into one block
  [layers, 2 (K, V), n, heads, dim] and copied into pinned staging memory by one asynchronous
  copy queued on the current stream, after the kernels that wrote them, so the device slots can
  be reused at once (later writes to them are queued after the copy). The rows are scattered
  into the host pool on the host once the copy is done: `drain()` does it for finished copies,
  `drain(wait=True)` for all (before anything reads the host pool).
- Host -> device (`load_to_device`): the host rows are gathered into pinned staging memory, copied
  to the device asynchronously, and scattered into the device pool by kernels on the same
  stream, so the prefill that follows sees them.

On the CPU both pools are host memory and the copies are plain.

The host pool has the device pool's storage dtype (and scales), so the copies move raw bytes: an
fp8 pool's rows stay fp8 in every tier and in the file tier. PyTorch lacks index_copy_ for fp8
on the CPU, so fp8 rows are moved as uint8 views of the same bytes.
"""

from __future__ import annotations

from collections import deque

import torch

from radixlm.core.kv_quant import is_fp8
from radixlm.mem_cache.pools import KVPool


def rows_shape(pool: KVPool, n: int) -> tuple[int, ...]:
    """The shape of n tokens' K and V in every layer: [layers, 2 (K, V), n, heads, dim]."""
    return (pool.num_layers, 2, n, pool.num_kv_heads, pool.head_dim)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """`t` itself, or for fp8 the same bytes as uint8 (copies need no arithmetic)."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def gather_rows(pool: KVPool, slots: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """rows_shape(pool, len(slots)) rows of `pool` (into `out` when given), in its dtype."""
    if out is None:
        out = torch.empty(rows_shape(pool, len(slots)), dtype=pool.dtype, device=pool.device)
    raw_out = _raw(out)
    for layer in range(pool.num_layers):
        torch.index_select(_raw(pool.k_buffers[layer]), 0, slots, out=raw_out[layer, 0])
        torch.index_select(_raw(pool.v_buffers[layer]), 0, slots, out=raw_out[layer, 1])
    return out


def scatter_rows(pool: KVPool, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """pool[slots] = rows, rows as gather_rows returns them (the pool's dtype)."""
    if rows.dtype != pool.dtype:
        raise TypeError(f"KV rows of {rows.dtype} copied into a {pool.dtype} pool")
    raw_rows = _raw(rows)
    for layer in range(pool.num_layers):
        _raw(pool.k_buffers[layer]).index_copy_(0, slots, raw_rows[layer, 0])
        _raw(pool.v_buffers[layer]).index_copy_(0, slots, raw_rows[layer, 1])


class HostWriter:
    def __init__(self, device_pool: KVPool, host_pool: KVPool):
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.pending: deque[tuple[torch.cuda.Event, torch.Tensor, torch.Tensor]] = deque()

    def write(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """host_pool[host_slots] = device_pool[device_slots], finished later by drain()."""
        host_slots = host_slots.to("cpu")
        if self.device_pool.device.type != "cuda":
            scatter_rows(self.host_pool, host_slots, gather_rows(self.device_pool, device_slots))
            return
        rows = gather_rows(self.device_pool, device_slots.to(self.device_pool.device))
        staging = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        staging.copy_(rows, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.pending.append((done, staging, host_slots))

    def drain(self, wait: bool = False) -> None:
        """Scatter finished copies into the host pool, in order (all of them with wait)."""
        while self.pending:
            done, staging, host_slots = self.pending[0]
            if not wait and not done.query():
                return
            done.synchronize()
            scatter_rows(self.host_pool, host_slots, staging)
            self.pending.popleft()


def load_to_device(host_pool: KVPool, host_slots: torch.Tensor, device_pool: KVPool,
                   device_slots: torch.Tensor) -> None:
    """device_pool[device_slots] = host_pool[host_slots], queued on the current stream."""
    host_slots = host_slots.to("cpu")
    if device_pool.device.type != "cuda":
        scatter_rows(device_pool, device_slots, gather_rows(host_pool, host_slots))
        return
    staging = torch.empty(rows_shape(host_pool, len(host_slots)), dtype=host_pool.dtype,
                          pin_memory=True)
    gather_rows(host_pool, host_slots, out=staging)
    # The caching host allocator keeps `staging` alive until the copy has run.
    rows = staging.to(device_pool.device, non_blocking=True)
    scatter_rows(device_pool, device_slots.to(device_pool.device), rows)
