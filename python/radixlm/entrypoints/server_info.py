"""What `/get_server_info` and `Engine.get_server_info()` report (SGLang's keys): the server
arguments (the API key masked), the scheduler's figures, and what is served."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from radixlm.version import __version__

BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"


def model_name(args) -> str:
    """The id clients see: --served-model-name, else the --model-path's last part, else the
    bundled model's name."""
    if args.served_model_name:
        return args.served_model_name
    if args.model_path:
        return os.path.basename(os.path.normpath(args.model_path))
    return BUNDLED_MODEL_NAME


def server_info(engine, stats, server_args=None) -> dict[str, Any]:
    """`engine` (an Engine, ready), `stats` (its scheduler's SchedulerStats), `server_args`
    (the HTTP server's; default: the engine's)."""
    ready = engine.ready
    server_args = server_args or engine.server_args
    args = dataclasses.asdict(server_args)
    if args.get("api_key"):
        args["api_key"] = "***"
    gib = 1 << 30
    # One entry per scheduler (one engine today; one per data-parallel engine later), with
    # SGLang's keys (without speculative decoding every step accepts exactly one token).
    internal_state = {
        "last_gen_throughput": stats.last_gen_throughput,
        "avg_spec_accept_length": stats.spec_accept_length,
        "num_running_reqs": stats.num_running_reqs, "num_waiting_reqs": stats.num_waiting_reqs,
        "token_usage": stats.token_usage, "cache_hit_rate": stats.cache_hit_rate,
        "memory_usage": {"weight": stats.weight_bytes / gib,
                         "kvcache": stats.kv_cache_bytes / gib,
                         "token_capacity": stats.max_total_num_tokens},
    }
    return {**args,
            **dataclasses.asdict(stats),
            # what is served, not only what was asked for (None = the bundled model)
            "model_path": ready.model_path, "requested_model_path": args["model_path"],
            "tokenizer_path": ready.tokenizer_path,
            "served_model_name": model_name(server_args),
            "max_running_requests": ready.max_running_requests,
            "context_len": ready.context_len, "device": ready.device, "dtype": ready.dtype,
            "resolved_model_path": ready.model_path, "internal_states": [internal_state],
            "startup_seconds": engine.startup_seconds, "startup_phases": ready.startup_phases,
            "engine_startup_phases": engine.startup_phases,
            "tp_all_reduce_paths": ready.all_reduce_paths,
            "version": __version__}


