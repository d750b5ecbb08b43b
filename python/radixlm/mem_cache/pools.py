"""The two memory pools: request slots -> token positions, and the per-layer K/V tensors.

They only hold tensors. Who owns which slot is the allocator's job (allocator.py), which prefix
lives where is the radix cache's job (radix_cache.py).
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch

from radixlm.core.kv_quant import is_fp8, is_valid_scale, quantize


class ReqToTokenPool:
    """A [max_running_requests, max_context_len] int32 table: row r lists the KV slot of every
    token of the request that holds request slot r."""

    def __init__(self, size: int, max_context_len: int, device: torch.device | str):
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self._flat = self.req_to_token.view(-1)
        self._free: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, idx: int) -> None:
        assert idx not in self._free, f"request slot {idx} freed twice"
        self._free.append(idx)

    def write(self, idx: int, start: int, locs: torch.Tensor) -> None:
        self.req_to_token[idx, start:start + len(locs)] = locs.to(torch.int32)

    def flat_index(self, rows: list[int], positions: list[int]) -> list[int]:
        """Where (rows[i], positions[i]) lies in the table read as one row (`write_flat`)."""
        width = self.max_context_len
        return [r * width + p for r, p in zip(rows, positions)]

    def write_flat(self, flat_idx: torch.Tensor, locs: torch.Tensor) -> None:
        """Set the entries `flat_index` named: a 1-D index_put, which takes about half the host
        time of a 2-D one (a decode step does this while the GPU may be waiting)."""
        self._flat[flat_idx] = locs.to(torch.int32)

    def clear(self) -> None:
        self._free = list(range(self.size))


class PinnedHostMemory:
    """Page-locks an existing CPU tensor's memory and maps it for the GPU (cudaHostRegister),
    for as long as this object lives.

    Not `Tensor.pin_memory()`: that copies into memory from PyTorch's pinned allocator, which
    rounds every block up to a power of two (a 40 GiB host pool would lock 64 GiB)."""

    _PORTABLE_AND_MAPPED = 1 | 2    # cudaHostRegisterPortable | cudaHostRegisterMapped

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self._ptr = tensor.data_ptr()
        nbytes = tensor.numel() * tensor.element_size()
        err = int(torch.cuda.cudart().cudaHostRegister(self._ptr, nbytes,
                                                       self._PORTABLE_AND_MAPPED))
        if err != 0:
            raise RuntimeError(f"could not page-lock {nbytes / 2 ** 30:.1f} GiB of host memory "
                               f"for the hierarchical KV cache (CUDA error {err}); try a "
                               f"smaller --hicache-size / --hicache-ratio")
        self._finalizer = weakref.finalize(self, _unregister, self._ptr)


def _per_layer(scale: float | Sequence[float], num_layers: int, which: str) -> list[float]:
    scales = [float(scale)] * num_layers if isinstance(scale, (int, float)) else \
        [float(x) for x in scale]
    if len(scales) != num_layers:
        raise ValueError(f"{len(scales)} {which} scales for a pool of {num_layers} layers")
    if not all(map(is_valid_scale, scales)):
        raise ValueError(f"KV scales must be positive finite numbers, got {which} {scales}")
    return scales


def _unregister(ptr: int) -> None:
    torch.cuda.synchronize()     # no kernel may still be reading or writing it
    torch.cuda.cudart().cudaHostUnregister(ptr)


class KVPool:
    """Per-layer K and V tensors of shape [num_slots, num_kv_heads, head_dim].

    Slot 0 is never handed out by the allocator: padded positions (CUDA graphs, dummy requests)
    write their K/V there, so they can't clobber a real token.

    `dtype` is the storage dtype, which need not be the model's (compute) dtype: with
    `--kv-cache-dtype fp8_e4m3` it is torch.float8_e4m3fn, one byte per value, so the same
    memory holds twice the tokens of a 16-bit pool. An fp8 pool stores K / k_scale and
    V / v_scale (one scale per layer for each, plain floats fixed at build time so that CUDA
    graphs capture them as constants) and whoever reads it multiplies by the layer's scales
    (`scales`, `dequantize`; the Triton kernels fold them into their arithmetic). The scales are
    1.0 unless given (the checkpoint's, core/kv_quant.py: CheckpointKVScales); values beyond
    +-448 * scale are clamped, not turned into NaN.
    """

    is_latent = False       # MLAKVPool: one latent row per token instead of K and V

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, pin_memory: bool = False,
                 k_scale: float | Sequence[float] = 1.0, v_scale: float | Sequence[float] = 1.0,
                 single_allocation: bool = False):
        """`k_scale` / `v_scale`: one scale for every layer, or one per layer.
        `single_allocation`: all buffers are views of one tensor [2 * layers, slots, heads,
        dim] (K0, V0, K1, ...), so one mapping covers them (the hierarchical cache's host tier,
        which the GPU addresses directly: mem_cache/kv_copy_kernel.py). `pin_memory` (with
        it): that tensor is page-locked and mapped into the GPU's address space."""
        self.k_scales = _per_layer(k_scale, num_layers, "k")
        self.v_scales = _per_layer(v_scale, num_layers, "v")
        if not is_fp8(dtype) and {*self.k_scales, *self.v_scales} != {1.0}:
            # Only fp8 stores scaled values (quantize, the store kernel); a scale on another
            # dtype would be applied by the readers alone.
            raise ValueError(f"KV scales apply to fp8 pools only, not {dtype}")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        self._pinned: PinnedHostMemory | None = None
        if single_allocation:
            whole = torch.zeros((2 * num_layers, *shape), dtype=dtype, device=device)
            if pin_memory:
                self._pinned = PinnedHostMemory(whole)
            self.k_buffers = [whole[2 * i] for i in range(num_layers)]
            self.v_buffers = [whole[2 * i + 1] for i in range(num_layers)]
        else:
            if pin_memory:
                raise ValueError("pin_memory needs single_allocation")
            self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device)
                              for _ in range(num_layers)]
            self.v_buffers = [torch.zeros(shape, dtype=dtype, device=device)
                              for _ in range(num_layers)]
        self.v_head_dim = head_dim

    def buffers(self) -> list[torch.Tensor]:
        """Every layer's K and V buffer, in the order K0, V0, K1, V1, ..."""
        return [b for pair in zip(self.k_buffers, self.v_buffers) for b in pair]

    @property
    def is_fp8(self) -> bool:
        return is_fp8(self.dtype)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.k_buffers, *self.v_buffers))

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one token takes over all layers, K and V stored in `dtype` (the storage dtype:
        1 per value for fp8)."""
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize

    def scales(self, layer_id: int) -> tuple[float, float]:
        """The layer's (k_scale, v_scale): what its stored values are multiplied by."""
        return self.k_scales[layer_id], self.v_scales[layer_id]

    def set_kv(self, layer_id: int, locs: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffers[layer_id][locs] = quantize(k, self.k_scales[layer_id], self.dtype)
        self.v_buffers[layer_id][locs] = quantize(v, self.v_scales[layer_id], self.dtype)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's buffers as stored (fp8 pools: scaled; see `dequantize`)."""
        return self.k_buffers[layer_id], self.v_buffers[layer_id]


class MLAKVPool:
    """Multi-head latent attention's cache: one tensor per layer of shape [num_slots, 1,
    kv_lora_rank + qk_rope_head_dim], each token's compressed latent followed by its rotated
    key part. It is both K (the whole row) and V (the first kv_lora_rank values), so V is a
    view, stored once.

    It answers to what the attention backends and the KV manager use of KVPool
    (`get_kv`, `set_kv`, `num_slots`, `nbytes`, ...). The hierarchical cache, which copies K
    and V rows between tiers, does not take it yet (the server refuses the combination).
    """

    is_latent = True
    is_fp8 = False      # the runner refuses --kv-cache-dtype fp8_e4m3 for MLA

    def __init__(self, num_slots: int, num_layers: int, latent_dim: int, v_head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = 1
        self.head_dim = latent_dim
        self.v_head_dim = v_head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.k_buffers = [torch.zeros((num_slots, 1, latent_dim), dtype=dtype, device=device)
                          for _ in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.k_buffers)

    def set_kv(self, layer_id: int, locs: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor | None = None) -> None:
        """Store each token's latent row `k` [T, 1, latent_dim]; `v` is its prefix, ignored."""
        self.k_buffers[layer_id][locs] = k.to(self.dtype)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.k_buffers[layer_id]
        return buf, buf[..., :self.v_head_dim]

    def scales(self, layer_id: int) -> tuple[float, float]:
        """Never fp8: readers that apply KVPool's scales find 1.0."""
        return 1.0, 1.0
