"""SchedulerConfig: the flags the scheduler reads (batching, admission, overlap, constraints).

Whether prefixes are shared (--disable-radix-cache) is the KV manager's choice, made when it is
created; the scheduler asks it (`kv.radix`).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.config import ServerArgs, config_from_args


@dataclass(frozen=True)
class SchedulerConfig:
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    chunked_prefill_size: int | None = None   # None: 8192 on GPU, 4096 on CPU; -1 disables
    max_prefill_tokens: int = 16384
    disable_overlap_schedule: bool = False
    disable_jump_forward: bool = False
    disable_optimistic_grammar: bool = False
    grammar_backend: str = "xgrammar"
    random_seed: int = 0
    decode_log_interval: int = 40
    watchdog_timeout: float = 300.0   # seconds without progress, with work, before exiting
    max_queued_requests: int | None = None   # more waiting: a new request is refused (429)
    # Speculative decoding (scheduler/speculation.py); None: off
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 4
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    speculative_ngram_min_bfs_breadth: int = 1
    speculative_ngram_max_bfs_breadth: int = 1
    speculative_num_steps: int = 3
    # Tensor parallelism: every rank runs this scheduler and must take the same decisions, so
    # nothing may depend on timing (a grammar is waited for instead of polled).
    tp_size: int = 1

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> "SchedulerConfig":
        return config_from_args(args, cls)
