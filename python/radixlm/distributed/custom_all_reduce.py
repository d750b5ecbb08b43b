"""A low-latency all-reduce for the small messages of decode, on PyTorch's symmetric memory.

A decode step of a TP model all-reduces two small activations a layer (batch x hidden: 8 KB at
batch 1 of an 8B model). NCCL's ring/tree setup costs ~15 us each even inside a CUDA graph. With
symmetric memory every rank maps the others' buffer over NVLink, so a one-shot all-reduce is a
single kernel: copy the local input into this rank's buffer, signal, and sum all ranks' buffers
straight from their memory. It reads world_size x the message, so it wins only for small
messages; mid-sized ones go two-shot (each rank reduces a slice, then writes it to all), the
largest (prefill) to NCCL.

Only peer-to-peer mappings are used (torch.ops.symm_mem.one_shot_all_reduce_copy and
two_shot_all_reduce_), never NVLink multicast (the "multimem" ops): the GPU machines keep
multicast off on purpose (TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0), and this
module sets those defaults too before touching symmetric memory.

Every rank must take the same path for the same message (a rank in NCCL while another waits in
the symmetric-memory kernel would hang), so the choice depends only on the message size and the
world size, which all ranks share.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

from radixlm import envs

logger = logging.getLogger(__name__)

# Messages up to this many bytes take the one-shot path, by world size; larger ones up to
# TWO_SHOT_MAX_BYTES the two-shot path; the rest NCCL. From `radixlm bench allreduce` on an
# H200 NVLink machine (benchmarks/RESULTS.md, issue 19): the one-shot kernel reads world_size x
# the message, so its edge over NCCL shrinks as both grow; two-shot (reduce-scatter, then
# all-gather, over the same mappings) reads about twice the message whatever the world size.
ONE_SHOT_MAX_BYTES = {2: 512 * 1024, 4: 256 * 1024, 8: 128 * 1024}
DEFAULT_ONE_SHOT_MAX_BYTES = 64 * 1024
TWO_SHOT_MAX_BYTES = 8 * 1024 * 1024


def one_shot_limit(world_size: int) -> int:
    override = envs.one_shot_max_bytes()
    if override is not None:
        return override
    return ONE_SHOT_MAX_BYTES.get(world_size, DEFAULT_ONE_SHOT_MAX_BYTES)


def two_shot_limit(world_size: int) -> int:
    override = envs.two_shot_max_bytes()
    return TWO_SHOT_MAX_BYTES if override is None else override


class SymmMemAllReduce:
    """One symmetric buffer per rank, rendezvoused once. A small tensor is summed one-shot:
    copied into this rank's buffer, then every rank reads all buffers over NVLink. A mid-sized
    one two-shot: each rank sums its 1/world_size slice of everyone's buffer and writes it back
    to all of them.

    Building one is two steps, `allocate` (local) then `rendezvous` (collective), so that the
    ranks can agree in between that every one of them has its buffer."""

    # (PyTorch's symmetric-memory kernels take bf16 and fp32; fp16 messages go to NCCL.)
    DTYPES = (torch.bfloat16, torch.float32)

    def __init__(self, group: Any, world_size: int, device: torch.device,
                 one_shot_bytes: int | None = None, two_shot_bytes: int | None = None):
        self.world_size = world_size
        self.one_shot_bytes = (one_shot_limit(world_size) if one_shot_bytes is None
                               else one_shot_bytes)
        self.two_shot_bytes = (two_shot_limit(world_size) if two_shot_bytes is None
                               else two_shot_bytes)
        self.group_name = group.group_name
        self.device = device
        self.buffer: torch.Tensor | None = None
        self.handle: Any = None

    def allocate(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        envs.keep_multicast_off()
        # uint8, viewed as each message's dtype: one buffer serves bf16 and fp32 alike.
        size = max(self.one_shot_bytes, self.two_shot_bytes, 16)
        self.buffer = symm_mem.empty(size, dtype=torch.uint8, device=self.device)

    def rendezvous(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        self.handle = symm_mem.rendezvous(self.buffer, self.group_name)

    @classmethod
    def create(cls, group: Any, world_size: int, device: torch.device,
               one_shot_bytes: int | None = None, two_shot_bytes: int | None = None
               ) -> "SymmMemAllReduce":
        """Allocate and rendezvous at once (every rank must call it; benchmarks)."""
        fast = cls(group, world_size, device, one_shot_bytes, two_shot_bytes)
        fast.allocate()
        fast.rendezvous()
        return fast

    def path(self, x: torch.Tensor) -> str:
        """"one_shot", "two_shot" or "nccl" for `x` (the same answer on every rank for the same
        message: a rank in NCCL while another waits in a symmetric-memory kernel would hang)."""
        nbytes = x.numel() * x.element_size()
        if x.dtype not in self.DTYPES or not x.is_cuda or nbytes % 16:   # 16-byte vectors
            return "nccl"
        if nbytes <= self.one_shot_bytes:
            return "one_shot"
        # (each rank's slice a whole number of vectors)
        if nbytes <= self.two_shot_bytes and nbytes % (16 * self.world_size) == 0:
            return "two_shot"
        return "nccl"

    def handles(self, x: torch.Tensor) -> bool:
        return self.path(x) != "nccl"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `x` (which `handles`): a new tensor (one-shot) or `x` summed
        in place (two-shot)."""
        x = x.contiguous()
        staging = self.buffer[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
        if self.path(x) == "one_shot":
            # (the kernel reads `x` with the buffer's alignment: a view into the middle of a
            # storage is first copied)
            src = x if x.data_ptr() % 16 == 0 else x.clone()
            return torch.ops.symm_mem.one_shot_all_reduce_copy(staging, src, "sum",
                                                               self.group_name)
        staging.copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(staging, "sum", self.group_name)
        return x.copy_(staging)


def _matches_nccl(fast: SymmMemAllReduce, group: Any) -> bool:
    """Whether each symmetric path gives NCCL's sum on integer-valued data (exact in bf16).
    Every rank runs every probe, whatever its results, so that all take part in the same
    collectives."""
    rank = torch.distributed.get_rank(group)
    sizes = [8 * 1024]   # bytes
    if fast.two_shot_bytes > fast.one_shot_bytes:   # a message just past the one-shot limit
        unit = 16 * fast.world_size
        sizes.append(min(fast.two_shot_bytes, max(2 * fast.one_shot_bytes, 64 * 1024))
                     // unit * unit)
    ok = True
    for nbytes in sizes:
        probe = (torch.arange(nbytes // 2, device=fast.device) % 7 + rank).to(torch.bfloat16)
        if fast.path(probe) == "nccl":   # (a limit below the probe's size)
            continue
        want = probe.clone()
        torch.distributed.all_reduce(want, group=group)
        if not torch.equal(fast.all_reduce(probe.clone()), want):
            logger.warning("symmetric-memory %s all-reduce of %d bytes differs from NCCL's",
                           fast.path(probe), nbytes)
            ok = False
    return ok


def agreed_steps(what: str, steps: Sequence[Callable[[], None]], check: Callable[[], bool],
                 agree: Callable[[bool], bool]) -> bool:
    """Run `steps` (allocation, rendezvous) then `check` on every rank; whether all of them
    succeeded on every rank. `agree(ok)` is a collective over the ranks' host group that returns
    whether `ok` holds on all of them; it is reached after each step that could fail on some
    ranks only, so that no rank waits in a collective the others have given up on."""
    for step in steps:
        try:
            step()
            ok = True
        except Exception as e:   # old torch, no NVLink P2P, out of memory
            logger.warning("%s unavailable on this rank (%s: %s)", what, type(e).__name__,
                           str(e).splitlines()[0] if str(e) else "")
            ok = False
        if not agree(ok):
            return False
    try:
        ok = check()
    except Exception as e:
        logger.warning("%s failed its check (%s: %s)", what, type(e).__name__,
                       str(e).splitlines()[0] if str(e) else "")
        ok = False
    return agree(ok)


def agreed_symm_mem_all_reduce(group: Any, world_size: int, device: torch.device,
                               agree: Callable[[bool], bool]) -> SymmMemAllReduce | None:
    """The symmetric-memory paths if every rank can use them, else None on every rank (NCCL
    only). Every rank calls this; `agree` as in `agreed_steps`."""
    fast = SymmMemAllReduce(group, world_size, device)
    if not agree(fast.one_shot_bytes > 0 or fast.two_shot_bytes > 0):
        return None
    ok = agreed_steps("symmetric-memory all-reduce (NCCL only)",
                      (fast.allocate, fast.rendezvous),
                      lambda: _matches_nccl(fast, group), agree)
    return fast if ok else None
