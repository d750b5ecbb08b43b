"""The tensor-parallel group handed to every layer, and the process group behind it.

Each rank is its own scheduler process (`--tp-size N`). `init_tensor_parallel` joins them into
a torch.distributed group: NCCL on GPUs (the layers' all-reduces and all-gathers), gloo on the
CPU, and always a gloo group for the small host-side messages (rank 0's broadcast of what the
scheduler received, the agreed KV capacity). Size 1 makes every collective a no-op.
"""

from __future__ import annotations

import datetime
import logging
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# A rank that never joins, or a peer that died, must end in an error, not a hang
# (--dist-timeout).
DEFAULT_TIMEOUT_S = 600


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: Any = field(default=None, compare=False, repr=False)       # device collectives
    cpu_group: Any = field(default=None, compare=False, repr=False)   # host-side objects
    # GPUs: small and mid-sized messages over symmetric memory (distributed/custom_all_reduce.py).
    fast: Any = field(default=None, compare=False, repr=False)
    # GPUs: the all-reduce ending a block fused with the RMSNorm after it
    # (distributed/fused_all_reduce_norm.py), for decode-sized messages.
    fused_norm: Any = field(default=None, compare=False, repr=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks; use the return value (it may be a new tensor, or `x` summed in
        place)."""
        if self.size == 1:
            return x
        if self.fast is not None and self.fast.handles(x):
            return self.fast.all_reduce(x)
        dist.all_reduce(x, group=self.group)
        return x

    def all_reduce_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                            weight: torch.Tensor, eps: float
                            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(norm(sum over ranks of x + residual), that sum + residual) in one kernel, or None
        when the fused kernel does not take these tensors (the caller all-reduces, then
        normalises)."""
        if self.fused_norm is not None and self.fused_norm.handles(x, residual, weight):
            return self.fused_norm(x, residual, weight, eps)
        return None

    def all_reduce_paths(self) -> list[str]:
        """What this group's all-reduces can take, as agreed by its ranks (none at size 1):
        "gloo" (CPU) or "nccl", plus "one_shot" / "two_shot" (symmetric memory) and
        "fused_rms_norm" (the all-reduce + residual + RMSNorm kernel) where they are on."""
        if self.size == 1:
            return []
        paths = ["nccl" if self.group is not None and dist.get_backend(self.group) == "nccl"
                 else "gloo"]
        if self.fast is not None:
            paths += [p for p, limit in (("one_shot", self.fast.one_shot_bytes),
                                         ("two_shot", self.fast.two_shot_bytes)) if limit > 0]
        if self.fused_norm is not None:
            paths.append("fused_rms_norm")
        return paths

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_from_first(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (the others' argument is ignored)."""
        if self.size == 1:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def min_over_ranks(self, value: int) -> int:
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def same_on_all_ranks(self, obj: Any) -> bool:
        """Whether every rank holds an equal `obj` (a start-up check that ranks agree)."""
        if self.size == 1:
            return True
        blob = pickle.dumps(obj)
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, blob, group=self.cpu_group)
        return all(g == blob for g in gathered)

    def shard(self, total: int, what: str) -> int:
        """This rank's share of a dimension that must divide evenly."""
        if total % self.size != 0:
            raise ValueError(f"--tp-size {self.size}: {what} ({total}) is not divisible by it")
        return total // self.size


SINGLE = TPGroup()
_current: TPGroup = SINGLE


def init_tensor_parallel(rank: int, size: int, init_addr: str, device_type: str,
                         timeout_s: int | None = None, custom_all_reduce: bool = True
                         ) -> TPGroup:
    """Join the ranks (all call this) at `init_addr` (HOST:PORT, rank 0 listens there).
    `custom_all_reduce` (GPUs): small all-reduces over symmetric memory where it works
    (--disable-custom-all-reduce turns it off)."""
    global _current
    if size == 1:
        _current = SINGLE
        return _current
    backend = "nccl" if device_type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S)
    try:
        dist.init_process_group(backend, init_method=f"tcp://{init_addr}", rank=rank,
                                world_size=size, timeout=timeout)
        group = dist.group.WORLD
        cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo",
                                                                   timeout=timeout)
        # A first collective: returns once every rank has joined (or times out).
        dist.barrier(group=cpu_group)
    except Exception as e:   # the store's and gloo's messages do not say what to check
        raise RuntimeError(
            f"the {size} tensor-parallel ranks did not all join at {init_addr} within "
            f"{timeout.total_seconds():.0f} s (--dist-timeout): is every node started, with "
            f"the same --tp-size, --nnodes and --dist-init-addr and its own --node-rank? "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    _current = TPGroup(rank, size, group, cpu_group)
    # Every rank asks, even one started with the fast path off: a node whose flags differ must
    # not leave the others in a rendezvous it never joins.
    if backend == "nccl" and _current.min_over_ranks(int(custom_all_reduce)) == 1:
        fast = _agreed_fast_path(_current)
        fused = None if fast is None else _agreed_fused_norm(_current, fast.one_shot_bytes)
        _current = TPGroup(rank, size, group, cpu_group, fast, fused)
    return _current


def _agreed_fast_path(tp: TPGroup) -> Any:
    """The symmetric-memory all-reduce if every rank can use it with the same limits, else None
    on every rank (a rank taking NCCL while another waits in a symmetric kernel would hang)."""
    from radixlm.distributed.custom_all_reduce import (agreed_symm_mem_all_reduce,
                                                       one_shot_limit, two_shot_limit)
    limits = (one_shot_limit(tp.size), two_shot_limit(tp.size))
    if not tp.same_on_all_ranks(limits):   # (RADIXLM_*_SHOT_MAX_BYTES differ between nodes)
        logger.warning("the ranks' all-reduce size limits differ: NCCL only")
        return None
    return agreed_symm_mem_all_reduce(
        tp.group, tp.size, torch.device("cuda", torch.cuda.current_device()),
        lambda ok: tp.min_over_ranks(int(ok)) == 1)


def _agreed_fused_norm(tp: TPGroup, max_bytes: int) -> Any:
    """The fused all-reduce + RMSNorm kernel for messages the one-shot path would take, if
    every rank can use it, else None on every rank."""
    from radixlm.distributed.fused_all_reduce_norm import agreed_fused_all_reduce_norm
    return agreed_fused_all_reduce_norm(
        tp.group, tp.rank, tp.size, torch.device("cuda", torch.cuda.current_device()),
        max_bytes,
        lambda ok: tp.min_over_ranks(int(ok)) == 1)


def tp_group() -> TPGroup:
    """This process's group (SINGLE unless init_tensor_parallel made one)."""
    return _current
