"""ModelRunner: owns the model, the memory pools and the attention backend on one device.

It turns a ForwardBatch into next-token logits (and prompt logprobs when asked). It knows
nothing about requests, queues or the radix tree; the scheduler does.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from radixlm.config import ServerArgs
from radixlm.layers.attention.base import create_attention_backend
from radixlm.layers.logits import InputLogprobs, compute_input_logprobs, last_token_hidden
from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool
from radixlm.core.forward_batch import ForwardBatch
from radixlm.model_executor.loader import load_model
from radixlm.model_executor.model_config import ModelConfig, resolve_dtype
from radixlm.model_executor.weight_source import load_hf_config, resolve_model_dir

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384
DEFAULT_MAX_RUNNING_REQUESTS = 1024


@dataclass
class ForwardOutput:
    next_token_logits: torch.Tensor              # [B, V] float32
    input_logprobs: list[InputLogprobs] | None   # per request, when fb.input_logprob_rows is set


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ModelRunner:
    def __init__(self, args: ServerArgs):
        self.args = args
        self.device = torch.device(args.device) if args.device else default_device()
        self.hf_dir, self.load_format = resolve_model_dir(args.model_path, args.load_format)
        self.tokenizer_path = args.tokenizer_path or self.hf_dir
        hf_config = load_hf_config(self.hf_dir)
        self.model_config = ModelConfig.from_hf(hf_config, args.context_length,
                                                _generation_eos(self.hf_dir))
        self.dtype = resolve_dtype(args.dtype, hf_config, self.device)
        torch.manual_seed(args.random_seed)
        self.model = load_model(self.model_config, self.hf_dir, self.load_format, self.device,
                                self.dtype, seed=args.random_seed)
        self._init_memory()
        self.attn_backend = create_attention_backend(self.attention_backend_name)
        self.graph_runner = self._init_cuda_graphs()

    def _init_cuda_graphs(self):
        if (self.device.type != "cuda" or self.args.disable_cuda_graph
                or self.args.cuda_graph_max_bs < 1 or not self.attn_backend.supports_cuda_graph):
            return None
        from radixlm.model_executor.cuda_graph_runner import CudaGraphRunner
        graph_runner = CudaGraphRunner(self, self.args.cuda_graph_max_bs)
        graph_runner.capture()
        return graph_runner

    @property
    def attention_backend_name(self) -> str:
        """--attention-backend, else the project's Triton kernels on CUDA, torch_native on CPU."""
        if self.args.attention_backend:
            return self.args.attention_backend
        return "triton" if self.device.type == "cuda" else "torch_native"

    # ------------------------------------------------------------------ memory

    def _init_memory(self) -> None:
        mc, args = self.model_config, self.args
        per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, self.dtype)
        if args.max_total_tokens is not None:
            total = args.max_total_tokens
        elif self.device.type == "cuda":
            free, total_mem = torch.cuda.mem_get_info(self.device)
            used = total_mem - free
            budget = total_mem * args.mem_fraction_static - used
            if budget <= per_token * 1024:
                raise RuntimeError(f"--mem-fraction-static {args.mem_fraction_static} leaves no "
                                   f"room for the KV cache after loading the model")
            total = int(budget // per_token)
        else:
            total = CPU_DEFAULT_MAX_TOTAL_TOKENS
        ps = args.page_size
        # +1 page for the padding page 0 that is never handed out.
        num_slots = (total // ps + 1) * ps
        self.max_total_num_tokens = num_slots - ps
        self.max_running_requests = args.max_running_requests or min(
            DEFAULT_MAX_RUNNING_REQUESTS, max(self.max_total_num_tokens // 2, 1))
        self.req_to_token_pool = ReqToTokenPool(self.max_running_requests + 1,
                                                mc.context_len + 8, self.device)
        # The last token sampled for each request slot: the next decode step reads its input ids
        # from here on the device, so it can be launched before the host has seen them.
        self.last_token_ids = torch.zeros(self.req_to_token_pool.size, dtype=torch.int64,
                                          device=self.device)
        self.kv_pool = KVPool(num_slots, mc.num_layers, mc.num_kv_heads, mc.head_dim, self.dtype,
                              self.device)
        self.allocator = KVAllocator(num_slots, ps, self.device)
        logger.info("KV cache: %d tokens (%.1f MiB), %d max running requests",
                    self.max_total_num_tokens, num_slots * per_token / 2**20,
                    self.max_running_requests)

    @functools.cached_property
    def weight_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, input_logprob_targets: list[list[int]] | None = None,
                input_top_k: list[int] | None = None) -> ForwardOutput:
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return ForwardOutput(next_token_logits=self.graph_runner.replay(fb),
                                 input_logprobs=None)
        self.attn_backend.init_forward_metadata(fb)
        hidden = self.model(fb.input_ids, fb.positions, fb)
        logits = self.model.compute_logits(last_token_hidden(hidden, fb))
        input_logprobs = None
        if fb.input_logprob_rows and any(fb.input_logprob_rows):
            input_logprobs = compute_input_logprobs(self.model, hidden, fb,
                                                    input_logprob_targets or [],
                                                    input_top_k or [0] * fb.batch_size)
        return ForwardOutput(next_token_logits=logits, input_logprobs=input_logprobs)


def _generation_eos(hf_dir: str) -> tuple[int, ...]:
    """EOS ids from generation_config.json (chat models often add their end-of-turn token)."""
    try:
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(hf_dir).eos_token_id
    except Exception:  # no generation_config.json: the model config's eos is all there is
        return ()
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
