"""The MLA Triton kernels (kernels/mla_attention.py) through the Triton backend over a latent
pool, against the torch_native backend on the same pool in fp32.

  * `test_interpreter_small_cases`: tiny shapes under the Triton CPU interpreter in a child
    process (TRITON_INTERPRET is read when the kernel modules are imported). By hand:
        TRITON_INTERPRET=1 python tests/test_mla_attention.py
  * `gpu` tests: DeepSeek's real latent (512 + 64) with 16 and 128 heads, decode and extend
    (with cached prefixes), bf16; skipped without CUDA.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import run_cpu_interpreter_cases, run_interpreter_cases
from radixlm.core.forward_batch import ForwardBatch, ForwardMode
from radixlm.layers.attention.torch_native import TorchNativeAttnBackend
from radixlm.mem_cache.pools import MLAKVPool, ReqToTokenPool

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
LAYER_ID = 1


@dataclass
class MLALayer:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int          # lora + rope
    v_head_dim: int        # lora
    scaling: float


def run_mla_case(prefix_lens: list[int], extend_lens: list[int], heads: int, lora: int,
                 rope: int, dtype: torch.dtype, device: str, decode: bool = False,
                 seed: int = 0, **backend_kwargs) -> float:
    from radixlm.layers.attention.triton_backend import TritonAttnBackend

    g = torch.Generator().manual_seed(seed)
    d = lora + rope
    bs = len(prefix_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    total, t = sum(seq_lens), sum(extend_lens)
    num_slots = total + 1 + 29
    slots = (torch.randperm(num_slots - 1, generator=g)[:total] + 1).split(seq_lens)
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    table = ReqToTokenPool(bs + 2, max(seq_lens) + 4, device)
    for r, s in zip(rows.tolist(), slots):
        table.write(r, 0, s.to(device))
    out_loc = torch.cat([s[p:] for s, p in zip(slots, prefix_lens)]).to(device)

    pool = MLAKVPool(num_slots, 2, d, lora, dtype, device)
    ref_pool = MLAKVPool(num_slots, 2, d, lora, torch.float32, device)
    for buf, ref in zip(pool.k_buffers, ref_pool.k_buffers):
        buf.copy_(torch.randn(buf.shape, generator=g).to(dtype))
        ref.copy_(buf)
    q = torch.randn(t, heads * d, generator=g).to(dtype).to(device)
    latent = torch.randn(t, d, generator=g).to(dtype).to(device)
    layer = MLALayer(LAYER_ID, heads, 1, d, lora, scaling=0.3 * d ** -0.5)
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens)])
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=bs,
        input_ids=torch.zeros(t, dtype=torch.int64, device=device),
        positions=positions.to(device), out_cache_loc=out_loc, req_pool_indices=rows.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=list(prefix_lens),
        extend_seq_lens_cpu=list(extend_lens))

    backend = TritonAttnBackend(pool, table, **backend_kwargs)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, latent, latent[:, :lora], layer, fb)
    ref_backend = TorchNativeAttnBackend(ref_pool, table)
    ref_backend.init_forward_metadata(fb)
    with sdpa_kernel([SDPBackend.MATH]):
        ref = ref_backend.forward(q.float(), latent.float(), latent[:, :lora].float(), layer, fb)
    assert torch.equal(pool.k_buffers[LAYER_ID][out_loc], latent.view(-1, 1, d))
    assert out.shape == (t, heads * lora) and out.dtype == dtype
    err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    kind = "decode" if decode else "extend"
    assert err <= TOL[dtype], (f"{kind} prefix={prefix_lens} extend={extend_lens}: max error "
                               f"{err:.3g} of max |ref|")
    return err


def _interpreter_cases():
    small = dict(decode_block_n=16, extend_block_m=16, extend_block_n=16)
    for dt in (torch.float32, torch.float16):   # not bf16: see tests/test_moe.py
        name = str(dt)[6:]
        yield f"decode 4 heads lora 32 rope 8 {name}", lambda dt=dt: run_mla_case(
            [5, 40, 0, 17], [1, 1, 1, 1], 4, 32, 8, dt, "cpu", decode=True, **small)
        yield f"decode 20 heads (two head blocks) {name}", lambda dt=dt: run_mla_case(
            [70, 3], [1, 1], 20, 16, 16, dt, "cpu", decode=True, **small)
        yield f"extend with prefixes {name}", lambda dt=dt: run_mla_case(
            [0, 9, 33], [21, 1, 18], 3, 32, 8, dt, "cpu", **small)


def test_interpreter_small_cases():
    run_cpu_interpreter_cases(__file__)


def test_latent_pool_splits_at_mla_granularity():
    """The backend splits a latent pool's contexts at MLA's 32 tokens, a K/V pool's at 64."""
    pytest.importorskip("triton")
    from radixlm.layers.attention.kernels.decode_attention import MIN_TOKENS_PER_SPLIT
    from radixlm.layers.attention.kernels.mla_attention import MLA_MIN_TOKENS_PER_SPLIT
    from radixlm.layers.attention.triton_backend import TritonAttnBackend
    from radixlm.mem_cache.pools import KVPool
    table = ReqToTokenPool(2, 64, "cpu")
    latent = TritonAttnBackend(MLAKVPool(64, 1, 24, 16, torch.float32, "cpu"), table)
    dense = TritonAttnBackend(KVPool(64, 1, 2, 8, torch.float32, "cpu"), table)
    assert (latent.min_tokens_per_split, dense.min_tokens_per_split) == (
        MLA_MIN_TOKENS_PER_SPLIT, MIN_TOKENS_PER_SPLIT)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "extend"])
def test_gpu_deepseek_latent(heads, decode):
    if decode:
        run_mla_case([4095, 17, 900, 0], [1, 1, 1, 1], heads, 512, 64, torch.bfloat16, "cuda",
                     decode=True)
    else:
        run_mla_case([0, 300, 1000], [700, 64, 129], heads, 512, 64, torch.bfloat16, "cuda")


if __name__ == "__main__":
    sys.exit(run_interpreter_cases(_interpreter_cases()))
