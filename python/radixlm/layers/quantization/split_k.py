"""Split-K for the small-batch quantized kernels without extra launches.

At decode batch sizes a quantized layer's output is too small to keep the GPU busy with one
program per output tile, so the kernels split K across programs. Adding the partial sums into
a zeroed float32 output and casting it afterwards costs two more kernels a layer (a fill and a
copy: ~2 us each inside a CUDA graph, next to GEMMs of 5-30 us). Instead, each program adds its
partial tile into a float32 buffer and bumps a counter of its output tile; the last of the
tile's programs reads the total, writes the output in its dtype, and sets its part of the
buffer and the counter back to zero for the next call.

The buffer and counters (`SplitKScratch`) belong to one layer: a layer never runs twice at
once (one forward at a time, on one stream), and every launch leaves them zero, so CUDA graphs
replay it as it was captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Output columns per tile of the smallest tiles the kernels use: bounds the counters needed.
MIN_BLOCK_N = 8
# Rows of a layer's scratch: the FP8 weight-only kernels take up to 16 rows, the 4-bit ones
# split K four ways up to 16 rows (two ways beyond, through the zeroed-buffer path).
SCRATCH_ROWS = 16


@dataclass
class SplitKScratch:
    partials: torch.Tensor      # [rows, N] float32, zero between calls
    counters: torch.Tensor      # int32, one per output tile, zero between calls

    @classmethod
    def for_layer(cls, rows: int, n: int, device: torch.device) -> "SplitKScratch":
        tiles = rows * triton.cdiv(n, MIN_BLOCK_N)
        return cls(torch.zeros((rows, n), dtype=torch.float32, device=device),
                   torch.zeros(tiles, dtype=torch.int32, device=device))

    def fits(self, m: int, n: int, block_n: int) -> bool:
        """Whether an [m, n] output in tiles of `block_n` columns can use this scratch."""
        return (m <= self.partials.shape[0] and n == self.partials.shape[1]
                and block_n >= MIN_BLOCK_N)


def attach_scratch(layer: torch.nn.Module, n: int, device: torch.device) -> None:
    """After loading: give a layer on CUDA its scratch now, before any CUDA-graph capture
    (on the CPU, where no kernel runs, none)."""
    layer.split_k_scratch = None
    if device.type == "cuda":
        layer_scratch(layer, n, device)


def layer_scratch(layer: torch.nn.Module, n: int, device: torch.device) -> SplitKScratch:
    """`layer.split_k_scratch` for an output of n columns on `device`, made on first use (the
    quantized methods make it after loading when the weight is on CUDA, before any graph
    capture; this covers weights loaded on the CPU and moved)."""
    scratch = getattr(layer, "split_k_scratch", None)
    if scratch is None or scratch.partials.device != device:
        scratch = layer.split_k_scratch = SplitKScratch.for_layer(SCRATCH_ROWS, n, device)
    return scratch


@triton.jit
def split_k_total(part_ptrs, count_ptr, acc, mask, SPLIT: tl.constexpr):
    """(last, total) for a program's partial tile `acc`: `last` is true in one program of the
    tile, whose `total` is the sum over all SPLIT programs; only that program stores. With
    SPLIT == 1 every program is last and its total is its own."""
    if SPLIT == 1:
        last = True
        total = acc
    else:
        tl.atomic_add(part_ptrs, acc, mask=mask, sem="relaxed")
        # Every thread's addition is issued before the counter moves (the release below).
        tl.debug_barrier()
        last = tl.atomic_add(count_ptr, 1, sem="acq_rel") == SPLIT - 1
        total = acc
        if last:
            # The total, read where the additions happened (L2) and cleared for the next call
            # in one atomic exchange (on the bits: the interpreter exchanges integers only).
            bits = part_ptrs.to(tl.pointer_type(tl.int32))
            total = tl.atomic_xchg(bits, tl.zeros_like(acc).to(tl.int32), mask=mask,
                                   sem="relaxed").to(tl.float32, bitcast=True)
            tl.store(count_ptr, 0)
    return last, total
