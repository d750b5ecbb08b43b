"""RunnerConfig: what the model runner needs of the server's flags, and nothing else.

ServerArgs holds every flag (HTTP, limits, parsers, scheduling); the runner reads only the model,
its dtype and device, the memory budget, the kernels and the parallel layout. Keeping that in its
own small dataclass lets a benchmark or a tensor-parallel rank build a runner without a server.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.config import ServerArgs, config_from_args


@dataclass(frozen=True)
class RunnerConfig:
    model_path: str | None = None          # None: the bundled GGUF (resolve_model_dir)
    load_format: str = "auto"
    tokenizer_path: str | None = None
    dtype: str = "auto"
    device: str | None = None              # None: cuda when available, else cpu
    context_length: int | None = None
    random_seed: int = 0
    quantization: str | None = None        # --quantization (layers/quantization/)
    # Memory
    mem_fraction_static: float = 0.85
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    page_size: int = 1
    kv_cache_dtype: str = "auto"           # --kv-cache-dtype
    # Kernels
    attention_backend: str | None = None   # None: triton on CUDA, torch_native on CPU
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 256
    cuda_graph_bs: list[int] | None = None   # --cuda-graph-bs: the sizes captured
    json_model_override_args: str | None = None   # config.json fields replaced (JSON)
    enable_torch_compile: bool = False     # model_executor/torch_compile.py
    torch_compile_max_bs: int = 32
    # Parallel layout (tensor parallelism builds on these; ServerArgs allows tp_size 1 today)
    tp_rank: int = 0
    tp_size: int = 1
    # KV bytes a token costs in a draft model's pool (speculative decoding, STANDALONE): it
    # holds as many tokens as this runner's and shares the --mem-fraction-static budget.
    draft_kv_bytes_per_token: int = 0
    # Speculative drafts may form trees (ServerArgs.uses_draft_trees): the decode CUDA graphs
    # take the rows' tree masks
    draft_trees: bool = False

    @classmethod
    def from_server_args(cls, args: ServerArgs, tp_rank: int = 0,
                         draft_kv_bytes_per_token: int = 0) -> "RunnerConfig":
        return config_from_args(args, cls, tp_rank=tp_rank,
                                draft_kv_bytes_per_token=draft_kv_bytes_per_token,
                                draft_trees=args.uses_draft_trees)
