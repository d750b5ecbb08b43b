"""Moving KV between the device pool and the hierarchical cache's host pool
(`TierCopier`, which the file tier also uses for its staging arenas), and the row gathers /
scatters its CPU path is made of (`gather_rows`, `scatter_rows`: rows [layers, 2 (K, V), n,
heads, dim]).

On a GPU machine the copies between the tiers are one kernel each that reads or writes the
page-locked host pool directly (kv_copy_kernel.py); on the CPU they are plain gathers/scatters.

The host pool has the device pool's storage dtype (and scales), so the copies move raw bytes: an
fp8 pool's rows stay fp8 in every tier and in the file tier. PyTorch lacks index_copy_ for fp8
on the CPU, so fp8 rows are moved as uint8 views of the same bytes.
"""

from __future__ import annotations

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


class TierCopier:
    """Copies KV rows between the device pool and the host pool.

    On a GPU machine each copy is one kernel launch on the current stream (kv_copy_kernel.py:
    it reads or writes the page-locked host pool directly), so the copies are ordered with the
    forward passes like any kernel: a backup reads a node's rows after the forwards that wrote
    them and before a later step reuses its slots, a load lands before the prefill that reads
    it, and a host slot freed and handed out again is written after the copies that read it.
    The host never touches the host pool, so nothing needs draining or waiting for. On the CPU
    both pools are host memory and the copies are plain PyTorch gathers/scatters.

    Tried and dropped: the copies on a stream of their own, issued layer by layer before each
    forward, with each attention layer waiting for its own layer's event (so a prefill starts
    while later layers still load). On the H200 multi-turn benchmark it was slower (1.99x and
    2.13x HiCache on/off against 2.31x for this; probably the copies competing with the forward
    for the SMs, while a mostly-cached prefill is mostly loading and waits for them anyway).
    """

    def __init__(self, device_pool: KVPool, host_pool: KVPool):
        if (host_pool.num_layers, host_pool.num_kv_heads, host_pool.head_dim, host_pool.dtype) \
                != (device_pool.num_layers, device_pool.num_kv_heads, device_pool.head_dim,
                    device_pool.dtype):
            raise ValueError("the host KV pool must have the device pool's layout and dtype")
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.on_gpu = device_pool.device.type == "cuda"
        if self.on_gpu:
            from radixlm.mem_cache import kv_copy_kernel as kernel
            self._kernel = kernel
            self.row_bytes = device_pool.num_kv_heads * device_pool.head_dim * \
                device_pool.dtype.itemsize
            self.word = kernel.word_size(self.row_bytes)
            self._device = kernel.PoolAddressing(device_pool.buffers(), self.word,
                                                 device_pool.device)
            self._host = kernel.PoolAddressing(host_pool.buffers(), self.word,
                                               device_pool.device)
            # Compile both directions now, not in the middle of serving: copy the padding
            # slot (0, never handed out) onto itself.
            pad = torch.zeros(1, dtype=torch.int64, device=device_pool.device)
            self.to_host(pad, pad)
            self.to_device(pad, pad)

    def to_host(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """host_pool[host_slots] = device_pool[device_slots]."""
        self._copy(self.device_pool, device_slots, self.host_pool, host_slots, to_host=True)

    def to_device(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """device_pool[device_slots] = host_pool[host_slots]."""
        self._copy(self.host_pool, host_slots, self.device_pool, device_slots, to_host=False)

    def _copy(self, src: KVPool, src_slots: torch.Tensor, dst: KVPool, dst_slots: torch.Tensor,
              to_host: bool) -> None:
        if not self.on_gpu:
            scatter_rows(dst, dst_slots, gather_rows(src, src_slots))
            return
        src_addr, dst_addr = (self._device, self._host) if to_host else (self._host, self._device)
        self._kernel.copy_rows(src_addr, self._on_device(src_slots), dst_addr,
                               self._on_device(dst_slots), self.row_bytes, self.word)

    def synchronize(self) -> None:
        """Wait on the host until every copy is done (before the host reads a pool)."""
        if self.on_gpu:
            torch.cuda.current_stream(self.device_pool.device).synchronize()

    def _on_device(self, slots: torch.Tensor) -> torch.Tensor:
        if slots.device != self.device_pool.device:
            # A copy from pageable host memory makes the host wait for the GPU; the hierarchical
            # cache keeps its slot numbers on the GPU for that reason.
            slots = slots.to(self.device_pool.device)
        return slots
