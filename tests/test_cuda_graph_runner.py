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


@pytest.mark.gpu
def test_gpu_cuda_graph_bs_captures_exactly_those_sizes(tmp_path):
    """--cuda-graph-bs: the graphs are those sizes (one above the running-request limit is
    the limit), and a batch runs in the smallest that fits."""
    runner, _ = create_runner_and_kv(RunnerConfig(
        model_path=tiny_checkpoint(tmp_path, "llama"), device="cuda", dtype="float32",
        max_total_tokens=1024, max_running_requests=24, cuda_graph_bs=[4, 1, 12, 64]))
    gr = runner.graph_runner
    assert gr.batch_sizes == [1, 4, 12, 24] and gr.max_bs == 24
    assert runner.max_graph_batch_size == 24


def test_replay_pads_every_row_its_graph_reads():
    """Whatever batches ran before, a replay's graph sees the batch's rows in [:bs] and the
    padding values (KV slot 0, request slot 0, length 1) in [bs:padded]: rows a larger batch
    left behind are reset, rows nothing wrote are left alone (no host work for them). The
    bookkeeping runs on the CPU here, the graph replaced by a snapshot of its inputs."""
    from radixlm.model_executor.cuda_graph_runner import CudaGraphRunner

    gr = CudaGraphRunner.__new__(CudaGraphRunner)
    gr.max_bs, gr.batch_sizes = 16, [1, 2, 4, 8, 16]
    for name in ("input_ids", "positions", "out_cache_loc", "req_pool_indices"):
        setattr(gr, name, torch.zeros(16, dtype=torch.int64))
    gr.seq_lens = torch.ones(16, dtype=torch.int64)
    gr.tree_mask = None
    gr._rows_written, gr._views = 0, {}
    seen = []

    class Snapshot:
        def __init__(self, padded):
            self.padded = padded

        def replay(self):
            seen.append((self.padded, gr.out_cache_loc[:self.padded].clone(),
                         gr.req_pool_indices[:self.padded].clone(),
                         gr.seq_lens[:self.padded].clone(), gr.input_ids[:self.padded].clone()))

    gr.graphs = {bs: Snapshot(bs) for bs in gr.batch_sizes}
    gr.outputs = {bs: torch.zeros(bs, 3) for bs in gr.batch_sizes}

    class Batch:
        def __init__(self, bs, base):
            self.batch_size = bs
            ar = torch.arange(base, base + bs)
            self.input_ids, self.positions, self.out_cache_loc = ar + 7, ar + 100, ar + 1
            self.req_pool_indices, self.seq_lens = ar + 1, ar + 101

    for bs in (13, 3, 1, 5, 2, 16, 6, 6, 1, 12, 7):
        logits = gr.replay(Batch(bs, base=10 * bs))
        padded, locs, slots, lens, ids = seen[-1]
        assert logits.shape[0] == bs and logits.data_ptr() == gr.outputs[padded].data_ptr()
        assert padded == gr.batch_sizes[[b >= bs for b in gr.batch_sizes].index(True)]
        assert locs[:bs].tolist() == list(range(10 * bs + 1, 11 * bs + 1))
        assert ids[:bs].tolist() == list(range(10 * bs + 7, 11 * bs + 7))
        assert (locs[bs:] == 0).all() and (slots[bs:] == 0).all() and (lens[bs:] == 1).all(), bs
