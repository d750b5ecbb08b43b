"""One Triton kernel that copies KV rows between two pools, whichever memory each is in.

The hierarchical cache moves a node's K and V, every layer, between the device pool and the
host pool. Done with PyTorch ops that is a gather per layer into a staging block, one DMA, and a
scatter per layer on the *host* (the host pool's slots are scattered, so no single copy reaches
them), with the scheduler's thread doing the host half and the GPU waiting for it. Here the GPU
does all of it in one launch: the host pool is page-locked and mapped into the GPU's address
space, so the kernel reads (a load) or writes (a backup) host rows directly over PCIe, each row
(one token's heads in one layer, 1-2 KB) a contiguous burst, with thousands of rows in flight.
No host thread copies anything and nothing waits: the launch is queued on the current stream
like any kernel, after what wrote the rows and before what reuses their slots.

Addressing: each pool is a list of per-layer buffers (K0, V0, K1, V1, ...), each
[num_slots, heads, dim] and contiguous. The kernel gets the first buffer as its pointer argument
(Triton resolves a host tensor to its mapped device address) and every buffer's distance from it
in words (`buffer_offsets`). The distances stay valid in the GPU's view only within one mapping,
so the host pool must be one allocation (pools.KVPool(single_allocation=True)); the device
pool's buffers are device memory, where addresses are the same everywhere.

Rows are copied as 4-byte words where the row size allows (2- or 1-byte otherwise; fp8 rows are
plain bytes too): a copy, no arithmetic, so every dtype copies exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.layers.attention.kernels.common import next_pow2

_WORD_DTYPES = {4: torch.int32, 2: torch.int16, 1: torch.uint8}
_ELEMENTS_PER_PROGRAM = 4096   # words a program copies (tokens x row): ~16 KB in flight


@triton.jit(do_not_specialize=["num_tokens"])
def _copy_rows_kernel(src, src_offsets, src_slots, dst, dst_offsets, dst_slots, num_tokens,
                      ROW: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                      SRC_ALIGN: tl.constexpr, DST_ALIGN: tl.constexpr):
    """Program (i, b): tokens [i * BLOCK_T, (i + 1) * BLOCK_T) of buffer b (layer b // 2, K or
    V): dst_b[dst_slots[t]] = src_b[src_slots[t]], ROW words each."""
    buf = tl.program_id(1)
    # *_ALIGN: what every buffer offset is known to be a multiple of (lets Triton use wide
    # loads and stores when the rows are aligned too).
    src_base = tl.multiple_of(tl.load(src_offsets + buf), SRC_ALIGN)
    dst_base = tl.multiple_of(tl.load(dst_offsets + buf), DST_ALIGN)
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_mask = toks < num_tokens
    s = tl.load(src_slots + toks, mask=tok_mask, other=0).to(tl.int64)
    d = tl.load(dst_slots + toks, mask=tok_mask, other=0).to(tl.int64)
    cols = tl.arange(0, BLOCK_R)
    mask = tok_mask[:, None] & (cols < ROW)[None, :]
    rows = tl.load(src + src_base + s[:, None] * ROW + cols[None, :], mask=mask)
    tl.store(dst + dst_base + d[:, None] * ROW + cols[None, :], rows, mask=mask)


def word_size(row_bytes: int) -> int:
    """The widest word (4, 2 or 1 bytes) that divides a row."""
    return next(w for w in (4, 2, 1) if row_bytes % w == 0)


def as_words(buffer: torch.Tensor, word: int) -> torch.Tensor:
    """The same bytes as a flat tensor of `word`-byte integers."""
    return buffer.view(torch.uint8).view(-1).view(_WORD_DTYPES[word])


class PoolAddressing:
    """What the kernel needs to address one pool's buffers: the first buffer (as words) and
    every buffer's offset from it in words, on the GPU."""

    def __init__(self, buffers: list[torch.Tensor], word: int, device: torch.device):
        if any(not b.is_contiguous() for b in buffers):
            raise ValueError("KV buffers must be contiguous to be copied by rows")
        self.base = as_words(buffers[0], word)
        offsets = []
        for b in buffers:
            delta = b.data_ptr() - buffers[0].data_ptr()
            if delta % word:
                raise ValueError("KV buffers must be word-aligned relative to each other")
            offsets.append(delta // word)
        self.offsets = torch.tensor(offsets, dtype=torch.int64, device=device)
        # The largest power of two, up to 16 bytes, that divides every offset.
        self.align = next(a for a in (16 // word, 8 // word, 4 // word, 2 // word, 1)
                          if a >= 1 and all(o % a == 0 for o in offsets))


def copy_rows(src: PoolAddressing, src_slots: torch.Tensor, dst: PoolAddressing,
              dst_slots: torch.Tensor, row_bytes: int, word: int) -> None:
    """For every buffer b: dst_b[dst_slots] = src_b[src_slots] (slots int64/int32 on the GPU),
    one launch on the current stream."""
    num_tokens = src_slots.numel()
    if num_tokens == 0:
        return
    row = row_bytes // word
    block_r = next_pow2(row)
    # Shapes from the row alone, so one compiled kernel per direction serves every copy (a
    # node of a few tokens just masks the rest of its block).
    block_t = max(1, _ELEMENTS_PER_PROGRAM // block_r)
    grid = (triton.cdiv(num_tokens, block_t), src.offsets.numel())
    _copy_rows_kernel[grid](src.base, src.offsets, src_slots, dst.base, dst.offsets, dst_slots,
                            num_tokens, ROW=row, BLOCK_T=block_t, BLOCK_R=block_r,
                            SRC_ALIGN=src.align, DST_ALIGN=dst.align, num_warps=4)
