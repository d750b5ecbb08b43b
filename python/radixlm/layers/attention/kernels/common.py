"""Helpers shared by the Triton attention kernels: the flattened KV index list and launch sizes.

The kernels never read `req_to_token` directly. Instead each batch flattens the rows it needs into
one int32 list (`kv_indices`, delimited by `kv_indptr`), so the kernels only see "request i's keys
are the slots kv_indices[kv_indptr[i]:kv_indptr[i+1]]". That keeps them independent of how slots
got there (page size, a future sliding window or speculative tree just builds a different list),
and the list lives in a tensor that a CUDA graph could own.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def block_dmodel(head_dim: int) -> int:
    # tl.dot needs every dimension >= 16; other head sizes (e.g. 80, 96) are padded to the next
    # power of two and masked, which costs the padded lanes' loads but nothing else.
    return max(16, next_pow2(head_dim))


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _max_shared_memory(device_index: int) -> int:
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(device_index)
        return int(props["max_shared_mem"])
    except Exception:  # unknown: callers then pick their smallest tiles
        return 0


def max_shared_memory(device: torch.device) -> int | None:
    """Bytes of shared memory one program may use on `device` (the opt-in maximum: 227 KiB on
    Hopper, 163 on A100, 99 on sm_86/sm_89); None on CPU (the interpreter has no limit)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _max_shared_memory(index)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (a small constant on CPU, where only the Triton
    interpreter runs and the number only shapes the split heuristic)."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return multiprocessor_count(index)


@triton.jit
def _gather_rows_kernel(
    req_to_token,          # [rows, max_ctx] int32
    stride_row,
    req_pool_indices,      # [B] int64: which row each request uses
    lens,                  # [B] int32/int64: how many leading entries of the row to take
    kv_indptr,             # [B + 1] int32: where request i's entries go in `out`
    out,                   # [sum(lens)] int32
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    n = tl.load(lens + b).to(tl.int32)  # lens may be int64 (ForwardBatch.seq_lens)
    dst = tl.load(kv_indptr + b)
    src_ptr = req_to_token + row * stride_row
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + dst + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def build_kv_indices(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     lens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten `req_to_token[req_pool_indices[i], :lens[i]]` for every request.

    `lens` is a device tensor and `total` (= sum(lens)) comes from the host lists, so building the
    list needs no device-to-host copy. Returns (kv_indptr [B+1] int32, kv_indices [total] int32).
    """
    bs = req_pool_indices.numel()
    device = req_to_token.device
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    kv_indptr[1:].copy_(torch.cumsum(lens, dim=0))
    # One extra element so a batch whose lists are all empty still has a valid pointer.
    kv_indices = torch.empty(max(total, 1), dtype=torch.int32, device=device)
    if bs > 0 and total > 0:
        _gather_rows_kernel[(bs,)](req_to_token, req_to_token.stride(0), req_pool_indices, lens,
                                   kv_indptr, kv_indices, BLOCK=512)
    return kv_indptr, kv_indices
