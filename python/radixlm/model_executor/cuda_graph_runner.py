"""CUDA graphs for decode steps (`--disable-cuda-graph` turns them off).

A decode step of a small batch is dominated by the CPU launching a few hundred small kernels.
Capturing the whole step (attention metadata, every layer, the LM head) once per batch size and
replaying it makes the launch cost one call.

How a step runs through a graph:
  * batch sizes 1, 2, 4, 8, every 8 up to 64, every 16 up to 128, then every 32 up to
    --cuda-graph-max-bs are captured at start-up, smallest first (see `capture`), all sharing
    one memory pool and one logits buffer (only one graph ever runs at a time). Fewer sizes at
    the top keep start-up short; a step padded to the next size costs little there (decode
    reads the weights once whatever the batch);
  * a batch of B requests uses the smallest captured size >= B; the padded rows write their K/V
    into the pool's padding slot 0, read one token of request row 0, and their logits are dropped;
  * the inputs are copied into the graph's static buffers, the graph replays, and the logits come
    out of the graph's static output buffer (valid until the next replay).
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch, ForwardMode
from radixlm.layers.attention.base import AttentionBackend
from radixlm.model_executor.forward_pass import run_model

if TYPE_CHECKING:
    from radixlm.model_executor.torch_compile import CompiledDecode

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int) -> list[int]:
    steps = [*range(1, 3), 4, *range(8, 65, 8), *range(80, 129, 16), *range(160, max_bs + 1, 32)]
    sizes = [s for s in steps if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(set(sizes))


_NO_TREE = 1 << 62     # a tree_start no row reaches: nothing masked


class CudaGraphRunner:
    """Captures `run_model` (the runner's own forward) for decode batches of up to max_bs
    requests; the backend must already hold the pools the graphs will read and write."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, device: torch.device,
                 max_bs: int, compiled: "CompiledDecode | None" = None,
                 draft_trees: bool = False, batch_sizes: list[int] | None = None):
        """`compiled`: --enable-torch-compile's forward (already compiled), captured instead
        of the eager one for the sizes it covers. `draft_trees`: capture graphs that take the
        rows' draft-tree masks (ForwardBatch.tree_start / tree_mask), for speculative trees; a step
        without a tree then runs them with nothing masked. `batch_sizes` (--cuda-graph-bs): the
        sizes to capture, instead of capture_batch_sizes(max_bs); one above max_bs (the
        running-request limit) is max_bs."""
        self.model = model
        self.compiled = compiled
        self.backend = backend
        self.device = device
        sizes = sorted({min(b, max_bs) for b in batch_sizes or ()})
        self.batch_sizes = sizes or capture_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        dev = device
        # Static inputs; padded rows keep these values (slot 0 is the KV pool's padding slot).
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int64, device=dev)
        # Draft trees: a row sees keys from tree_start on only where its mask has their bit;
        # 2^62 (never reached) with no bits masks nothing.
        self.tree_start = self.tree_mask = None
        if draft_trees:
            self.tree_start = torch.full((self.max_bs,), _NO_TREE, dtype=torch.int64, device=dev)
            self.tree_mask = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Every graph writes its logits into rows [:bs] of this one buffer, allocated outside
        # the graphs' pool: an output each graph kept in the pool would pin a piece of it, and
        # the next capture could not reuse it (the 8B shape at --cuda-graph-max-bs 256: 1.7
        # GiB with a logits tensor per graph, 0.8 GiB with this buffer). The exception is the
        # torch.compile forward, whose own output tensor its graphs keep (`_run_static`).
        self.logits_out: torch.Tensor | None = None
        self.outputs: dict[int, torch.Tensor] = {}    # each graph's logits, [bs, V]
        self._mem_pool: torch.cuda.MemPool | None = None    # the graphs' pool (`_fill_pool`)
        self._tree_rows = 0      # rows of the static tree inputs a tree step has set
        self._rows_written = 0   # rows of the static inputs a replay has set since capture
        # Per batch size: the first rows of the five static inputs and of its graph's logits
        # (slicing them anew costs microseconds of host time a replay)
        self._views: dict[int, tuple[list[torch.Tensor], torch.Tensor]] = {}
        self.pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.forward_mode.is_decode and 0 < fb.batch_size <= self.max_bs
                and not fb.input_logprob_rows
                and (fb.tree_mask is None or self.tree_mask is not None))

    # ------------------------------------------------------------------ capture

    @torch.inference_mode()
    def capture(self) -> None:
        self._views.clear()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        # Smallest first. On an H200 (driver 580, torch 2.11) the order decides how fast every
        # graph later replays: captured largest first, with the batch-1 graph holding the GEMV
        # kernels no larger batch runs, every replay of every size paid ~0.37 us more between
        # its kernels (+0.13 ms a step on Qwen3-0.6B, all sizes alike); smallest first, all
        # sizes replayed at the fast rate (benchmarks/results/graph_order/). Any graph captured
        # later can still move the process to the slow rate, so capture everything here.
        with torch.cuda.stream(stream):
            self._fill_pool()
            for bs in self.batch_sizes:
                self._capture_one(bs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        logger.info("captured CUDA graphs for decode batch sizes %s", self.batch_sizes)

    def _fill_pool(self) -> None:
        """Run the largest batch once, eagerly, with its activations allocated in the graphs'
        pool. Captured smallest first, each graph would otherwise find only blocks too small
        for it there and grow the pool; now every capture splits the largest batch's blocks
        (the 8B shape at --cuda-graph-max-bs 256: 1.26 GiB without this run, 0.82 GiB with
        it, as much as the graphs took captured largest first)."""
        self._mem_pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self._mem_pool):
            self._run_static(self._static_batch(self.max_bs))
        self.pool = self._mem_pool.id

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=self.input_ids[:bs],
            positions=self.positions[:bs], out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs], seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=[1] * bs, extend_prefix_lens_cpu=[0] * bs, extend_seq_lens_cpu=[1] * bs,
            tree_start=None if self.tree_start is None else self.tree_start[:bs],
            tree_mask=None if self.tree_mask is None else self.tree_mask[:bs])

    def _run_static(self, fb: ForwardBatch, logits_out: torch.Tensor | None = None
                    ) -> torch.Tensor:
        if self.compiled is not None and self.compiled.can_run(fb):
            # The compiled forward makes its own logits tensor (at most
            # --torch-compile-max-bs rows); copying it into `logits_out` would cost a copy a
            # step, so its graph keeps it.
            self.backend.init_forward_metadata_capture(fb)
            return self.compiled(fb)
        _, logits = run_model(self.model, self.backend, fb, capturing=True,
                              logits_out=logits_out)
        return logits

    def _capture_one(self, bs: int) -> None:
        fb = self._static_batch(bs)
        # Warm-up: Triton compiles and cuBLAS picks its kernels outside capture.
        logits = self._run_static(fb)
        if self.logits_out is None:
            self.logits_out = logits.new_empty(self.max_bs, logits.shape[1])
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.current_stream()):
            self.outputs[bs] = self._run_static(fb, self.logits_out[:bs])
        if self.pool is None:       # (`_fill_pool` sets it; a capture without it still shares)
            self.pool = graph.pool()
        self.graphs[bs] = graph

    # ------------------------------------------------------------------ replay

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Run a decode batch through its graph; returns [B, V] logits (a view of the graphs'
        output, overwritten by the next replay)."""
        bs = fb.batch_size
        padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]
        stale = min(padded, self._rows_written)
        if stale > bs:   # padding rows a larger batch wrote: back to the padding slot
            self.out_cache_loc[bs:stale].zero_()
            self.req_pool_indices[bs:stale].zero_()
            self.seq_lens[bs:stale].fill_(1)
        self._rows_written = max(bs, self._rows_written if self._rows_written > padded else 0)
        views = self._views.get(bs)
        if views is None:
            views = self._views[bs] = (
                [self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs],
                 self.req_pool_indices[:bs], self.seq_lens[:bs]], self.outputs[padded][:bs])
        # One dispatch for the five copies (each is a few microseconds of host time, and a
        # verify step's host work before its replay is all on the critical path).
        torch._foreach_copy_(
            views[0],
            [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices, fb.seq_lens],
            non_blocking=True)
        if self.tree_mask is not None:
            if fb.tree_mask is not None:
                self.tree_start[:bs].copy_(fb.tree_start, non_blocking=True)
                self.tree_mask[:bs].copy_(fb.tree_mask, non_blocking=True)
                self._tree_rows = max(self._tree_rows, bs)
            elif self._tree_rows:     # (the last tree step's rows: mask nothing again)
                self.tree_start[:self._tree_rows].fill_(_NO_TREE)
                self._tree_rows = 0
        self.graphs[padded].replay()
        return views[1]
