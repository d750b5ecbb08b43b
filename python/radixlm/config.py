"""ServerArgs: every user-facing setting and its default, in one frozen dataclass.

CLI flag names follow SGLang (`--model-path`, `--chunked-prefill-size`, ...): the flag for field
`foo_bar` is `--foo-bar`. Engine(**kwargs) takes the same names as keyword arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

# The values the flags take and the checks live in server_args_checks; the names stay
# importable from here.
from radixlm.server_args_checks import (  # noqa: F401
    ATTENTION_BACKENDS, DTYPES, HICACHE_WRITE_POLICIES, KV_CACHE_DTYPES, LOAD_FORMATS,
    LOG_LEVELS, QUANTIZATIONS, SCHEDULE_POLICIES, SPECULATIVE_ALGORITHMS, TOKENIZER_MODES,
    check_server_args, parse_model_overrides)
from radixlm.utils.field_comments import field_comments
from radixlm.utils.sampling_defaults import SAMPLING_DEFAULTS

# Flags that take one of a fixed set of values (argparse lists them in its error)
CHOICES = {"schedule_policy": SCHEDULE_POLICIES, "load_format": LOAD_FORMATS, "dtype": DTYPES,
           "hicache_write_policy": HICACHE_WRITE_POLICIES,
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
    # A checkpoint directory, a GGUF file or a Hugging Face Hub id (default: the bundled
    # SmolLM2-135M-Instruct GGUF)
    model_path: str | None = None
    tokenizer_path: str | None = None      # the tokenizer (default: the model's)
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
    # How the weights are read; dummy: random weights of the model's shapes (benchmarks)
    load_format: str = "auto"
    # Weights' and activations' dtype; auto: the checkpoint's on GPU (float32 checkpoints in
    # bfloat16), float32 on CPU
    dtype: str = "auto"
    context_length: int | None = None      # the longest sequence (default: the model config's)
    served_model_name: str | None = None   # the model name the APIs report (default: the path)
    device: str | None = None              # cuda, cuda:N or cpu (default: cuda when available)
    random_seed: int = 0                   # seeds requests that give none, and dummy weights
    # Weight quantization: fp8 (online, or an FP8 checkpoint), awq / gptq (4-bit checkpoints),
    # w4a16 (online 4-bit, group 128)
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
    # Requests decoding at once (default: 1024, fewer where the KV cache holds fewer)
    max_running_requests: int | None = None
    # Requests waiting for admission beyond this many are refused at once: HTTP 429 (not 503,
    # which tells a router the engine is dead)
    max_queued_requests: int | None = None
    page_size: int = 1                     # tokens a KV page holds (the radix cache's unit)
    kv_cache_dtype: str = "auto"           # fp8_e4m3: 1-byte K/V (per-tensor scales), 2x tokens
    disable_radix_cache: bool = False      # no prefix reuse between requests
    # Hierarchical cache (HiCache): a host-memory tier under the radix cache
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0             # host pool size / device KV pool size
    hicache_size: float = 0.0              # host pool size in GiB (0: use --hicache-ratio)
    # When device KV reaches the host: write_back copies it only on eviction; write_through
    # at once; write_through_selective once a prefix is hit again (write_through measured 0.66x
    # on a workload that fits the GPU, write_back 1.04x: benchmarks/RESULTS.md, issue 15)
    hicache_write_policy: str = "write_back"
    # A third tier (L3) under the host one; "file" (files in --hicache-storage-dir) is the
    # one backend
    hicache_storage_backend: str | None = None
    hicache_storage_dir: str | None = None         # its directory (default: under the cache dir)

    # Scheduling
    # The most prompt tokens a prefill batch takes; a longer prompt runs in chunks
    chunked_prefill_size: int | None = None   # None: 8192 on GPU, 4096 on CPU; -1 disables
    max_prefill_tokens: int = 16384        # prompt tokens one prefill batch takes at most
    # A prompt longer than the context keeps its first context-1 tokens instead of a 400
    allow_auto_truncate: bool = False
    # The order of the waiting queue: fcfs (arrival), lpm (longest cached prefix first),
    # dfs-weight (requests sharing a prefix together), lof (longest output first), random
    schedule_policy: str = "fcfs"
    # How much of running requests' remaining max_new_tokens admission keeps free for them
    # (larger: fewer requests admitted, fewer retractions)
    schedule_conservativeness: float = 1.0

    # Kernels
    # The attention kernels: triton (radixlm's) or torch_native (PyTorch's SDPA, the reference)
    attention_backend: str | None = None   # None: triton on CUDA, torch_native on CPU
    disable_cuda_graph: bool = False       # decode steps launch their kernels one by one
    cuda_graph_max_bs: int = 256           # the largest decode batch run from a CUDA graph
    # The decode batch sizes to capture graphs for (default: 1, 2, 4, 8, 16, ... up to
    # --cuda-graph-max-bs); a batch runs in the smallest graph it fits
    cuda_graph_bs: list[int] | None = None
    # torch.compile (inductor) of the decode forward, captured in the CUDA graphs, for batches of
    # up to --torch-compile-max-bs rows (model_executor/torch_compile.py)
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32         # the largest decode batch that --enable-torch-compile
    #                                        compiles
    # The scheduler prepares the next batch while the GPU runs this one; with the flag, in turn
    disable_overlap_schedule: bool = False
    grammar_backend: str = "xgrammar"      # structured outputs: xgrammar, or none (refused)
    # Constrained requests append the text their grammar forces without decoding it token by
    # token; with the flag, token by token
    disable_jump_forward: bool = False
    # Constrained decode rows sample without the grammar mask; a token the grammar rejects is
    # sampled again under it (same tokens, fewer masks: scheduler/grammar_sampling.py)
    disable_optimistic_grammar: bool = False

    # Speculative decoding (SGLang's flags)
    # NGRAM drafts from the request's own text, STANDALONE from a smaller model
    # (--speculative-draft-model-path); default: no speculation
    speculative_algorithm: str | None = None
    # Draft tokens verified per step at most: NGRAM's, and the node budget of a tree
    # (NGRAM's, or a draft model's with --speculative-eagle-topk > 1)
    speculative_num_draft_tokens: int = 4
    # NGRAM: the shortest and longest suffix of the text looked up for a continuation
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    # NGRAM drafts a tree when > 1: up to this many children under the last token, one fewer
    # per level below, never under the min (speculative/ngram.weighted_tree)
    speculative_ngram_min_bfs_breadth: int = 1
    speculative_ngram_max_bfs_breadth: int = 1     # NGRAM: the most children under a token
    speculative_draft_model_path: str | None = None   # STANDALONE: the draft model (same vocab)
    speculative_num_steps: int = 3                 # STANDALONE: draft model steps (a chain's
    #                                                tokens, a tree's depth)
    speculative_eagle_topk: int = 1                # STANDALONE: candidates kept a step (1: a chain)

    # Server
    host: str = "127.0.0.1"                # the HTTP server's address (0.0.0.0: every interface)
    port: int = 30000                      # the HTTP server's port
    # Clients must send it (Authorization: Bearer KEY) but to /health, /health_generate and
    # /metrics; also RADIXLM_API_KEY in the environment (serve)
    api_key: str | None = None
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
    log_level: str = "info"                # debug | info | warning | error | critical
    # Log each HTTP request's method, path and status, and each generation's prompt,
    # sampling parameters and output (their text: mind what the prompts hold)
    log_requests: bool = False
    decode_log_interval: int = 40          # decode steps between two "decode batch" log lines
    # A scheduler that makes no progress for this long while it has requests ends its process
    # (the server then exits, to be restarted) instead of hanging them (scheduler/watchdog.py)
    watchdog_timeout: float = 300.0
    enable_metrics: bool = False           # Prometheus metrics at /metrics
    # SGLang's: do not send a warm-up request after start-up. radixlm sends none (its CUDA graphs
    # and kernels are warmed while the engine starts), so the flag holds either way; accepted so
    # that SGLang launch commands run unchanged.
    skip_server_warmup: bool = False
    # SGLang's: report usage.prompt_tokens_details.cached_tokens. radixlm always reports them
    # (clients ask for them), so the flag holds either way.
    enable_cache_report: bool = False

    # Limits on what one HTTP request may ask for (the offline Engine is not limited)
    max_request_body_mb: float = 64.0      # larger bodies get HTTP 413
    max_n_per_request: int = 128           # the largest `n` (OpenAI's own cap is 128)
    max_prompts_per_request: int = 4096    # prompts in one batched request (/v1/score: items)
    max_stop_strings: int = 64             # the most entries of `stop` a request may give

    # Chat output parsing (SGLang's flags); names in radixlm/parsers/
    # Reads the model's tool calls out of its text into `tool_calls`: qwen25 | llama3 |
    # mistral | pythonic
    tool_call_parser: str | None = None
    # Splits a reasoning model's thinking into `reasoning_content`: deepseek-r1 | qwen3
    reasoning_parser: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_server_args(self)

    @property
    def uses_draft_trees(self) -> bool:
        """Whether speculative drafts may form trees (verify rows with tree masks)."""
        algorithm = self.speculative_algorithm
        return ((algorithm == "NGRAM" and self.speculative_ngram_max_bfs_breadth > 1)
                or (algorithm == "STANDALONE" and self.speculative_eagle_topk > 1))


    # ------------------------------------------------------------------ CLI

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, in argument groups by the sections of the source above; a
        flag's help is its field's comments (utils/field_comments.py)."""
        hints = get_type_hints(cls)
        comments = field_comments(cls)
        groups = {}
        for section in comments.sections:
            group = parser.add_argument_group(section.title or None,
                                              section.description or None)
            groups.update(dict.fromkeys(section.fields, group))
        for f in dataclasses.fields(cls):
            flags = ["--" + f.name.replace("_", "-"), *CLI_ALIASES.get(f.name, ())]
            typ = hints[f.name]
            group = groups.get(f.name, parser)
            text = comments.help.get(f.name, "").replace("%", "%%")
            if typ is bool:
                group.add_argument(*flags, action="store_true", default=f.default,
                                   help=text or None)
                continue
            if f.default is not None:
                text = f"{text} (default: %(default)s)".lstrip()
            base = _base_type(typ)
            kwargs: dict[str, Any] = {"type": base, "default": f.default, "help": text or None}
            if getattr(base, "__origin__", None) is list:     # --cuda-graph-bs 1 2 4 8
                kwargs.update(type=base.__args__[0], nargs="+")
            if f.name in CHOICES:
                kwargs["choices"] = CHOICES[f.name]
            group.add_argument(*flags, **kwargs)

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
