"""Which GPUs a process sees: `--base-gpu-id` and `--dp-size` pick GPUs by index among the
visible ones (CUDA_VISIBLE_DEVICES, else all). A single-GPU child is pinned to one through its
environment, so that inside it the GPU is simply `cuda` (device 0); the tensor-parallel ranks of
a node see all of the node's ranks' GPUs (`node_env`) and each makes its own current."""

from __future__ import annotations

import os


def visible_gpus() -> list[str]:
    """The ids of the GPUs this process may use, as CUDA_VISIBLE_DEVICES would name them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch
    return [str(i) for i in range(torch.cuda.device_count())]


def node_env(first: int, count: int) -> dict[str, str]:
    """This process's environment with visible GPUs `first` .. `first + count - 1` left visible
    (a node's tensor-parallel ranks)."""
    gpus = visible_gpus()
    if first + count > len(gpus):
        raise ValueError(f"--base-gpu-id: GPUs {first}..{first + count - 1} do not all exist "
                         f"(this machine has {len(gpus)} visible)")
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus[first:first + count])}


def pinned_env(gpu_index: int) -> dict[str, str]:
    """This process's environment with only visible GPU `gpu_index` left visible."""
    gpus = visible_gpus()
    if gpu_index >= len(gpus):
        raise ValueError(f"--base-gpu-id: GPU {gpu_index} does not exist (this machine has "
                         f"{len(gpus)} visible)")
    return {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[gpu_index]}


def check_device_flags(device: str | None, attention_backend: str | None) -> None:
    """Refuse, before anything loads, a --device cuda without a GPU and Triton attention on
    the CPU (its kernels need a GPU; TRITON_INTERPRET=1, the tests' interpreter, excepted)."""
    has_gpu = bool(visible_gpus())
    if device is not None and device.startswith("cuda") and not has_gpu:
        raise ValueError(f"--device {device}: no GPU is visible")
    on_cpu = device == "cpu" or (device is None and not has_gpu)
    if (attention_backend == "triton" and on_cpu
            and os.environ.get("TRITON_INTERPRET") != "1"):
        raise ValueError("--attention-backend triton: needs a GPU (on the CPU: torch_native, "
                         "the default there)")
