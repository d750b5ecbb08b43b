"""Programmatic dependent launch (PDL) for the decode step's chain of small Triton kernels.

A decode step at batch 1 is ~12 kernels a layer, most of them a few microseconds long. Without
PDL each kernel starts only after the previous one has finished and drained, and then spends
its first microsecond or two ramping up (launching its programs, waiting for its first loads).
With PDL (Hopper and later) a kernel launched with the `launch_pdl` attribute may start while
the previous one is still running, as soon as every program of the previous one has signalled
`gdc_launch_dependents`; it then blocks in `gdc_wait` until the previous kernel has completed
and its writes are visible. Work before the wait overlaps the previous kernel's tail: the
GEMV issues its first weight loads there (weights are never written by a step).

The protocol every kernel taking `PDL` follows (`pdl_kwargs` turns it on):
  1. `pdl_launch_dependents(PDL)` first: the next kernel may launch (its programs take free
     slots of the SMs; none of this kernel's programs can be starved, as the signal needs all
     of them running).
  2. Before `pdl_wait(PDL)`: only index arithmetic and loads of data no kernel of the step
     writes (weights, norm weights).
  3. `pdl_wait(PDL)` before any other load and before any store. Ordering is transitive: this
     kernel's predecessor waited for its own before finishing, so every earlier kernel has
     completed too. A kernel launched without the attribute (cuBLAS, PyTorch's) after a PDL
     kernel waits for it in full, as usual; a PDL kernel after such a kernel starts when it
     completes (it never signals early).

CUDA graphs keep the attribute as a programmatic edge between kernel nodes (captured decode
steps are where this pays). `RADIXLM_DISABLE_PDL=1` launches every kernel the usual way.

Here in utils/ because the kernels of layers/ and of distributed/ (the all-reduce + RMSNorm)
both use it, and layers/ imports distributed/.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixlm import envs

try:  # Triton >= 3.3 on NVIDIA
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def pdl_launch_dependents(PDL: tl.constexpr):
    """Let the next kernel launch (a no-op unless PDL)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Block until the previous kernel has completed and its writes are visible (a no-op
    unless PDL)."""
    if PDL:
        gdc_wait()


def _triton_has_pdl() -> bool:
    if gdc_wait is None:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover - Triton without the NVIDIA backend
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=None)
def _device_supports_pdl(device_index: int) -> bool:
    # NVIDIA only: a ROCm build reports AMD GPUs through torch.cuda too (MI300: "9.4").
    return (torch.version.hip is None
            and torch.cuda.get_device_capability(device_index)[0] >= 9 and _triton_has_pdl())


# Largest batch (rows, i.e. tokens, of the launching layer) whose kernels take PDL: one.
# Measured on an H200 (`bench overlap`, PDL at every batch size against none, same call;
# benchmarks/results/issue12/pdl/): batch 1 gains, where the GEMV takes the linear layers and
# requests its first weights before the wait (Qwen3-0.6B +22%, Llama-3.2-1B +10%,
# Llama-3.1-8B +3%). Batches of 2-4 (cuBLAS GEMMs, PDL edges between the small kernels only)
# were even; 8-64 lost 1-3% (Qwen3-0.6B, Llama-3.1-8B at 8), and a 1B model's batch-256
# decode step 16%: a big grid launched early, while the previous kernel still holds part of
# the GPU, is spread less evenly over the SMs and its tail grows. The FP8 one-row kernel takes
# PDL (Llama-3.1-8B FP8 +6%); the 4-bit one, a grid of column blocks x K splits, lost 16% with
# it and launches plainly. The tensor-parallel all-reduce + RMSNorm kernel takes it too
# (distributed/fused_all_reduce_norm.py: Llama-3.1-8B TP2 batch 1 3.02 -> 2.92 ms a step).
DEFAULT_MAX_ROWS = 1


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` can launch with PDL: a CUDA GPU of compute capability 9.0+,
    a Triton that can launch with the attribute, and RADIXLM_DISABLE_PDL unset."""
    if device.type != "cuda" or envs.disable_pdl():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_supports_pdl(index)


def pdl_kwargs(device: torch.device, rows: int) -> dict:
    """Launch keyword arguments for a kernel with a `PDL: tl.constexpr` parameter working on
    `rows` rows (tokens): the constexpr and Triton's `launch_pdl` option together where PDL
    is on and the batch small enough, else nothing (PDL defaults to False)."""
    limit = envs.pdl_max_rows()
    if rows > (DEFAULT_MAX_ROWS if limit is None else limit) or not pdl_enabled(device):
        return {}
    return {"PDL": True, "launch_pdl": True}
