"""ModelRunner: the model, its KV tensors and attention backend on one device; forward + sample.

It turns a ForwardBatch into next-token logits (and prompt logprobs when asked), samples them
and writes each sampled id where the next decode step reads its input (`last_token_ids`). It
knows nothing about requests, queues or the prefix cache: the KV manager (mem_cache/) owns the
slot bookkeeping and the req-to-token table, built from the MemoryPlan this runner sizes.

Start-up is two steps because the two owners depend on each other's sizes:

    runner = ModelRunner(config)                     # weights, memory plan, KV tensors
    kv = KVCacheManager.create(runner.memory_plan, runner.device, radix=...)
    runner.init_attention(kv.req_to_token_pool)      # backend (+ CUDA graphs) over both

`create_runner_and_kv(config)` does the three.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from radixlm import envs
from radixlm.config import parse_model_overrides
from radixlm.core.forward_batch import ForwardBatch
from radixlm.core.kv_quant import is_fp8, kv_storage_dtype
from radixlm.core.kv_spec import KVCacheSpec
from radixlm.distributed.parallel_state import tp_group
from radixlm.layers.attention.base import AttentionBackend, create_attention_backend
from radixlm.layers.attention.radix_attention import bind_attention_backend
from radixlm.layers.logits import InputLogprobs, compute_input_logprobs
from radixlm.mem_cache.hiradix_cache import HiCacheConfig
from radixlm.mem_cache.kv_cache_manager import KVCacheManager, MemoryPlan
from radixlm.mem_cache.pools import KVPool, MLAKVPool, ReqToTokenPool
from radixlm.model_executor.forward_pass import run_model
from radixlm.model_executor.loader import load_model
from radixlm.model_executor.model_config import ModelConfig, resolve_dtype
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import read_hf_config, resolve_model_dir
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.sampler import SampleOutput, Sampler
from radixlm.utils.phases import PhaseTimer

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384
DEFAULT_MAX_RUNNING_REQUESTS = 1024


@dataclass
class ForwardOutput:
    next_token_logits: torch.Tensor              # [B, V] float32
    input_logprobs: list[InputLogprobs] | None   # per request, when fb.input_logprob_rows is set


# GPU memory a server leaves free beyond its --mem-fraction-static share (activations, graphs).
ACTIVATION_RESERVE_BYTES = 2 ** 30


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ModelRunner:
    def __init__(self, config: RunnerConfig, hicache: bool = False):
        """`hicache`: a host tier will copy this runner's KV (refused for MLA, before the
        weights load)."""
        self.config = config
        self.device = torch.device(config.device) if config.device else default_device()
        if self.device.type == "cuda" and envs.local_gpu() is not None:
            # A TP rank sees its node's GPUs and has made its own current: `--device cuda:0`
            # would put every rank on the first.
            self.device = torch.device("cuda")
        # Where start-up time goes (the scheduler process adds its own phases and reports all).
        self.startup = PhaseTimer(self.device)
        with self.startup.phase("model_config"):
            self._read_config(config, hicache)
        with self.startup.phase("weights"):
            self.model = load_model(self.model_config, self.hf_dir, self.load_format,
                                    self.device, self.dtype, seed=config.random_seed, tp=self.tp,
                                    quantization=config.quantization)
        # The model declares what a token costs in the cache; the pool is built from that.
        self.kv_spec: KVCacheSpec = self.model.kv_cache_spec
        with self.startup.phase("kv_cache"):
            self.memory_plan = self._plan_memory()
            try:
                self.kv_pool = self._make_kv_pool()
            except (RuntimeError, MemoryError) as e:   # (torch.OutOfMemoryError included)
                if config.max_total_tokens is None:
                    raise
                raise ValueError(
                    f"--max-total-tokens {config.max_total_tokens}: a KV pool that large does "
                    f"not fit in memory ({str(e).splitlines()[0][:200]})") from None
        # The next input id of each request slot: the sampler writes it, the next decode step
        # reads it on the device, so that step can be launched before the host has seen it.
        self.last_token_ids = torch.zeros(self.memory_plan.req_slots, dtype=torch.int64,
                                          device=self.device)
        # The model's logits are its lm_head's output in self.dtype, as float32 (llama.py).
        self.sampler = Sampler(logits_hold_bf16=self.dtype == torch.bfloat16)
        self.attn_backend: AttentionBackend | None = None
        self.graph_runner = None
        self.compiled_decode = None      # --enable-torch-compile
        logger.info("KV cache: %d tokens (%.1f MiB, %s), %d max running requests",
                    self.max_total_num_tokens, self.kv_pool.nbytes / 2**20,
                    str(self.kv_dtype).removeprefix("torch."), self.max_running_requests)

    def _read_config(self, config: RunnerConfig, hicache: bool) -> None:
        """The model's config, dtypes and this rank's group: everything before the weights."""
        self.hf_dir, self.load_format = resolve_model_dir(config.model_path, config.load_format)
        self.tokenizer_path = config.tokenizer_path or self.hf_dir
        hf_config = read_hf_config(self.hf_dir)
        overrides = parse_model_overrides(config.json_model_override_args)
        apply_model_overrides(hf_config, overrides)
        try:
            self.model_config = ModelConfig.from_hf(hf_config, config.context_length,
                                                    _generation_eos(self.hf_dir))
        except (ValueError, TypeError, AttributeError, ArithmeticError) as e:
            if str(e).startswith("--"):
                raise
            source = "--json-model-override-args" if overrides else \
                f"--model-path: {self.hf_dir}/config.json"
            raise ValueError(f"{source}: {type(e).__name__}: {e}") from None
        if hicache and self.model_config.is_mla:
            raise ValueError("--enable-hierarchical-cache: not supported yet for MLA models "
                             f"({self.model_config.architecture}: the host tier copies K and "
                             "V rows, the latent pool has one)")
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device)
        # What the KV pool stores K and V in (--kv-cache-dtype): the compute dtype stays
        # self.dtype, the attention backends convert what they read.
        self.kv_dtype = kv_storage_dtype(config.kv_cache_dtype, self.dtype)
        if self.model_config.is_mla:        # refused before the weights load
            _check_kv_dtype_for_mla(self.kv_dtype, self.model_config.architecture)
        if config.enable_torch_compile:     # refused before the weights load, too
            from radixlm.model_executor.torch_compile import check_supported
            check_supported(self.model_config.architecture, config.quantization,
                            config.tp_size, is_fp8(self.kv_dtype))
        torch.manual_seed(config.random_seed)
        self.tp = tp_group()
        if self.tp.size != config.tp_size:
            raise RuntimeError(f"--tp-size {config.tp_size}: this process joined a group of "
                               f"{self.tp.size} (init_tensor_parallel first)")

    @property
    def max_total_num_tokens(self) -> int:
        return self.memory_plan.max_total_num_tokens

    @property
    def max_running_requests(self) -> int:
        return self.memory_plan.max_running_requests

    @property
    def max_graph_batch_size(self) -> int | None:
        """Rows of the largest captured decode graph (None without CUDA graphs)."""
        return self.graph_runner.max_bs if self.graph_runner is not None else None

    @property
    def attention_backend_name(self) -> str:
        """--attention-backend, else the project's Triton kernels on CUDA, torch_native on CPU."""
        if self.config.attention_backend:
            return self.config.attention_backend
        return "triton" if self.device.type == "cuda" else "torch_native"

    def init_attention(self, req_to_token_pool: ReqToTokenPool) -> None:
        """Build the attention backend over the KV tensors and the KV manager's req-to-token
        table, hand it to the model's attention layers, and capture the CUDA graphs."""
        with self.startup.phase("attention_backend"):
            self.attn_backend = create_attention_backend(self.attention_backend_name,
                                                         self.kv_pool, req_to_token_pool)
            bind_attention_backend(self.model, self.attn_backend)
        cfg = self.config
        draft_trees = cfg.draft_trees
        if draft_trees and self.kv_pool.is_latent:
            raise ValueError("--speculative-ngram-max-bfs-breadth / --speculative-eagle-topk: "
                             "draft trees are not supported over an MLA model's latent KV "
                             "cache; use 1 (chains)")
        graphs = (self.device.type == "cuda" and not cfg.disable_cuda_graph
                  and cfg.cuda_graph_max_bs >= 1 and self.attn_backend.supports_cuda_graph)
        if cfg.enable_torch_compile:
            from radixlm.model_executor.torch_compile import CompiledDecode
            self.compiled_decode = CompiledDecode(
                self.model, min(cfg.torch_compile_max_bs, self.max_running_requests))
            with self.startup.phase("torch_compile"):
                self.compiled_decode.warm_up(self.attn_backend, self.device)
        if graphs:
            from radixlm.model_executor.cuda_graph_runner import CudaGraphRunner
            self.graph_runner = CudaGraphRunner(
                self.model, self.attn_backend, self.device,
                min(cfg.cuda_graph_max_bs, self.max_running_requests), self.compiled_decode,
                draft_trees=draft_trees, batch_sizes=cfg.cuda_graph_bs)
            with self.startup.phase("cuda_graphs"):
                self.graph_runner.capture()
        with self.startup.phase("sampler_kernels"):
            # the logits the sampler gets are float32 (llama.py's compute_logits)
            self.sampler.warm_up(self.model_config.vocab_size, torch.float32, self.device)

    # ------------------------------------------------------------------ memory

    def _make_kv_pool(self) -> KVPool | MLAKVPool:
        spec, slots = self.kv_spec, self.memory_plan.num_slots
        if spec.kind == "mla":       # (fp8 refused in __init__, before the weights load)
            return MLAKVPool(slots, spec.num_layers, spec.head_dim, spec.latent_value_dim,
                             self.dtype, self.device)
        k_scales, v_scales = self._kv_scales(spec.num_layers)
        return KVPool(slots, spec.num_layers, spec.num_kv_heads, spec.head_dim, self.kv_dtype,
                      self.device, k_scale=k_scales, v_scale=v_scales)

    def _kv_scales(self, num_layers: int) -> tuple[list[float] | float, list[float] | float]:
        """The fp8 pool's scales: the checkpoint's per layer where it has them, else 1.0. A
        16-bit pool stores K and V as they are, so the checkpoint's scales go unused."""
        found = getattr(self.model, "checkpoint_kv_scales", None)
        if found is None or found.empty:
            return 1.0, 1.0
        if not is_fp8(self.kv_dtype):
            logger.info("the checkpoint's KV cache scales are not used: they apply to "
                        "--kv-cache-dtype fp8_e4m3, and the cache stores %s",
                        str(self.kv_dtype).removeprefix("torch."))
            return 1.0, 1.0
        scales = found.per_layer(num_layers)
        logger.info("fp8 KV cache with the checkpoint's scales (K %.4g-%.4g, V %.4g-%.4g)",
                    min(scales[0]), max(scales[0]), min(scales[1]), max(scales[1]))
        return scales

    def _plan_memory(self) -> MemoryPlan:
        mc, cfg = self.model_config, self.config
        # In the storage dtype: an fp8 cache gets twice the tokens of a 16-bit one. A draft
        # model's pool holds as many tokens, from the same budget.
        per_token = self.kv_bytes_per_token + cfg.draft_kv_bytes_per_token
        if cfg.max_total_tokens is not None:
            total = cfg.max_total_tokens
        else:
            budget = self._kv_budget_bytes(per_token)
            total = CPU_DEFAULT_MAX_TOTAL_TOKENS if budget is None else budget // per_token
        # Ranks run one schedule: they must agree on the capacity (the smallest one's).
        total = self.tp.min_over_ranks(total)
        ps = cfg.page_size
        # +1 page for the padding page 0 that is never handed out.
        num_slots = (total // ps + 1) * ps
        max_running = cfg.max_running_requests or min(
            DEFAULT_MAX_RUNNING_REQUESTS, max((num_slots - ps) // 2, 1))
        return MemoryPlan(num_slots=num_slots, page_size=ps, max_running_requests=max_running,
                          max_context_len=mc.context_len + 8)

    def share_slots(self, plan: MemoryPlan) -> None:
        """Rebuild the KV pool with `plan`'s slots (a draft model takes its target's, whose
        slot indices it shares); before init_attention."""
        assert self.attn_backend is None, "share_slots before init_attention"
        self.memory_plan = plan
        del self.kv_pool
        self.kv_pool = self._make_kv_pool()
        self.last_token_ids = torch.zeros(plan.req_slots, dtype=torch.int64, device=self.device)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_spec.bytes_per_token(self.kv_dtype)

    def _kv_budget_bytes(self, per_token: int) -> int | None:
        """--mem-fraction-static is this server's own share of the GPU (weights + KV cache):
        what other processes hold does not count against it, so several servers can share a
        GPU with a fraction each (SGLang counts it, so a second server there finds no room).
        The share is cut down, with a warning, to what is free now less room for activations
        and CUDA graphs. None off CUDA: the CPU default is a number of tokens
        (CPU_DEFAULT_MAX_TOTAL_TOKENS), not a share of memory."""
        if self.device.type != "cuda":
            return None
        cfg = self.config
        free, total_mem = torch.cuda.mem_get_info(self.device)
        own = torch.cuda.memory_reserved(self.device)       # the weights, loaded by now
        budget = total_mem * cfg.mem_fraction_static - own
        room = free - ACTIVATION_RESERVE_BYTES
        if budget > room:
            gib = 2 ** 30
            logger.warning("--mem-fraction-static %s asks for %.1f GiB of KV cache; %.1f GiB "
                           "of the GPU are free (%.1f GiB held by other processes), so the "
                           "cache gets %.1f GiB", cfg.mem_fraction_static, budget / gib,
                           free / gib, (total_mem - free - own) / gib, max(room, 0) / gib)
            budget = room
        if budget <= per_token * 1024:
            raise RuntimeError(f"--mem-fraction-static {cfg.mem_fraction_static} leaves no "
                               f"room for the KV cache after loading the model")
        return int(budget)

    @functools.cached_property
    def weight_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, input_logprob_targets: list[list[int]] | None = None,
                input_top_k: list[int] | None = None,
                input_token_ids: list[list[int] | None] | None = None) -> ForwardOutput:
        """One forward pass; for prompt logprobs (fb.input_logprob_rows), per request its
        target tokens, top-k and the token ids whose logprobs it reports (compute_input_logprobs).
        """
        if self.attn_backend is None:
            raise RuntimeError("ModelRunner.forward before init_attention")
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return ForwardOutput(next_token_logits=self.graph_runner.replay(fb),
                                 input_logprobs=None)
        if self.compiled_decode is not None and self.compiled_decode.can_run(fb):
            self.attn_backend.init_forward_metadata(fb)
            return ForwardOutput(next_token_logits=self.compiled_decode(fb), input_logprobs=None)
        hidden, logits = run_model(self.model, self.attn_backend, fb)
        input_logprobs = None
        if fb.input_logprob_rows and any(fb.input_logprob_rows):
            input_logprobs = compute_input_logprobs(self.model, hidden, fb,
                                                    input_logprob_targets or [],
                                                    input_top_k or [0] * fb.batch_size,
                                                    input_token_ids)
        return ForwardOutput(next_token_logits=logits, input_logprobs=input_logprobs)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, req_pool_indices: torch.Tensor,
               info: SamplingBatchInfo, top_logprobs_nums: list[int] | None = None,
               alternatives: int = 0,
               token_ids: list[list[int] | None] | None = None) -> SampleOutput:
        """Sample one token per row of `logits` and record it as the next input of the request
        slot in the same row of `req_pool_indices` (`alternatives`: see SampleOutput)."""
        out = self.sampler(logits, info, top_logprobs_nums, alternatives, token_ids)
        self.last_token_ids[req_pool_indices] = out.next_token_ids
        return out


def create_runner_and_kv(config: RunnerConfig, radix: bool = True,
                         hicache: HiCacheConfig | None = None
                         ) -> tuple[ModelRunner, KVCacheManager]:
    """A ready runner and the KV manager over its memory (see the module docstring);
    `hicache`: a host tier under the radix cache, copying to and from the runner's KV pool."""
    runner = ModelRunner(config, hicache=hicache is not None)
    kv = KVCacheManager.create(runner.memory_plan, runner.device, radix=radix,
                               hicache=(hicache, runner.kv_pool) if hicache else None)
    runner.init_attention(kv.req_to_token_pool)
    return runner, kv


def _check_kv_dtype_for_mla(kv_dtype: torch.dtype, architecture: str) -> None:
    if is_fp8(kv_dtype):
        raise ValueError("--kv-cache-dtype fp8_e4m3: not supported for MLA models "
                         f"({architecture}: the latent KV pool and its kernels store the "
                         "model's dtype only); use --kv-cache-dtype auto")


def apply_model_overrides(hf_config: Any, overrides: dict[str, Any]) -> None:
    """--json-model-override-args onto the model's config. transformers v5 configs keep
    rope_theta and the RoPE scaling inside rope_parameters, where the model reads them: an
    override of the older names (rope_theta, rope_scaling) goes there too, or it would change
    nothing."""
    for key, value in overrides.items():
        setattr(hf_config, key, value)
    rope = getattr(hf_config, "rope_parameters", None)
    if "rope_parameters" in overrides or not isinstance(rope, dict):
        return
    if "rope_scaling" in overrides:
        scaling = overrides["rope_scaling"]
        if scaling is not None and not isinstance(scaling, dict):
            raise ValueError(f"--json-model-override-args: rope_scaling must be an object or "
                             f"null, got {scaling!r}")
        scaling = dict(scaling or {"rope_type": "default"})
        if "type" in scaling:     # (the older spelling of rope_type)
            scaling.setdefault("rope_type", scaling.pop("type"))
        rope = {"rope_theta": rope.get("rope_theta"), **scaling}
    if "rope_theta" in overrides:
        rope = {**rope, "rope_theta": overrides["rope_theta"]}
    hf_config.rope_parameters = {k: v for k, v in rope.items() if v is not None}


def _generation_eos(hf_dir: str) -> tuple[int, ...]:
    """EOS ids from generation_config.json (chat models often add their end-of-turn token).
    Read as plain JSON: transformers' GenerationConfig costs seconds of imports at start-up."""
    try:
        with open(os.path.join(hf_dir, "generation_config.json")) as f:
            eos = json.load(f).get("eos_token_id")
    except (OSError, ValueError, AttributeError):  # none, or not a JSON object
        return ()
    if isinstance(eos, int) and not isinstance(eos, bool):
        return (eos,)
    if isinstance(eos, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
        return tuple(eos)
    return ()
