"""The all-reduce that ends a tensor-parallel block and the RMSNorm after it, as one kernel.

Every decoder layer of a TP model ends its attention and its MLP with a row-parallel linear
whose partial sums are all-reduced, then added to the residual stream and normalised. At decode
batch sizes each of those is a small kernel whose cost is its launch and its cross-GPU handshake,
not its bytes (benchmarks/RESULTS.md, issue 19: the 66 all-reduces and 67 RMSNorms of an 8B
decode step at TP2 take 0.65 ms of 3.6). Here one launch does all of it:

1. each program writes its rows of this rank's partial sum into this rank's slot of every
   rank's symmetric buffer, over NVLink (pushed: stores need no round trip, where reading the
   peers' rows would wait for one);
2. it tells the same program on every rank, by writing its epoch into that rank's flag slot
   (a system-scope release), and waits until every rank has told it (acquire);
3. it sums its rows over the slots of its own buffer, in rank order (the same order on every
   rank, so all ranks hold bit-identical results) and in fp32, rounds the sum once to the
   activation dtype (NCCL and PyTorch's one-shot kernel round after every add: identical at
   TP2, within about an ulp beyond), adds the residual and normalises with the arithmetic of
   layers/kernels/norm_kernels.py.

Why it is safe without a second handshake:
- Every call launches the same PROGRAMS programs whatever the row count, so each program's epoch
  (a per-program counter in local memory) equals the number of calls so far on every rank, and
  the buffer a call uses (the epoch's parity) is the same for all of its programs.
- Two buffers alternate. A rank writes into a peer's buffer again two calls after that peer
  read it; in the call between, each of its programs waited for every peer to start that call,
  which on the peer's stream comes after the earlier call (the reads) ended.
- A peer is at most one call ahead (a call ends only after every rank started it), so waiting
  for "flag >= epoch" is exact, and the counters never need resetting.

What it does not survive: a rank that never starts a call (it died mid-step) leaves the others
spinning, as in PyTorch's one-shot kernel; the engine's watchdog on its rank processes then
takes the server down (tests/test_tensor_parallel.py, a dead rank).

Only peer-to-peer mappings are used, never NVLink multicast (kept off on the GPU machines).
Every rank must take this path for the same message or none does; `handles` depends only on the
shapes and dtypes, which all ranks share.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from radixlm import envs
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

logger = logging.getLogger(__name__)

# Programs per call (fixed: see the module doc). Enough to spread the largest message the path
# takes (its byte limit) over many SMs; at batch 1 all but one only take part in the handshake.
PROGRAMS = 32
# The widest row (hidden size) the kernel keeps in registers.
MAX_HIDDEN = 16384
# Flag slots: PROGRAMS x world size int64s, after the two data buffers.
MAX_WORLD = 16
FLAG_BYTES = PROGRAMS * MAX_WORLD * 8

SEND, RECEIVE = 1, 2   # kernel phases; a real call runs both (tests on the CPU run them apart)


# (not specialised on the rank or the row count: every rank and batch size runs one binary)
@triton.jit(do_not_specialize=["rank", "n_rows"])
def _all_reduce_rms_norm_kernel(
        X, R, W, Out, ResOut, Peers, Epochs,
        rank, n_rows, n_cols, slot_elems, flags_offset, n_float, eps,
        WORLD: tl.constexpr, WORLD_P2: tl.constexpr, PROGRAMS: tl.constexpr,
        BLOCK_N: tl.constexpr, PHASES: tl.constexpr, PDL: tl.constexpr = False):
    # With PDL (utils/pdl.py) the next kernel launches now and requests its first
    # weights while this one waits for its peers; before the wait only the norm weight and
    # the peers' addresses (fixed at the rendezvous) are read.
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    dt = X.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if PHASES & 2:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    mine = tl.load(Peers + rank)
    # Every rank's buffer address, and the flag slot of this program for this rank on each
    # (all ranks at once: one signalling round trip, not one per peer).
    ranks = tl.arange(0, WORLD_P2)
    valid = ranks < WORLD
    bases = tl.load(Peers + ranks, mask=valid, other=0)
    pdl_wait(PDL)   # x, the residual and the epochs are the previous kernels' writes

    if PHASES & 1:   # SEND
        epoch = tl.load(Epochs + pid) + 1
        tl.store(Epochs + pid, epoch)
    else:
        epoch = tl.load(Epochs + pid)
    parity = epoch % 2

    if PHASES & 1:
        row = pid.to(tl.int64)   # rows pid, pid + PROGRAMS, ...
        while row < n_rows:
            x = tl.load(X + row * n_cols + cols, mask=col_mask)
            for p in tl.static_range(WORLD):
                # (addresses read from memory carry no alignment: say they are 16-byte
                # aligned, as allocations are, so that stores use 16-byte vectors)
                dst = (tl.multiple_of(tl.load(Peers + p).to(tl.pointer_type(dt)), 16)
                       + (parity * WORLD + rank) * slot_elems)
                tl.store(dst + row * n_cols + cols, x, mask=col_mask)
            row += PROGRAMS
        # Every thread's stores happen before the releases below.
        tl.debug_barrier()
        to_peers = (bases + flags_offset).to(tl.pointer_type(tl.int64)) + pid * WORLD + rank
        tl.atomic_xchg(to_peers, tl.zeros([WORLD_P2], tl.int64) + epoch, mask=valid,
                       sem="release", scope="sys")

    if PHASES & 2:   # RECEIVE
        from_peers = (mine + flags_offset).to(tl.pointer_type(tl.int64)) + pid * WORLD + ranks
        # Spin on plain (volatile) loads, then one acquiring read of every flag.
        seen = tl.load(from_peers, mask=valid, other=0, volatile=True)
        while tl.min(tl.where(valid, seen, epoch)) < epoch:
            seen = tl.load(from_peers, mask=valid, other=0, volatile=True)
        tl.atomic_add(from_peers, tl.zeros([WORLD_P2], tl.int64), mask=valid, sem="acquire",
                      scope="sys")
        tl.debug_barrier()
        mine_data = tl.multiple_of(mine.to(tl.pointer_type(dt)), 16)
        row = pid.to(tl.int64)
        while row < n_rows:
            off = row * n_cols + cols
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for p in tl.static_range(WORLD):   # (rank order: the same sum on every rank)
                src = mine_data + (parity * WORLD + p) * slot_elems
                # (.cg: from L2, never a line an earlier call left in this SM's L1)
                acc += tl.load(src + off, mask=col_mask, other=0.0,
                               cache_modifier=".cg").to(tl.float32)
            # The sum rounded once to the activation dtype (NCCL and PyTorch's one-shot kernel
            # round after every add: the same at TP2, within an ulp or so beyond), then
            # `x + residual` rounded as the unfused path rounds it.
            s = acc.to(dt).to(tl.float32)
            r = tl.load(R + off, mask=col_mask, other=0.0).to(tl.float32)
            h = (s + r).to(dt)
            tl.store(ResOut + off, h, mask=col_mask)
            hf = h.to(tl.float32)
            ms = tl.math.div_rn(tl.sum(hf * hf, axis=0), n_float)
            rstd = tl.math.rsqrt(ms + eps)
            tl.store(Out + off, (w * (hf * rstd)).to(dt), mask=col_mask)
            row += PROGRAMS


class FusedAllReduceRMSNorm:
    """norm(all_reduce(x) + residual) and the new residual in one kernel, for messages up to
    `max_bytes`. Building one is `allocate` (local) then `rendezvous` (collective), like
    custom_all_reduce.SymmMemAllReduce."""

    DTYPES = (torch.bfloat16, torch.float16, torch.float32)

    def __init__(self, group_name: str, world_size: int, rank: int, device: torch.device,
                 max_bytes: int):
        if world_size > MAX_WORLD:
            raise ValueError(f"at most {MAX_WORLD} ranks")
        self.group_name = group_name
        self.world_size = world_size
        self.rank = rank
        self.device = device
        # One slot per sending rank, in each of the two alternating buffers.
        self.slot_bytes = (max_bytes + 255) // 256 * 256
        self.max_bytes = max_bytes
        self.storage: torch.Tensor | None = None
        self.peers: torch.Tensor | None = None    # int64 [world]: each rank's buffer address
        self.epochs = torch.zeros(PROGRAMS, dtype=torch.int64, device=device)

    @property
    def flags_offset(self) -> int:
        return 2 * self.world_size * self.slot_bytes

    def allocate(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        envs.keep_multicast_off()
        self.storage = symm_mem.empty(self.flags_offset + FLAG_BYTES, dtype=torch.uint8,
                                      device=self.device)
        self.storage[self.flags_offset:].zero_()
        # (no peer may signal into the flags before they are zeroed: the first call comes after
        # the rendezvous and the ranks' agreement, which follow this)
        torch.cuda.synchronize(self.device)

    def rendezvous(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        handle = symm_mem.rendezvous(self.storage, self.group_name)
        ptrs = list(handle.buffer_ptrs)
        if ptrs[self.rank] != self.storage.data_ptr():
            raise RuntimeError("symmetric buffer address mismatch")
        self.peers = torch.tensor(ptrs, dtype=torch.int64, device=self.device)

    def handles(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether `__call__` takes these (the same answer on every rank: shapes and dtypes)."""
        return (x.is_cuda and x.dim() == 2 and x.dtype in self.DTYPES
                and 0 < x.shape[0] and 0 < x.shape[1] <= MAX_HIDDEN
                and x.numel() * x.element_size() <= self.max_bytes
                and x.is_contiguous() and residual.is_contiguous()
                and residual.shape == x.shape and residual.dtype == x.dtype
                and weight.numel() == x.shape[1] and weight.is_contiguous()
                and not torch.compiler.is_compiling())

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, phases: int = SEND | RECEIVE) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(sum over ranks of x + residual), that sum + residual)."""
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        res_out = torch.empty_like(x)
        block_n = triton.next_power_of_2(n_cols)
        _all_reduce_rms_norm_kernel[(PROGRAMS,)](
            x, residual, weight, out, res_out, self.peers, self.epochs,
            self.rank, n_rows, n_cols, self.slot_bytes // x.element_size(), self.flags_offset,
            float(n_cols), eps,
            WORLD=self.world_size, WORLD_P2=triton.next_power_of_2(self.world_size),
            PROGRAMS=PROGRAMS, BLOCK_N=block_n, PHASES=phases,
            num_warps=min(16, max(4, block_n // 512)), **pdl_kwargs(x.device, n_rows))
        return out, res_out


def _reference(summed: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What the unfused path computes from the all-reduced sum: (norm(h), h) with
    h = summed + residual in the activation dtype: RMSNorm's PyTorch code (layers/norm.py),
    written out here because layers/ imports distributed/, not the other way round."""
    h = summed + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * normed).to(h.dtype), h


def _matches_unfused(fused: FusedAllReduceRMSNorm, group: Any) -> bool:
    """Whether the kernel gives the all-reduce + RMSNorm result over a few calls (both
    buffers, one and several rows a program), on integer-valued partial sums (their sum is
    exact in bf16, so the new residual must be equal and the output within an ulp or two)."""
    gen = torch.Generator(device=fused.device).manual_seed(0)   # the same on every rank
    ok = True
    for rows, cols in ((1, 4096), (3, 4096), (2, 1000), (1, 4096)):
        if rows * cols * 2 > fused.max_bytes:
            continue
        x = ((torch.arange(rows * cols, device=fused.device) % 5) + fused.rank).to(
            torch.bfloat16).view(rows, cols)
        residual = torch.randn(rows, cols, device=fused.device, generator=gen).to(torch.bfloat16)
        weight = torch.rand(cols, device=fused.device, generator=gen).to(torch.bfloat16)
        summed = x.clone()
        torch.distributed.all_reduce(summed, group=group)
        want, want_res = _reference(summed, residual, weight, 1e-6)
        got, got_res = fused(x, residual, weight, 1e-6)
        if not (torch.equal(got_res, want_res)
                and torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)):
            logger.warning("fused all-reduce + RMSNorm differs from the unfused path "
                           "(%d x %d)", rows, cols)
            ok = False
    return ok


def agreed_fused_all_reduce_norm(group: Any, rank: int, world_size: int, device: torch.device,
                                 max_bytes: int, agree: Callable[[bool], bool]
                                 ) -> FusedAllReduceRMSNorm | None:
    """The fused kernel if every rank can use it, else None on every rank (every rank calls
    this; `agree` as in custom_all_reduce.agreed_steps)."""
    from radixlm.distributed.custom_all_reduce import agreed_steps
    wanted = (envs.fused_all_reduce_norm_enabled() and not envs.disable_fused_ops()
              and 0 < max_bytes and world_size <= MAX_WORLD)
    if not agree(wanted):
        return None
    fused = FusedAllReduceRMSNorm(group.group_name, world_size, rank, device, max_bytes)
    ok = agreed_steps("fused all-reduce + RMSNorm (all-reduce, then the norm)",
                      (fused.allocate, fused.rendezvous),
                      lambda: _matches_unfused(fused, group), agree)
    return fused if ok else None
