"""The decode CUDA graphs' capture (model_executor/cuda_graph_runner.py): smallest batch first,
one pool filled by the largest batch, one logits buffer that every graph writes through
`compute_logits(out=)`."""

import pytest
import torch

from helpers import tiny_checkpoint
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compute_logits_writes_into_out(tmp_path, dtype):
    """With `out`, the LM head's logits land in that (float32) tensor, equal to the returned
    logits without it, and nothing beyond its rows is touched."""
    runner, _ = create_runner_and_kv(RunnerConfig(
        model_path=tiny_checkpoint(tmp_path, "llama"), device="cpu", dtype=dtype,
        max_total_tokens=256))
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(
        getattr(torch, dtype))
    ref = runner.model.compute_logits(hidden)
    buf = torch.full((5, ref.shape[1]), float("nan"))
    got = runner.model.compute_logits(hidden, out=buf[:3])
    assert ref.dtype == torch.float32
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(buf[:3], ref)
    assert buf[3:].isnan().all()


@pytest.mark.gpu
def test_gpu_graphs_smallest_first_one_logits_buffer(tmp_path, monkeypatch):
    """The graphs are captured smallest first, every replay returns rows of the one logits
    buffer, and a replay's logits (padded batch included) equal the eager forward's."""
    from radixlm.model_executor.cuda_graph_runner import CudaGraphRunner
    from radixlm.model_executor.forward_pass import run_model

    order: list[int] = []
    capture_one = CudaGraphRunner._capture_one

    def recorded(self, bs):
        order.append(bs)
        capture_one(self, bs)

    monkeypatch.setattr(CudaGraphRunner, "_capture_one", recorded)
    runner, kv = create_runner_and_kv(RunnerConfig(
        model_path=tiny_checkpoint(tmp_path, "llama"), device="cuda", dtype="float32",
        max_total_tokens=1024, cuda_graph_max_bs=16))
    gr = runner.graph_runner
    assert order == sorted(gr.batch_sizes) and len(order) > 1
    assert tuple(gr.logits_out.shape) == (16, runner.model_config.vocab_size)
    # Row i: request slot i, its one token in KV slot i + 1 (not the padding slot 0 that the
    # captured static batch shares between rows).
    table = kv.req_to_token_pool.req_to_token
    table[:16, 0] = torch.arange(1, 17, dtype=table.dtype)
    gen = torch.Generator().manual_seed(0)
    for bs in (1, 3, 16):          # 3 runs in the graph of 4
        fb = gr._static_batch(bs)
        fb.input_ids.copy_(torch.randint(0, 1000, (bs,), generator=gen))
        fb.out_cache_loc.copy_(torch.arange(1, bs + 1))
        fb.req_pool_indices.copy_(torch.arange(bs))
        _, eager = run_model(runner.model, runner.attn_backend, fb)
        eager = eager.clone()
        replayed = gr.replay(fb)
        assert replayed.data_ptr() == gr.logits_out.data_ptr()
        assert replayed.shape == eager.shape
        torch.testing.assert_close(replayed, eager, rtol=1e-4, atol=1e-4)
