"""ServerArgs: every user-facing setting and its default, in one frozen dataclass.

CLI flag names follow SGLang (`--model-path`, `--chunked-prefill-size`, ...): the flag for field
`foo_bar` is `--foo-bar`. Engine(**kwargs) takes the same names as keyword arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, get_type_hints

from radixlm.utils.hub_ids import exists_or_could_be_hub_id
from radixlm.utils.json_flag import parse_json_object
from radixlm.utils.sampling_defaults import SAMPLING_DEFAULTS, parse_preferred


def parse_model_overrides(text: str | None) -> dict[str, Any]:
    """--json-model-override-args as a dict (ValueError when it is not a JSON object)."""
    return parse_json_object(text, "config.json fields")


SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
HICACHE_WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float", "bf16", "fp16", "fp32")
# Weight quantization (SGLang's names): fp8 (online, or an FP8 checkpoint), awq / gptq (4-bit
# checkpoints), w4a16 (online 4-bit round-to-nearest, group 128).
QUANTIZATIONS = ("fp8", "awq", "gptq", "w4a16")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE")
ATTENTION_BACKENDS = ("triton", "torch_native")   # layers/attention/base.py's registry
TOKENIZER_MODES = ("auto", "slow")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Flags that take one of a fixed set of values (argparse lists them in its error)
CHOICES = {"schedule_policy": SCHEDULE_POLICIES, "load_format": LOAD_FORMATS,
           "quantization": QUANTIZATIONS, "kv_cache_dtype": KV_CACHE_DTYPES,
           "attention_backend": ATTENTION_BACKENDS, "tokenizer_mode": TOKENIZER_MODES,
           "sampling_defaults": SAMPLING_DEFAULTS}
# SGLang's other spellings of some flags (argparse's prefix matching would make --tp work only
# until another --tp... flag appeared).
CLI_ALIASES = {"model_path": ("--model",), "tp_size": ("--tp", "--tensor-parallel-size"),
               "dp_size": ("--dp", "--data-parallel-size")}


@dataclass(frozen=True)
class ServerArgs:
    # Model
    model_path: str | None = None          # None: the bundled SmolLM2-135M-Instruct GGUF
    tokenizer_path: str | None = None
    # "slow" loads transformers' Python tokenizer where the checkpoint has one (the HTTP
    # process's, which tokenizes prompts); "auto" the fast one
    tokenizer_mode: str = "auto"
    # config.json fields replaced, as a JSON object ({"max_position_embeddings": 8192}):
    # applied where the model's config is read, before anything is built from it
    json_model_override_args: str | None = None
    # A label of the weights served (/get_model_info); /update_weights_from_disk may set it
    weight_version: str = "default"
    # No tokenizer anywhere: prompts come as input_ids, outputs go back as output_ids only
    # (as SGLang's flag; what needs text is refused: managers/no_tokenizer.py)
    skip_tokenizer_init: bool = False
    load_format: str = "auto"
    dtype: str = "auto"
    context_length: int | None = None
    served_model_name: str | None = None
    device: str | None = None              # None: cuda when available, else cpu
    random_seed: int = 0
    quantization: str | None = None        # None: as the checkpoint says (unquantized if silent)
    # A Hub id not in the local cache is downloaded (at --revision, into --download-dir)
    revision: str | None = None            # branch, tag or commit of a Hub model
    download_dir: str | None = None        # Hub cache directory (default: Hugging Face's)
    trust_remote_code: bool = False        # let transformers run the checkpoint's tokenizer code
    # The chat template for chat requests, instead of the tokenizer's: a Jinja file, a Jinja
    # string, or a built-in name (radixlm/utils/chat_templates.py)
    chat_template: str | None = None
    # Defaults under every request's sampling_params: a JSON object (utils/sampling_defaults.py)
    preferred_sampling_params: str | None = None
    # /v1 requests' unset temperature / top_p / top_k / min_p / repetition_penalty: "model"
    # takes generation_config.json's, "openai" the API's neutral ones
    sampling_defaults: str = "model"

    # Memory
    mem_fraction_static: float = 0.85      # GPU: this server's share of its memory, weights + KV
    max_total_tokens: int | None = None    # KV capacity in tokens (default on CPU: 16384)
    max_running_requests: int | None = None
    # Requests waiting for admission beyond this many are refused at once: HTTP 429 (not 503,
    # which tells a router the engine is dead)
    max_queued_requests: int | None = None
    page_size: int = 1
    kv_cache_dtype: str = "auto"           # fp8_e4m3: 1-byte K/V (per-tensor scales), 2x tokens
    disable_radix_cache: bool = False
    # Hierarchical cache (HiCache): a host-memory tier under the radix cache
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0             # host pool size / device KV pool size
    hicache_size: float = 0.0              # host pool size in GiB (0: use --hicache-ratio)
    # write_back: copy to the host only on eviction (write_through measured 0.66x on a workload
    # that fits the GPU, write_back 1.04x: benchmarks/RESULTS.md, issue 15)
    hicache_write_policy: str = "write_back"      # | write_through | write_through_selective
    hicache_storage_backend: str | None = None     # "file": a third tier (L3) on disk
    hicache_storage_dir: str | None = None         # its directory (default: under the cache dir)

    # Scheduling
    chunked_prefill_size: int | None = None   # None: 8192 on GPU, 4096 on CPU; -1 disables
    max_prefill_tokens: int = 16384
    # A prompt longer than the context keeps its first context-1 tokens instead of a 400
    allow_auto_truncate: bool = False
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0

    # Kernels (the GPU issue fills these in)
    attention_backend: str | None = None   # None: triton on CUDA, torch_native on CPU
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 256
    # The decode batch sizes to capture graphs for (default: 1, 2, 4, 8, 16, ... up to
    # --cuda-graph-max-bs); a batch runs in the smallest graph it fits
    cuda_graph_bs: list[int] | None = None
    # torch.compile (inductor) of the decode forward, captured in the CUDA graphs, for batches of
    # up to --torch-compile-max-bs rows (model_executor/torch_compile.py)
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    disable_overlap_schedule: bool = False
    grammar_backend: str = "xgrammar"
    disable_jump_forward: bool = False
    # Constrained decode rows sample without the grammar mask; a token the grammar rejects is
    # sampled again under it (same tokens, fewer masks: scheduler/grammar_sampling.py)
    disable_optimistic_grammar: bool = False

    # Speculative decoding (SGLang's flags): NGRAM drafts from the request's own text,
    # STANDALONE drafts from a smaller model (--speculative-draft-model-path)
    speculative_algorithm: str | None = None
    # Draft tokens verified per step at most: NGRAM's, and the node budget of a tree
    # (NGRAM's, or a draft model's with --speculative-eagle-topk > 1)
    speculative_num_draft_tokens: int = 4
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    # NGRAM drafts a tree when > 1: up to this many children under the last token, one fewer
    # per level below, never under the min (speculative/ngram.weighted_tree)
    speculative_ngram_min_bfs_breadth: int = 1
    speculative_ngram_max_bfs_breadth: int = 1
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int = 3                 # STANDALONE: draft model steps (a chain's
    #                                                tokens, a tree's depth)
    speculative_eagle_topk: int = 1                # STANDALONE: candidates kept a step (1: a chain)

    # Server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None             # also RADIXLM_API_KEY in the environment (serve)
    tp_size: int = 1                       # ranks (processes, one per GPU) sharding the model
    dist_init_addr: str | None = None      # HOST:PORT where the ranks meet (default: a free port)
    nnodes: int = 1                        # machines the --tp-size ranks are spread over
    node_rank: int = 0                     # this machine's index; node 0 serves HTTP
    dist_timeout: int | None = None        # seconds for the ranks to join (default 600)
    disable_custom_all_reduce: bool = False   # TP on GPUs: NCCL for every all-reduce
    dp_size: int = 1                       # > 1: that many engines behind the cache-aware router
    base_gpu_id: int = 0                   # the first GPU used (engine i of --dp-size: base + i)
    # A stream sends a chunk every this many tokens (the first token and the last at once);
    # a request's sampling_params.stream_interval overrides it
    stream_interval: int = 1
    # Streamed /generate chunks carry only the output_ids new since the previous chunk (the
    # text stays cumulative), as SGLang's --stream-output
    stream_output: bool = False
    log_level: str = "info"
    log_requests: bool = False
    decode_log_interval: int = 40          # decode steps between two "decode batch" log lines
    # A scheduler that makes no progress for this long while it has requests ends its process
    # (the server then exits, to be restarted) instead of hanging them (scheduler/watchdog.py)
    watchdog_timeout: float = 300.0
    enable_metrics: bool = False
    # SGLang's: do not send a warm-up request after start-up. radixlm sends none (its CUDA graphs
    # and kernels are warmed while the engine starts), so the flag holds either way; accepted so
    # that SGLang launch commands run unchanged.
    skip_server_warmup: bool = False
    # SGLang's: report usage.prompt_tokens_details.cached_tokens. radixlm always reports them
    # (clients ask for them), so the flag holds either way.
    enable_cache_report: bool = False

    # Limits on what one HTTP request may ask for (the offline Engine is not limited)
    max_request_body_mb: float = 64.0      # larger bodies get HTTP 413
    max_n_per_request: int = 128           # `n` (OpenAI's own cap is 128)
    max_prompts_per_request: int = 4096    # prompts in one batched request
    max_stop_strings: int = 64             # entries of `stop`

    # Chat output parsing (SGLang's flags); names in radixlm/parsers/
    tool_call_parser: str | None = None    # qwen25 | llama3 | mistral | pythonic
    reasoning_parser: str | None = None    # deepseek-r1 | qwen3

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bad(flag: str, msg: str) -> ValueError:
            return ValueError(f"--{flag}: {msg}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise bad(f.name.replace("_", "-"), f"must be a finite number, got {value}")
        if self.tokenizer_path is not None and not exists_or_could_be_hub_id(self.tokenizer_path):
            raise bad("tokenizer-path", f"{self.tokenizer_path!r} does not exist (and is not a "
                                        f"Hugging Face id such as ORG/NAME)")
        if self.load_format not in LOAD_FORMATS:
            raise bad("load-format", f"must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise bad("quantization", f"must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise bad("kv-cache-dtype", f"must be one of {KV_CACHE_DTYPES}, "
                                        f"got {self.kv_cache_dtype!r}")
        if self.speculative_algorithm is not None:
            # (SGLang takes the name in any case; the rest of the code sees it upper-case.)
            object.__setattr__(self, "speculative_algorithm", self.speculative_algorithm.upper())
            if self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
                raise bad("speculative-algorithm", f"must be one of {SPECULATIVE_ALGORITHMS}, "
                                                   f"got {self.speculative_algorithm!r}")
        self._validate_draft_model(bad)
        if self.cuda_graph_max_bs < 0:
            raise bad("cuda-graph-max-bs", f"must be >= 0 (0: no CUDA graphs), got "
                                           f"{self.cuda_graph_max_bs}")
        if self.torch_compile_max_bs < 1:
            raise bad("torch-compile-max-bs", f"must be >= 1, got {self.torch_compile_max_bs}")
        if not 1 <= self.speculative_num_draft_tokens <= 64:
            raise bad("speculative-num-draft-tokens", f"must be in 1..64, got "
                                                      f"{self.speculative_num_draft_tokens}")
        lo = self.speculative_ngram_min_match_window_size
        hi = self.speculative_ngram_max_match_window_size
        if lo < 1 or hi < lo:
            raise bad("speculative-ngram-min-match-window-size",
                      f"need 1 <= min ({lo}) <= max ({hi}) "
                      f"(--speculative-ngram-max-match-window-size)")
        self._validate_ngram_trees(bad)
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise bad("schedule-policy", f"must be one of {SCHEDULE_POLICIES}, "
                                         f"got {self.schedule_policy!r}")
        if self.grammar_backend not in ("xgrammar", "none"):
            raise bad("grammar-backend", f"must be xgrammar or none, got {self.grammar_backend!r}")
        if self.hicache_ratio <= 1:
            raise bad("hicache-ratio", f"must be > 1 (the host pool is larger than the "
                                       f"device's), got {self.hicache_ratio}")
        if self.hicache_size < 0:
            raise bad("hicache-size", f"must be >= 0 GiB, got {self.hicache_size}")
        if self.hicache_write_policy not in HICACHE_WRITE_POLICIES:
            raise bad("hicache-write-policy", f"must be one of {HICACHE_WRITE_POLICIES}, "
                                              f"got {self.hicache_write_policy!r}")
        if self.hicache_storage_backend not in (None, "file"):
            raise bad("hicache-storage-backend", f"must be file, got "
                                                 f"{self.hicache_storage_backend!r}")
        if self.hicache_storage_backend and not self.enable_hierarchical_cache:
            raise bad("hicache-storage-backend", "needs --enable-hierarchical-cache")
        if self.hicache_storage_dir is not None and self.hicache_storage_backend != "file":
            raise bad("hicache-storage-dir", "needs --hicache-storage-backend file")
        if self.enable_hierarchical_cache and self.disable_radix_cache:
            raise bad("enable-hierarchical-cache", "needs the radix cache (drop "
                                                   "--disable-radix-cache)")
        if self.page_size < 1:
            raise bad("page-size", f"must be >= 1, got {self.page_size}")
        if not -2 ** 63 <= self.random_seed < 2 ** 64:      # (what torch.manual_seed takes)
            raise bad("random-seed", f"must fit in 64 bits, got {self.random_seed}")
        if not (0.0 < self.mem_fraction_static < 1.0):
            raise bad("mem-fraction-static", f"must be in (0, 1), got {self.mem_fraction_static}")
        if self.max_total_tokens is not None and self.max_total_tokens < 2 * self.page_size:
            raise bad("max-total-tokens", f"must be >= {2 * self.page_size}, "
                                          f"got {self.max_total_tokens}")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise bad("max-running-requests", f"must be >= 1, got {self.max_running_requests}")
        if self.chunked_prefill_size is not None and (
                self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1):
            raise bad("chunked-prefill-size", f"must be -1 (off) or >= 1, "
                                              f"got {self.chunked_prefill_size}")
        if self.max_prefill_tokens < 1:
            raise bad("max-prefill-tokens", f"must be >= 1, got {self.max_prefill_tokens}")
        # Checked here, not when the engine meets them after loading the model.
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise bad("attention-backend", f"must be one of {ATTENTION_BACKENDS}, "
                                           f"got {self.attention_backend!r}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise bad("served-model-name", "is empty (leave it out for the model path's name)")
        if self.log_level.lower() not in LOG_LEVELS:
            raise bad("log-level", f"must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise bad("device", f"must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.schedule_conservativeness <= 0:
            raise bad("schedule-conservativeness", f"must be > 0, "
                                                   f"got {self.schedule_conservativeness}")
        if self.context_length is not None and self.context_length < 1:
            raise bad("context-length", f"must be >= 1, got {self.context_length}")
        if self.tp_size < 1:
            raise bad("tp-size", f"must be >= 1, got {self.tp_size}")
        if self.nnodes < 1:
            raise bad("nnodes", f"must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise bad("node-rank", f"must be in 0..{self.nnodes - 1} (--nnodes {self.nnodes}), "
                                   f"got {self.node_rank}")
        if self.tp_size % self.nnodes != 0:
            raise bad("nnodes", f"--tp-size {self.tp_size} must be a multiple of it "
                                f"({self.nnodes}): each node runs as many ranks")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise bad("dist-init-addr", f"is required with --nnodes {self.nnodes}: HOST:PORT of "
                                        f"node 0, where the ranks meet")
        if self.dist_timeout is not None and self.dist_timeout < 1:
            raise bad("dist-timeout", f"must be >= 1 second, got {self.dist_timeout}")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise bad("dist-init-addr", f"must be HOST:PORT, got {self.dist_init_addr!r}")
        if self.dp_size < 1:
            raise bad("dp-size", f"must be >= 1, got {self.dp_size}")
        if self.base_gpu_id < 0:
            raise bad("base-gpu-id", f"must be >= 0, got {self.base_gpu_id}")
        if self.max_request_body_mb <= 0:
            raise bad("max-request-body-mb", f"must be > 0, got {self.max_request_body_mb}")
        for name in ("max_n_per_request", "max_prompts_per_request", "max_stop_strings"):
            if getattr(self, name) < 1:
                raise bad(name.replace("_", "-"), f"must be >= 1, got {getattr(self, name)}")
        if not (0 < self.port < 65536):
            raise bad("port", f"must be in 1..65535, got {self.port}")
        if not self.watchdog_timeout > 0:
            raise bad("watchdog-timeout", f"must be > 0 seconds, got {self.watchdog_timeout}")
        if self.decode_log_interval < 1:
            raise bad("decode-log-interval", f"must be >= 1, got {self.decode_log_interval}")
        if self.cuda_graph_bs is not None and (
                not self.cuda_graph_bs or not all(isinstance(b, int) and not isinstance(b, bool)
                                                  and b >= 1 for b in self.cuda_graph_bs)):
            raise bad("cuda-graph-bs", f"must be batch sizes >= 1, got {self.cuda_graph_bs}")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise bad("max-queued-requests", f"must be >= 1, got {self.max_queued_requests}")
        if self.stream_interval < 1:
            raise bad("stream-interval", f"must be >= 1, got {self.stream_interval}")
        if self.chat_template is not None:
            from radixlm.utils.chat_templates import load_chat_template   # stdlib-only
            try:
                load_chat_template(self.chat_template)
            except ValueError as e:
                raise bad("chat-template", str(e)) from None
        if self.skip_tokenizer_init and self.chat_template is not None:
            raise bad("chat-template", "renders chats into text for the tokenizer, which "
                                       "--skip-tokenizer-init leaves out")
        if self.json_model_override_args is not None:
            try:
                parse_model_overrides(self.json_model_override_args)
            except ValueError as e:
                raise bad("json-model-override-args", str(e)) from None
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise bad("tokenizer-mode", f"must be one of {list(TOKENIZER_MODES)}, "
                                        f"got {self.tokenizer_mode!r}")
        self._validate_sampling_defaults(bad)
        from radixlm.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS  # stdlib-only
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise bad("tool-call-parser", f"must be one of {sorted(TOOL_CALL_PARSERS)}, "
                                          f"got {self.tool_call_parser!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise bad("reasoning-parser", f"must be one of {sorted(REASONING_PARSERS)}, "
                                          f"got {self.reasoning_parser!r}")

    def _validate_sampling_defaults(self, bad) -> None:
        if self.sampling_defaults not in SAMPLING_DEFAULTS:
            raise bad("sampling-defaults", f"must be one of {list(SAMPLING_DEFAULTS)}, "
                                           f"got {self.sampling_defaults!r}")
        try:
            preferred = parse_preferred(self.preferred_sampling_params)
            if preferred:
                from radixlm.sampling.params import SamplingParams   # torch-free
                SamplingParams.from_dict(preferred).validate()
        except ValueError as e:
            raise bad("preferred-sampling-params", str(e)) from None

    @property
    def uses_draft_trees(self) -> bool:
        """Whether speculative drafts may form trees (verify rows with tree masks)."""
        algorithm = self.speculative_algorithm
        return ((algorithm == "NGRAM" and self.speculative_ngram_max_bfs_breadth > 1)
                or (algorithm == "STANDALONE" and self.speculative_eagle_topk > 1))

    def _validate_ngram_trees(self, bad) -> None:
        lo, hi = self.speculative_ngram_min_bfs_breadth, self.speculative_ngram_max_bfs_breadth
        if not 1 <= lo <= hi <= 64:
            raise bad("speculative-ngram-min-bfs-breadth" if 1 <= hi <= 64 < lo or lo > hi >= 1
                      else "speculative-ngram-max-bfs-breadth",
                      f"need 1 <= min ({lo}) <= max ({hi}) <= 64 "
                      f"(--speculative-ngram-min-bfs-breadth / --speculative-ngram-max-bfs-"
                      f"breadth)")
        if hi == 1:
            return
        # A verify row's tree mask has a bit per node (62 drafts + the last token fit an int64);
        # the accepted nodes' slots are moved by renumbering, which pages would not allow.
        for flag, problem in (
                ("speculative-algorithm", None if self.speculative_algorithm == "NGRAM"
                 else "draft trees need --speculative-algorithm NGRAM"),
                ("speculative-num-draft-tokens", None if self.speculative_num_draft_tokens <= 62
                 else "at most 62 with draft trees"),
                ("page-size", None if self.page_size == 1 else "draft trees need page size 1"),
                ("enable-torch-compile", None if not self.enable_torch_compile
                 else "not supported with draft trees yet")):
            if problem is not None:
                raise bad(flag, f"{problem} (--speculative-ngram-max-bfs-breadth {hi})")

    def _validate_draft_model(self, bad: Callable[[str, str], ValueError]) -> None:
        """STANDALONE's flags, and what it does not support yet (each refused by name)."""
        standalone = self.speculative_algorithm == "STANDALONE"
        if self.speculative_draft_model_path is not None and not standalone:
            raise bad("speculative-draft-model-path", "needs --speculative-algorithm STANDALONE")
        if self.speculative_eagle_topk != 1 and not standalone:
            raise bad("speculative-eagle-topk", "needs --speculative-algorithm STANDALONE (NGRAM's "
                                                "trees: --speculative-ngram-max-bfs-breadth)")
        if not 1 <= self.speculative_num_steps <= 16:
            raise bad("speculative-num-steps", f"must be in 1..16, got "
                                               f"{self.speculative_num_steps}")
        if not standalone:
            return
        if self.speculative_draft_model_path is None:
            raise bad("speculative-draft-model-path", "is required with "
                                                      "--speculative-algorithm STANDALONE")
        topk, steps = self.speculative_eagle_topk, self.speculative_num_steps
        if not 1 <= topk <= 8:
            raise bad("speculative-eagle-topk", f"must be in 1..8, got {topk}")
        if topk > 1:
            # A tree: every draft step expands the topk best nodes; all their fed nodes get a
            # bit in the rows' tree masks (64 bits), and --speculative-num-draft-tokens nodes
            # at most are verified.
            if topk * (steps - 1) + 1 > 63:
                raise bad("speculative-eagle-topk", f"{topk} x --speculative-num-steps "
                                                    f"{steps} is too large a tree (at most 63 "
                                                    f"nodes drafted: topk x (steps - 1) < 63)")
            if self.speculative_num_draft_tokens > 62:
                raise bad("speculative-num-draft-tokens", "at most 62 with draft trees "
                                                          "(--speculative-eagle-topk > 1)")
            if self.enable_torch_compile:
                raise bad("enable-torch-compile", "not supported with draft trees yet "
                                                  "(--speculative-eagle-topk > 1)")
        # The draft model keeps its KV in the target's slots: one slot per token, on one rank,
        # filled by every forward the target runs (a host tier would restore only the target's).
        for flag, unsupported in (("page-size", self.page_size != 1),
                                  ("tp-size", self.tp_size != 1),
                                  ("enable-hierarchical-cache", self.enable_hierarchical_cache)):
            if unsupported:
                raise bad(flag, "is not supported with --speculative-algorithm STANDALONE yet "
                                "(needs page size 1, one rank, no host tier)")

    # ------------------------------------------------------------------ CLI

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flags = ["--" + f.name.replace("_", "-"), *CLI_ALIASES.get(f.name, ())]
            typ = hints[f.name]
            if typ is bool:
                parser.add_argument(*flags, action="store_true", default=f.default)
                continue
            base = _base_type(typ)
            kwargs: dict[str, Any] = {"type": base, "default": f.default}
            if getattr(base, "__origin__", None) is list:     # --cuda-graph-bs 1 2 4 8
                kwargs = {"type": base.__args__[0], "nargs": "+", "default": f.default}
            if f.name in CHOICES:
                kwargs["choices"] = CHOICES[f.name]
            parser.add_argument(*flags, **kwargs)

    def to_cli_args(self, **changes: Any) -> list[str]:
        """The flags that give these args (with `changes`) back: non-default fields only."""
        args = dataclasses.replace(self, **changes)
        out: list[str] = []
        for f in dataclasses.fields(args):
            value = getattr(args, f.name)
            if value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag)      # store_true flags; a default of True has no flag
            elif isinstance(value, list):
                out += [flag, *(str(v) for v in value)]
            else:
                out += [flag, str(value)]
        return out

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)


def _base_type(typ: Any) -> type:
    """int | None -> int, etc."""
    args = getattr(typ, "__args__", None)
    if args:
        non_none = [a for a in args if a is not type(None)]
        return non_none[0]
    return typ


_Config = TypeVar("_Config")


def config_from_args(args: ServerArgs, cls: type[_Config], **overrides: Any) -> _Config:
    """The dataclass `cls` (a component's own config: RunnerConfig, SchedulerConfig) with each
    field taken from the ServerArgs field of the same name, or from `overrides`. A field that is
    in neither is an error, so a renamed flag can't silently fall back to a default."""
    flags = {f.name for f in dataclasses.fields(args)}
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in overrides:
            values[f.name] = overrides[f.name]
        elif f.name in flags:
            values[f.name] = getattr(args, f.name)
        else:
            raise TypeError(f"{cls.__name__}.{f.name} is not a ServerArgs field; pass it")
    return cls(**values)
