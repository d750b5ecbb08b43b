"""Fused Triton kernels for the small per-token ops: RMSNorm (+ residual add), SiLU-and-mul and
rotary embedding.

This package's `__init__` does not import Triton; the kernel modules (`norm_kernels`,
`activation_kernels`, `rotary_kernels`) do, so the layers import them only inside their fused
branch, after `use_fused` said yes. A CPU install without Triton never imports them.

The fused path is taken when all of these hold (`use_fused`):
  * the tensor is on CUDA,
  * RADIXLM_DISABLE_FUSED_OPS is not set (read at every call, like the other knobs in envs.py),
  * Triton imports,
  * torch.compile is not tracing the caller (--enable-torch-compile: inductor fuses the plain
    PyTorch code itself; model_executor/torch_compile.py).
Otherwise the layers run their plain PyTorch code, unchanged.

All wrappers are CUDA-graph capturable: outputs are allocated from shapes only, launch grids
depend on shapes only, and nothing reads device memory on the host. Each kernel must run once
outside capture first (Triton compiles on first use), as any graph runner's warm-up does.
"""

from __future__ import annotations

import functools

import torch

import radixlm.envs as envs


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install that fails while importing
        return False
    return True


def use_fused(x: torch.Tensor) -> bool:
    """Whether the layers should run their fused Triton kernel on `x` (see the module doc)."""
    if torch.compiler.is_compiling():
        return False
    return x.is_cuda and not envs.disable_fused_ops() and triton_available()


def takes_one_row_gemv(x: torch.Tensor) -> bool:
    """Whether a product of `x` may go to the one-row GEMV (gemv_kernels.py): one row, the fused
    path on, RADIXLM_DISABLE_GEMV unset. (is_compiling first: under torch.compile the row
    count is symbolic, and comparing it with 1 would be a data-dependent guard.)"""
    return (not torch.compiler.is_compiling() and x.shape[0] == 1 and use_fused(x)
            and not envs.disable_gemv())
