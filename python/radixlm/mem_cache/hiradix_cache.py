"""The hierarchical radix cache (HiCache, `--enable-hierarchical-cache`): the radix tree over two
tiers, device KV slots and a larger host KV pool (pinned memory on a GPU machine; on the CPU a
second pool, so the logic is the same and testable anywhere).

A node's KV lives on the device (`value`), on the host (`host_value`), or both. Along any path
from the root the device-resident nodes come first: a request's prefix is the concatenation of
device slots, so a node is only ever device-resident if its parent is.

- Backing up to the host (`--hicache-write-policy`): `write_through` copies a node when it is
  cached; `write_through_selective` when it is hit a second time; `write_back` only when it is
  evicted from the device.
- Device eviction takes unlocked device-resident nodes with no device-resident child, least
  recently used first. A node with a host copy stays in the tree, host-only; one without (and
  that cannot get one) leaves with its subtree.
- Host eviction (to make room for a backup) takes host-only leaves, least recently used first.
- A match that runs into host-only nodes loads them back into fresh device slots (evicting
  other device nodes if needed, never the path being loaded), so the request starts from the
  whole prefix. A copy between the tiers is one kernel on the compute stream that reads or
  writes the page-locked host pool directly (kv_transfer.py, kv_copy_kernel.py): ordered with
  the forward passes, nothing for the host to wait for.
- Inserting over host-only nodes adopts the request's own device slots for them.

Accounting: the device counts of RadixCache (free + evictable + protected + owned == total)
cover device-resident nodes only; the host pool keeps host free + held == host total.
"""

from __future__ import annotations

import glob
import hashlib
import heapq
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from radixlm import envs
from radixlm.config import HICACHE_WRITE_POLICIES as WRITE_POLICIES
from radixlm.config import ServerArgs
from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.file_tier import FileTier
from radixlm.mem_cache.kv_transfer import TierCopier
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool
from radixlm.mem_cache.prefix_cache import LoadPeek, MatchResult
from radixlm.mem_cache.radix_cache import RadixCache, TreeNode

@dataclass(frozen=True)
class HiCacheConfig:
    ratio: float = 2.0                    # host pool size / device pool size (--hicache-ratio)
    size_gib: float = 0.0                 # host pool size in GiB; 0: use the ratio
    write_policy: str = "write_back"
    storage_dir: str | None = None        # the file tier (L3) directory; None: no L3
    storage_namespace: str = ""           # what else names a block: the model, the TP rank
    ranks_on_host: int = 1                # tensor-parallel ranks sharing this host's memory
    # Under tensor parallelism each rank reads its own slice of a block from the store: how
    # many blocks every rank found (the smallest count over the ranks), so that all load the
    # same prefix and their trees stay equal. None: one rank.
    agree_on_blocks: Callable[[int], int] | None = field(default=None, compare=False,
                                                         repr=False)

    @classmethod
    def from_server_args(cls, args: ServerArgs, tp_rank: int) -> "HiCacheConfig":
        storage_dir = None
        if args.hicache_storage_backend == "file":
            storage_dir = args.hicache_storage_dir or os.path.join(envs.cache_dir(), "hicache")
        # A stored block is only valid for the same weights and the same slice of the heads.
        namespace = (f"{weights_fingerprint(args.model_path)}|{args.load_format}"
                     f"|seed{args.random_seed}|tp{tp_rank}/{args.tp_size}")
        return cls(args.hicache_ratio, args.hicache_size, args.hicache_write_policy,
                   storage_dir=storage_dir, storage_namespace=namespace,
                   ranks_on_host=args.tp_size // args.nnodes)

    def host_slots(self, device_slots: int, bytes_per_token: int) -> int:
        """The host pool's size in tokens; a ValueError naming the flag if the host does not
        have that much memory available (shared by the ranks on this host)."""
        if self.size_gib > 0:
            slots, flag = int(self.size_gib * 2 ** 30 // bytes_per_token), "--hicache-size"
        else:
            slots, flag = int(device_slots * self.ratio), "--hicache-ratio"
        need, have = slots * bytes_per_token, available_host_memory()
        if have is not None:
            have //= self.ranks_on_host
        if have is not None and need > have:
            raise ValueError(f"{flag}: the host KV pool would take {need / 2 ** 30:.1f} GiB; "
                             f"only {have / 2 ** 30:.1f} GiB of host memory are available")
        if self.size_gib > 0 and slots <= device_slots:
            # Every entry backed up keeps its host copy while it is on the device, so a host
            # pool no larger than the device's could not even back the device pool up (as
            # SGLang, refused; --hicache-ratio <= 1 is refused with the other flags).
            raise ValueError(f"{flag}: the host KV pool ({slots} tokens) must be larger than "
                             f"the device's ({device_slots} tokens)")
        if slots < 2:
            raise ValueError(f"{flag}: the host KV pool would hold {slots} tokens")
        return slots


def weights_fingerprint(model_dir: str | None) -> str:
    """What identifies a model's weights for the file tier: its config and the name, size and
    modification time of each weight file (a fine-tune written over the same directory, or
    another model at the same relative path, gets other names)."""
    h = hashlib.sha256()
    if model_dir:
        model_dir = os.path.abspath(model_dir)
        h.update(model_dir.encode())
        for path in sorted(glob.glob(os.path.join(model_dir, "*"))):
            name = os.path.basename(path)
            if name == "config.json" or name.endswith((".safetensors", ".gguf", ".bin")):
                st = os.stat(path)
                h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
        try:
            with open(os.path.join(model_dir, "config.json"), "rb") as f:
                h.update(f.read())
        except OSError:
            pass
    return h.hexdigest()[:32]


def available_host_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class HiRadixCache(RadixCache):
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: KVAllocator,
                 device_pool: KVPool, config: HiCacheConfig):
        if config.write_policy not in WRITE_POLICIES:
            raise ValueError(f"--hicache-write-policy: must be one of {WRITE_POLICIES}, "
                             f"got {config.write_policy!r}")
        self.config = config
        self.device_pool = device_pool
        ps = allocator.page_size
        per_token = KVPool.bytes_per_token(device_pool.num_layers, device_pool.num_kv_heads,
                                           device_pool.head_dim, device_pool.dtype)
        wanted = config.host_slots(allocator.total_size, per_token)
        host_slots = (wanted // ps + 1) * ps   # + the padding page
        pinned = device_pool.device.type == "cuda"
        # The device pool's storage dtype and scales: copies between the tiers are raw bytes
        # (an fp8 device pool gets an fp8 host pool, twice the tokens per host byte too).
        self.host_pool = KVPool(host_slots, device_pool.num_layers, device_pool.num_kv_heads,
                                device_pool.head_dim, device_pool.dtype, "cpu", pin_memory=pinned,
                                k_scale=device_pool.k_scales, v_scale=device_pool.v_scales,
                                single_allocation=True)
        # The host pool's slot numbers live where the copies are made: on a GPU machine only the
        # copy kernel reads them, and a host tensor would cost a synchronising copy per use.
        self.host_allocator = KVAllocator(host_slots, ps, device_pool.device)
        self.copier = TierCopier(device_pool, self.host_pool)
        self.loaded_tokens = 0       # host -> device, since start (metrics, tests)
        self.backed_up_tokens = 0    # device -> host
        self.file_tier: FileTier | None = None
        if config.storage_dir is not None:
            self.file_tier = FileTier(config.storage_dir, config.storage_namespace, device_pool,
                                      ps, config.agree_on_blocks)
        super().__init__(req_to_token_pool, allocator)

    def reset(self) -> None:
        super().reset()
        self.host_allocator.clear()

    # ---------------------------------------------------------------- tiers

    def _backup(self, node: TreeNode) -> bool:
        """Give `node` a host copy (making room by host eviction). False if there is none."""
        if node.host_value is not None:
            return True
        n = len(node.key)
        slots = self.host_allocator.alloc(n)
        if slots is None:
            self._evict_host(n - self.host_allocator.available_size(), keep=node)
            slots = self.host_allocator.alloc(n)
            if slots is None:
                return False
        self.copier.to_host(node.value, slots)
        node.host_value = slots
        self.backed_up_tokens += n
        return True

    def _evict_host(self, num_tokens: int, keep: TreeNode | None = None) -> None:
        """Drop host-only leaves, least recently used first, until num_tokens host slots are
        free (or nothing more can go)."""
        heap = [n for n in self._leaves()
                if n.value is None and n is not keep and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            freed += self._drop_host_leaf(leaf)
            parent = leaf.parent
            if (parent is not self.root and parent is not keep and not parent.children
                    and parent.value is None and parent.lock_ref == 0):
                heapq.heappush(heap, parent)

    def _drop_host_leaf(self, leaf: TreeNode) -> int:
        assert leaf.value is None and not leaf.children
        self.host_allocator.free(leaf.host_value)
        leaf.host_value = None   # any later use of this node must fail, not read reused slots
        del leaf.parent.children[self._child_key(leaf.key)]
        return len(leaf.key)

    def _drop_subtree(self, node: TreeNode) -> None:
        """Remove `node` and everything under it (all host-only but `node` itself)."""
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            assert n.value is None
            if n.host_value is not None:
                self.host_allocator.free(n.host_value)
                n.host_value = None
        if node.host_value is not None:
            self.host_allocator.free(node.host_value)
            node.host_value = None
        del node.parent.children[self._child_key(node.key)]

    def _load(self, nodes: list[TreeNode], protect: TreeNode) -> int:
        """Bring host-only `nodes` (a path, top-down, below `protect`) back to the device.
        Returns how many of them were loaded (a prefix of the list: fewer if the device is
        full even after evicting everything else that may go)."""
        need = sum(len(n.key) for n in nodes)
        short = need - self.allocator.available_size()
        if short > 0:
            # The path above must survive the device eviction, and the host nodes themselves
            # the host eviction that backing up evicted nodes may cause.
            self.inc_lock_ref(protect)
            for n in nodes:
                n.lock_ref += 1
            self.evict(short)
            for n in nodes:
                n.lock_ref -= 1
            self.dec_lock_ref(protect)
        loaded = 0
        for node in nodes:
            slots = self.allocator.alloc(len(node.key))
            if slots is None:
                break
            self.copier.to_device(node.host_value, slots)
            node.value = slots
            self.evictable_size_ += len(node.key)
            self.loaded_tokens += len(node.key)
            loaded += 1
        return loaded

    # ---------------------------------------------------------------- RadixCache overrides

    def peek_load(self, key: Sequence[int]) -> LoadPeek:
        """What matching `key` would copy into device slots: its host-tier part, and the
        blocks after the tree's part that the file tier has."""
        path = self._peek_path(key)
        cached = sum(n for _, n in path)
        to_load = sum(n for node, n in path if node.value is None)
        if self.file_tier is not None:
            stored = self.file_tier.peek(key, cached)
            cached, to_load = cached + stored, to_load + stored
        return LoadPeek(
            cached=cached, to_load=to_load,
            unlocked_on_device=sum(n for node, n in path
                                   if node.value is not None and node.lock_ref == 0))

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        match = self._match(key)
        if self.file_tier is not None and self._fetch_from_storage(key, match):
            match = self._match(key)
        return match

    def _match(self, key: Sequence[int]) -> MatchResult:
        """RadixCache.match_prefix, plus: host-only nodes on the path are loaded back, and under
        write_through_selective a node hit a second time is backed up."""
        parts, host_path, hit_twice = [], [], []
        node = self.root
        for child in self._walk(key):
            child.hit_count += 1
            if child.value is None:
                host_path.append(child)
            else:
                parts.append(child.value)
                if (self.config.write_policy == "write_through_selective"
                        and child.hit_count >= 2 and child.host_value is None):
                    hit_twice.append(child)
            node = child
        if host_path:
            device_end = host_path[0].parent
            loaded = self._load(host_path, device_end)
            parts += [n.value for n in host_path[:loaded]]
            node = host_path[loaded - 1] if loaded else device_end
        # Backing up may evict host-only nodes: only once the path is back on the device, so
        # that none of it can go.
        for child in hit_twice:
            self._backup(child)
        indices = (torch.cat(parts) if parts
                   else torch.empty(0, dtype=torch.int64, device=self.device))
        return MatchResult(indices=indices, last_node=node)

    # ---------------------------------------------------------------- the file tier (L3)

    @property
    def has_slow_tier(self) -> bool:
        return self.file_tier is not None

    @property
    def storage_hit_tokens(self) -> int:
        """Tokens loaded from the file tier since start (metrics, tests)."""
        return self.file_tier.hit_tokens if self.file_tier else 0

    @property
    def storage_prefetched_tokens(self) -> int:
        """Of those, tokens in blocks read ahead of the match."""
        return self.file_tier.prefetched_tokens if self.file_tier else 0

    def prefetch(self, key: Sequence[int]) -> None:
        """A request arrived: read the store's blocks that follow what the tree holds of its
        prompt (on any tier), on the prefetch threads, while it waits for admission."""
        if self.file_tier is not None:
            self.file_tier.prefetch(key, self.peek_prefix(key)[0])

    def _fetch_from_storage(self, key: Sequence[int], match: MatchResult) -> bool:
        """Load the blocks that follow `match` from the store into fresh device slots, a
        staging arena's worth at a time, and cache them in the tree. Returns whether any was
        found. (Under tensor parallelism every round's block count is agreed on, so the ranks
        run the same rounds, evictions and allocations.)"""
        tier = self.file_tier
        have = end = len(match.indices)
        parts = [match.indices]
        while True:
            staged = tier.read(key, end)
            if not staged.blocks:
                break
            skip = end % tier.block_size       # (tokens of the first block the tree holds)
            need = len(staged.blocks) * tier.block_size - skip
            short = need - self.allocator.available_size()
            if short > 0:     # (the slots of earlier rounds are not in the tree: not evicted)
                self.inc_lock_ref(match.last_node)
                self.evict(short)
                self.dec_lock_ref(match.last_node)
            slots = self.allocator.alloc(need)
            if slots is None:
                tier.release(staged)
                break
            tier.copy_in(staged, skip, slots)
            parts.append(slots)
            end += need
            if not staged.cut_short and tier.agree_on_blocks is None:
                break     # (a miss: the next round would only find it again; under TP the
                          # ranks' rounds end alike only where they agree on none)
        if end == have:
            return False
        already = self.insert(list(key[:end]), torch.cat(parts))
        assert already == have, "the tree changed under a storage fetch"
        return True

    # ---------------------------------------------------------------- tree shape

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        host = child.host_value
        mid = super()._split(child, n)
        if host is not None:
            mid.host_value, child.host_value = host[:n], host[n:]
        mid.hit_count = child.hit_count
        return mid

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """RadixCache.insert, plus: host-only nodes on the way adopt the caller's slots (they
        are not duplicates: the tree had no device copy), new nodes are backed up under
        write_through, and whole blocks go to the file tier."""
        if self.file_tier is not None:
            n = self._aligned(len(key))
            self.file_tier.store(list(key[:n]), value[:n].to(torch.int64))
        return super().insert(key, value)

    def _has_kv(self, node: TreeNode, offered: torch.Tensor) -> bool:
        if node.value is not None:
            return True
        node.value = offered.clone()      # host-only: take the caller's copy
        self.evictable_size_ += len(node.key)
        return False

    def _on_new_node(self, node: TreeNode) -> None:
        if self.config.write_policy == "write_through":
            self._backup(node)

    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens device slots: device leaves (no device-resident child),
        unlocked, least recently used first; each stays on the host if it has (or, under
        write_back / selective, can get) a host copy."""
        heap = [n for n in self._leaves(counts=lambda c: c.value is not None)
                if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)
            if node.host_value is None and self.config.write_policy != "write_through":
                self._backup(node)
            self.allocator.free(node.value)
            node.value = None
            freed += len(node.key)
            self.evictable_size_ -= len(node.key)
            parent = node.parent
            if node.host_value is None:
                self._drop_subtree(node)
            if (parent is not self.root and parent.lock_ref == 0
                    and not any(c.value is not None for c in parent.children.values())):
                heapq.heappush(heap, parent)
        return freed

    def all_host_values(self) -> torch.Tensor:
        return self._collect("host_value", self.host_allocator.device)

    def close(self) -> None:
        self.copier.synchronize()
        if self.file_tier is not None:
            self.file_tier.close()

    def check_host_invariant(self) -> None:
        held = int(self.all_host_values().numel())
        free = self.host_allocator.available_size()
        if held + free != self.host_allocator.total_size:
            raise AssertionError(f"host KV accounting broken: held {held} + free {free} != "
                                 f"total {self.host_allocator.total_size}")
