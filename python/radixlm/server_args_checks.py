"""ServerArgs' checks: the values every flag takes, and the check of a whole set of flags
(`check_server_args`, run when a ServerArgs is made), each error a ValueError naming its flag
("--flag: ..."), which the CLI prints and exits 2 on.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable

from radixlm.utils.hub_ids import exists_or_could_be_hub_id
from radixlm.utils.json_flag import parse_json_object
from radixlm.utils.sampling_defaults import SAMPLING_DEFAULTS, parse_preferred

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

Bad = Callable[[str, str], ValueError]


def parse_model_overrides(text: str | None) -> dict:
    """--json-model-override-args as a dict (ValueError when it is not a JSON object)."""
    return parse_json_object(text, "config.json fields")


def check_server_args(args: Any) -> None:
    """`args`: a radixlm.config.ServerArgs (typed Any: config imports this module, and an
    annotation back would make an import cycle). Raises ValueError("--flag: why") for the
    first flag whose value cannot be served. Normalizes --speculative-algorithm to upper case
    (SGLang takes it in any case)."""
    def bad(flag: str, msg: str) -> ValueError:
        return ValueError(f"--{flag}: {msg}")

    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(f.name.replace("_", "-"), f"must be a finite number, got {value}")
    if args.tokenizer_path is not None and not exists_or_could_be_hub_id(args.tokenizer_path):
        raise bad("tokenizer-path", f"{args.tokenizer_path!r} does not exist (and is not a "
                                    f"Hugging Face id such as ORG/NAME)")
    if args.load_format not in LOAD_FORMATS:
        raise bad("load-format", f"must be one of {LOAD_FORMATS}, got {args.load_format!r}")
    if args.dtype not in DTYPES:
        raise bad("dtype", f"must be one of {DTYPES}, got {args.dtype!r}")
    if args.quantization is not None and args.quantization not in QUANTIZATIONS:
        raise bad("quantization", f"must be one of {QUANTIZATIONS}, got {args.quantization!r}")
    if args.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise bad("kv-cache-dtype", f"must be one of {KV_CACHE_DTYPES}, "
                                    f"got {args.kv_cache_dtype!r}")
    if args.speculative_algorithm is not None:
        # (SGLang takes the name in any case; the rest of the code sees it upper-case.)
        object.__setattr__(args, "speculative_algorithm", args.speculative_algorithm.upper())
        if args.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise bad("speculative-algorithm", f"must be one of {SPECULATIVE_ALGORITHMS}, "
                                               f"got {args.speculative_algorithm!r}")
    _check_draft_model(args, bad)
    if args.cuda_graph_max_bs < 0:
        raise bad("cuda-graph-max-bs", f"must be >= 0 (0: no CUDA graphs), got "
                                       f"{args.cuda_graph_max_bs}")
    if args.torch_compile_max_bs < 1:
        raise bad("torch-compile-max-bs", f"must be >= 1, got {args.torch_compile_max_bs}")
    if not 1 <= args.speculative_num_draft_tokens <= 64:
        raise bad("speculative-num-draft-tokens", f"must be in 1..64, got "
                                                  f"{args.speculative_num_draft_tokens}")
    lo = args.speculative_ngram_min_match_window_size
    hi = args.speculative_ngram_max_match_window_size
    if lo < 1 or hi < lo:
        raise bad("speculative-ngram-min-match-window-size",
                  f"need 1 <= min ({lo}) <= max ({hi}) "
                  f"(--speculative-ngram-max-match-window-size)")
    _check_ngram_trees(args, bad)
    if args.schedule_policy not in SCHEDULE_POLICIES:
        raise bad("schedule-policy", f"must be one of {SCHEDULE_POLICIES}, "
                                     f"got {args.schedule_policy!r}")
    if args.grammar_backend not in ("xgrammar", "none"):
        raise bad("grammar-backend", f"must be xgrammar or none, got {args.grammar_backend!r}")
    if args.hicache_ratio <= 1:
        raise bad("hicache-ratio", f"must be > 1 (the host pool is larger than the "
                                   f"device's), got {args.hicache_ratio}")
    if args.hicache_size < 0:
        raise bad("hicache-size", f"must be >= 0 GiB, got {args.hicache_size}")
    if args.hicache_write_policy not in HICACHE_WRITE_POLICIES:
        raise bad("hicache-write-policy", f"must be one of {HICACHE_WRITE_POLICIES}, "
                                          f"got {args.hicache_write_policy!r}")
    if args.hicache_storage_backend not in (None, "file"):
        raise bad("hicache-storage-backend", f"must be file, got "
                                             f"{args.hicache_storage_backend!r}")
    if args.hicache_storage_backend and not args.enable_hierarchical_cache:
        raise bad("hicache-storage-backend", "needs --enable-hierarchical-cache")
    if args.hicache_storage_dir is not None and args.hicache_storage_backend != "file":
        raise bad("hicache-storage-dir", "needs --hicache-storage-backend file")
    if args.hicache_storage_dir is not None:
        problem = _directory_problem(args.hicache_storage_dir)
        if problem:      # (found now, not after the model has loaded)
            raise bad("hicache-storage-dir", problem)
    if args.enable_hierarchical_cache and args.disable_radix_cache:
        raise bad("enable-hierarchical-cache", "needs the radix cache (drop "
                                               "--disable-radix-cache)")
    if args.page_size < 1:
        raise bad("page-size", f"must be >= 1, got {args.page_size}")
    if not -2 ** 63 <= args.random_seed < 2 ** 64:      # (what torch.manual_seed takes)
        raise bad("random-seed", f"must fit in 64 bits, got {args.random_seed}")
    if not (0.0 < args.mem_fraction_static < 1.0):
        raise bad("mem-fraction-static", f"must be in (0, 1), got {args.mem_fraction_static}")
    if args.max_total_tokens is not None and args.max_total_tokens < 2 * args.page_size:
        raise bad("max-total-tokens", f"must be >= {2 * args.page_size}, "
                                      f"got {args.max_total_tokens}")
    if args.max_running_requests is not None and args.max_running_requests < 1:
        raise bad("max-running-requests", f"must be >= 1, got {args.max_running_requests}")
    if args.chunked_prefill_size is not None and (
            args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1):
        raise bad("chunked-prefill-size", f"must be -1 (off) or >= 1, "
                                          f"got {args.chunked_prefill_size}")
    if args.max_prefill_tokens < 1:
        raise bad("max-prefill-tokens", f"must be >= 1, got {args.max_prefill_tokens}")
    # Checked here, not when the engine meets them after loading the model.
    if args.attention_backend is not None and args.attention_backend not in ATTENTION_BACKENDS:
        raise bad("attention-backend", f"must be one of {ATTENTION_BACKENDS}, "
                                       f"got {args.attention_backend!r}")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise bad("served-model-name", "is empty (leave it out for the model path's name)")
    if args.log_level.lower() not in LOG_LEVELS:
        raise bad("log-level", f"must be one of {LOG_LEVELS}, got {args.log_level!r}")
    if args.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise bad("device", f"must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.schedule_conservativeness <= 0:
        raise bad("schedule-conservativeness", f"must be > 0, "
                                               f"got {args.schedule_conservativeness}")
    if args.context_length is not None and args.context_length < 1:
        raise bad("context-length", f"must be >= 1, got {args.context_length}")
    if args.tp_size < 1:
        raise bad("tp-size", f"must be >= 1, got {args.tp_size}")
    if args.nnodes < 1:
        raise bad("nnodes", f"must be >= 1, got {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        raise bad("node-rank", f"must be in 0..{args.nnodes - 1} (--nnodes {args.nnodes}), "
                               f"got {args.node_rank}")
    if args.tp_size % args.nnodes != 0:
        raise bad("nnodes", f"--tp-size {args.tp_size} must be a multiple of it "
                            f"({args.nnodes}): each node runs as many ranks")
    if args.nnodes > 1 and args.dist_init_addr is None:
        raise bad("dist-init-addr", f"is required with --nnodes {args.nnodes}: HOST:PORT of "
                                    f"node 0, where the ranks meet")
    if args.dist_timeout is not None and args.dist_timeout < 1:
        raise bad("dist-timeout", f"must be >= 1 second, got {args.dist_timeout}")
    if args.dist_init_addr is not None:
        host, _, port = args.dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise bad("dist-init-addr", f"must be HOST:PORT, got {args.dist_init_addr!r}")
    if args.dp_size < 1:
        raise bad("dp-size", f"must be >= 1, got {args.dp_size}")
    if args.base_gpu_id < 0:
        raise bad("base-gpu-id", f"must be >= 0, got {args.base_gpu_id}")
    if args.max_request_body_mb <= 0:
        raise bad("max-request-body-mb", f"must be > 0, got {args.max_request_body_mb}")
    for name in ("max_n_per_request", "max_prompts_per_request", "max_stop_strings"):
        if getattr(args, name) < 1:
            raise bad(name.replace("_", "-"), f"must be >= 1, got {getattr(args, name)}")
    if not (0 < args.port < 65536):
        raise bad("port", f"must be in 1..65535, got {args.port}")
    if not args.watchdog_timeout > 0:
        raise bad("watchdog-timeout", f"must be > 0 seconds, got {args.watchdog_timeout}")
    if args.decode_log_interval < 1:
        raise bad("decode-log-interval", f"must be >= 1, got {args.decode_log_interval}")
    if args.cuda_graph_bs is not None and (
            not args.cuda_graph_bs or not all(isinstance(b, int) and not isinstance(b, bool)
                                              and b >= 1 for b in args.cuda_graph_bs)):
        raise bad("cuda-graph-bs", f"must be batch sizes >= 1, got {args.cuda_graph_bs}")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        raise bad("max-queued-requests", f"must be >= 1, got {args.max_queued_requests}")
    if args.stream_interval < 1:
        raise bad("stream-interval", f"must be >= 1, got {args.stream_interval}")
    if args.chat_template is not None:
        from radixlm.utils.chat_templates import load_chat_template   # stdlib-only
        try:
            load_chat_template(args.chat_template)
        except ValueError as e:
            raise bad("chat-template", str(e)) from None
    if args.skip_tokenizer_init and args.chat_template is not None:
        raise bad("chat-template", "renders chats into text for the tokenizer, which "
                                   "--skip-tokenizer-init leaves out")
    if args.json_model_override_args is not None:
        try:
            parse_model_overrides(args.json_model_override_args)
        except ValueError as e:
            raise bad("json-model-override-args", str(e)) from None
    if args.tokenizer_mode not in TOKENIZER_MODES:
        raise bad("tokenizer-mode", f"must be one of {list(TOKENIZER_MODES)}, "
                                    f"got {args.tokenizer_mode!r}")
    _check_sampling_defaults(args, bad)
    from radixlm.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS  # stdlib-only
    if args.tool_call_parser is not None and args.tool_call_parser not in TOOL_CALL_PARSERS:
        raise bad("tool-call-parser", f"must be one of {sorted(TOOL_CALL_PARSERS)}, "
                                      f"got {args.tool_call_parser!r}")
    if args.reasoning_parser is not None and args.reasoning_parser not in REASONING_PARSERS:
        raise bad("reasoning-parser", f"must be one of {sorted(REASONING_PARSERS)}, "
                                      f"got {args.reasoning_parser!r}")


def _directory_problem(path: str) -> str | None:
    """Why `path` cannot be (or be made) a writable directory, or None."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{path} exists and is not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{path} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {parent} is not writable"
    return None


def _check_sampling_defaults(args: Any, bad: Bad) -> None:
    if args.sampling_defaults not in SAMPLING_DEFAULTS:
        raise bad("sampling-defaults", f"must be one of {list(SAMPLING_DEFAULTS)}, "
                                       f"got {args.sampling_defaults!r}")
    try:
        preferred = parse_preferred(args.preferred_sampling_params)
        if preferred:
            from radixlm.sampling.params import SamplingParams   # torch-free
            SamplingParams.from_dict(preferred).validate()
    except ValueError as e:
        raise bad("preferred-sampling-params", str(e)) from None

def _check_ngram_trees(args: Any, bad: Bad) -> None:
    lo, hi = args.speculative_ngram_min_bfs_breadth, args.speculative_ngram_max_bfs_breadth
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
            ("speculative-algorithm", None if args.speculative_algorithm == "NGRAM"
             else "draft trees need --speculative-algorithm NGRAM"),
            ("speculative-num-draft-tokens", None if args.speculative_num_draft_tokens <= 62
             else "at most 62 with draft trees"),
            ("page-size", None if args.page_size == 1 else "draft trees need page size 1"),
            ("enable-torch-compile", None if not args.enable_torch_compile
             else "not supported with draft trees yet")):
        if problem is not None:
            raise bad(flag, f"{problem} (--speculative-ngram-max-bfs-breadth {hi})")

def _check_draft_model(args: Any, bad: Bad) -> None:
    """STANDALONE's flags, and what it does not support yet (each refused by name)."""
    standalone = args.speculative_algorithm == "STANDALONE"
    if args.speculative_draft_model_path is not None and not standalone:
        raise bad("speculative-draft-model-path", "needs --speculative-algorithm STANDALONE")
    if args.speculative_eagle_topk != 1 and not standalone:
        raise bad("speculative-eagle-topk", "needs --speculative-algorithm STANDALONE (NGRAM's "
                                            "trees: --speculative-ngram-max-bfs-breadth)")
    if not 1 <= args.speculative_num_steps <= 16:
        raise bad("speculative-num-steps", f"must be in 1..16, got "
                                           f"{args.speculative_num_steps}")
    if not standalone:
        return
    if args.speculative_draft_model_path is None:
        raise bad("speculative-draft-model-path", "is required with "
                                                  "--speculative-algorithm STANDALONE")
    topk, steps = args.speculative_eagle_topk, args.speculative_num_steps
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
        if args.speculative_num_draft_tokens > 62:
            raise bad("speculative-num-draft-tokens", "at most 62 with draft trees "
                                                      "(--speculative-eagle-topk > 1)")
        if args.enable_torch_compile:
            raise bad("enable-torch-compile", "not supported with draft trees yet "
                                              "(--speculative-eagle-topk > 1)")
    # The draft model keeps its KV in the target's slots: one slot per token, on one rank,
    # filled by every forward the target runs (a host tier would restore only the target's).
    for flag, unsupported in (("page-size", args.page_size != 1),
                              ("tp-size", args.tp_size != 1),
                              ("enable-hierarchical-cache", args.enable_hierarchical_cache)):
        if unsupported:
            raise bad(flag, "is not supported with --speculative-algorithm STANDALONE yet "
                            "(needs page size 1, one rank, no host tier)")
