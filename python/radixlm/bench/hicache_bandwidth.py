"""The hierarchical cache's copy bandwidth against what PCIe gives (`bench hicache --part
bandwidth`, CUDA only).

A device pool and a page-locked host pool shaped like a model's KV cache (its layers, KV heads,
head dim; bf16), and N tokens at scattered slots in each (a shuffled permutation, as a tree
that has run a while hands them out). Timed with CUDA events, median of the repeats:

- load: `TierCopier.to_device` (host -> device, the kernel reading host rows over PCIe);
- backup: `TierCopier.to_host` (device -> host);
- reference: one contiguous `copy_` of the same number of bytes from page-locked memory to the
  device and back (cudaMemcpyAsync by the copy engines), the pinned copy bandwidth.

Each copy is checked against the source rows once, so a fast wrong copy cannot pass.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlm.bench.common import cuda_median_seconds
from radixlm.core.model_config import ModelConfig
from radixlm.mem_cache.kv_transfer import TierCopier
from radixlm.mem_cache.pools import KVPool, PinnedHostMemory
from radixlm.model_executor.weight_source import load_hf_config

def measure(model_path: str, num_tokens: int, seed: int = 0) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise SystemExit("--part bandwidth needs a CUDA GPU")
    cfg = ModelConfig.from_hf(load_hf_config(model_path), None)
    layers, heads, dim = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    dtype, device = torch.bfloat16, torch.device("cuda")
    slots = 2 * num_tokens + 1
    device_pool = KVPool(slots, layers, heads, dim, dtype, device)
    host_pool = KVPool(slots, layers, heads, dim, dtype, "cpu", pin_memory=True,
                       single_allocation=True)
    copier = TierCopier(device_pool, host_pool)
    gen = torch.Generator().manual_seed(seed)
    host_perm = torch.randperm(slots - 1, generator=gen) + 1
    # On the GPU, as the server keeps them.
    host_slots = host_perm[:num_tokens].to(device)
    back = host_perm[num_tokens:2 * num_tokens].to(device)
    device_slots = (torch.randperm(slots - 1, generator=gen)[:num_tokens] + 1).to(device)
    for b in host_pool.buffers():
        b.normal_(generator=gen)

    def load() -> None:
        copier.to_device(host_slots, device_slots)

    def backup(to: torch.Tensor) -> None:
        copier.to_host(device_slots, to)

    # Correctness of both directions, once.
    load()
    torch.cuda.synchronize()
    for hb, db in zip(host_pool.buffers(), device_pool.buffers()):
        if not torch.equal(db[device_slots].cpu(), hb[host_slots.cpu()]):
            raise AssertionError("host -> device copy is wrong")
    backup(back)
    torch.cuda.synchronize()
    for hb in host_pool.buffers():
        if not torch.equal(hb[back.cpu()], hb[host_slots.cpu()]):
            raise AssertionError("device -> host copy is wrong")

    nbytes = num_tokens * KVPool.bytes_per_token(layers, heads, dim, dtype)
    pinned = torch.empty(nbytes, dtype=torch.uint8)
    keep = PinnedHostMemory(pinned)
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = {name: 1e3 * cuda_median_seconds(call) for name, call in (
        ("load_ms", load),
        ("backup_ms", lambda: backup(back)),
        ("pinned_h2d_ms", lambda: on_device.copy_(pinned, non_blocking=True)),
        ("pinned_d2h_ms", lambda: pinned.copy_(on_device, non_blocking=True)))}
    del keep
    gbps = {k.replace("_ms", "_gb_s"): nbytes / (v * 1e-3) / 1e9 for k, v in times.items()}
    result = {"model": model_path, "layers": layers, "kv_heads": heads, "head_dim": dim,
              "tokens": num_tokens, "bytes": nbytes, **times, **gbps,
              "load_vs_pinned": gbps["load_gb_s"] / gbps["pinned_h2d_gb_s"],
              "backup_vs_pinned": gbps["backup_gb_s"] / gbps["pinned_d2h_gb_s"],
              "gpu": torch.cuda.get_device_name()}
    print(f"hicache bandwidth, {num_tokens} tokens x {nbytes / num_tokens / 1024:.0f} KiB: "
          f"load {gbps['load_gb_s']:.1f} GB/s ({result['load_vs_pinned']:.0%} of pinned "
          f"{gbps['pinned_h2d_gb_s']:.1f}), backup {gbps['backup_gb_s']:.1f} GB/s "
          f"({result['backup_vs_pinned']:.0%} of pinned {gbps['pinned_d2h_gb_s']:.1f})",
          flush=True)
    return result
