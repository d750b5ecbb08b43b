"""The kernels of MLA's batch-1 decode path against the PyTorch code they replace:

  * `absorb_query` / `absorb_output` (layers/kernels/mla_absorb_kernels.py) against torch.bmm
    (and the concatenation with the rotated query part) in float32;
  * `rms_norm_leading` (norm_kernels.py) against RMSNorm's PyTorch norm of the leading values
    concatenated with the rest;
  * `store_rows` (attention/kernels/store_kv.py) against index assignment into the pool.

The DeepSeek model taking them at batch 1 is checked against HF transformers on the GPU by
tests/test_gpu_moe_mla.py (decode steps of one request).

CPU: under Triton's interpreter in a child process (by hand: TRITON_INTERPRET=1 python
tests/test_mla_decode_kernels.py). `gpu`: DeepSeek-V2-Lite's shapes on CUDA.
"""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import run_cpu_interpreter_cases, run_interpreter_cases

F32, BF16 = torch.float32, torch.bfloat16


def _ulps(dtype: torch.dtype, ref: torch.Tensor) -> float:
    """About one rounding of the output (the only one the kernels do; fp32: summation order)."""
    eps = 1e-6 if dtype == F32 else torch.finfo(dtype).eps
    return 2 * eps * ref.abs().max().item() + 1e-6


def check_absorb(nh: int, nope: int, lora: int, rope: int, v: int, dtype: torch.dtype,
                 device: str) -> float:
    from radixlm.layers.kernels.mla_absorb_kernels import absorb_output, absorb_query
    g = torch.Generator().manual_seed(nh * 31 + lora)
    # kv_b_proj's weight, viewed per head as the model does: [nh, nope + v, lora].
    w = (torch.randn(nh * (nope + v), lora, generator=g) * lora ** -0.5).to(device, dtype)
    w3 = w.view(nh, nope + v, lora)
    w_uk, w_uv = w3[:, :nope], w3[:, nope:]
    # q as q_proj leaves it: [1, nh, nope + rope], split into strided views.
    q = torch.randn(1, nh, nope + rope, generator=g).to(device, dtype)
    q_nope, q_rope = q.split([nope, rope], dim=-1)
    q_full = absorb_query(q_nope, w_uk, q_rope)
    ref = torch.cat([torch.bmm(q_nope.transpose(0, 1).float(), w_uk.float()).transpose(0, 1),
                     q_rope.float()], dim=-1)
    assert q_full.shape == (1, nh, lora + rope) and q_full.dtype == dtype
    err_q = (q_full.float() - ref).abs().max().item()
    assert err_q <= _ulps(dtype, ref), f"absorb_query: error {err_q:.3g}"
    assert torch.equal(q_full[..., lora:], q_rope), "the rope part is copied as it is"

    o_lat = torch.randn(1, nh * lora, generator=g).to(device, dtype).view(1, nh, lora)
    o = absorb_output(o_lat, w_uv)
    ref = torch.bmm(o_lat.transpose(0, 1).float(), w_uv.float().transpose(1, 2))
    ref = ref.transpose(0, 1).reshape(1, nh * v)
    assert o.shape == (1, nh * v) and o.dtype == dtype
    err_o = (o.float() - ref).abs().max().item()
    assert err_o <= _ulps(dtype, ref), f"absorb_output: error {err_o:.3g}"
    return max(err_q, err_o)


def check_norm_leading(t: int, width: int, n: int, dtype: torch.dtype, device: str) -> float:
    from radixlm.layers.kernels.norm_kernels import rms_norm_leading
    from radixlm.layers.norm import RMSNorm
    g = torch.Generator().manual_seed(t * 7 + n)
    norm = RMSNorm(width, 1e-6).to(device)
    norm.weight.data = (1 + 0.1 * torch.randn(width, generator=g)).to(device)
    x = (3 * torch.randn(t, n + 5, generator=g)).to(device, dtype)[:, 5:]    # strided rows
    out = rms_norm_leading(x, norm.weight, norm.eps, width)
    ref = torch.cat([norm._norm(x[:, :width]), x[:, width:]], dim=-1)
    assert out.shape == x.shape and out.is_contiguous()
    assert torch.equal(out[:, width:], x[:, width:]), "the rest is copied as it is"
    err = (out.float() - ref.float()).abs().max().item()
    # One rounding of the output apart (the mean's summation order).
    assert err <= _ulps(dtype, ref.float()), f"rms_norm_leading: error {err:.3g}"
    return err


def check_store_rows(device: str) -> None:
    from radixlm.layers.attention.kernels.store_kv import store_rows
    g = torch.Generator().manual_seed(5)
    buf = torch.zeros(40, 1, 72, dtype=BF16, device=device)
    # bf16 rows, as the model writes them (Triton 3.9's interpreter rounds fp32 -> bf16
    # toward zero, so a casting store is not checked here).
    x = torch.randn(6, 72, generator=g).to(device, BF16)
    locs = torch.tensor([3, 17, 0, 39, 8, 21], device=device)
    store_rows(x.view(6, 1, 72), buf, locs)
    want = torch.zeros_like(buf)
    want[locs] = x.view(6, 1, 72)
    assert torch.equal(buf, want)


def _interpreter_cases():
    return [
        ("absorb nh=3 nope=24 lora=40 rope=8 v=16 fp32",
         lambda: check_absorb(3, 24, 40, 8, 16, F32, "cpu")),
        ("absorb nh=2 nope=32 lora=128 rope=16 v=32 bf16",
         lambda: check_absorb(2, 32, 128, 16, 32, BF16, "cpu")),
        ("norm leading t=3 width=40 n=48 fp32", lambda: check_norm_leading(3, 40, 48, F32, "cpu")),
        ("norm leading t=1 width=64 n=72 bf16",
         lambda: check_norm_leading(1, 64, 72, BF16, "cpu")),
        ("store_rows", lambda: check_store_rows("cpu")),
    ]


def test_interpreter_cases():
    run_cpu_interpreter_cases(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_gpu_absorb_deepseek_shapes(dtype):
    check_absorb(16, 128, 512, 64, 128, dtype, "cuda")       # DeepSeek-V2-Lite
    check_absorb(128, 128, 512, 64, 128, dtype, "cuda")      # V3's 128 heads


@pytest.mark.gpu
def test_gpu_norm_leading_and_store():
    for t in (1, 7, 300):
        check_norm_leading(t, 512, 576, BF16, "cuda")
    check_store_rows("cuda")


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
