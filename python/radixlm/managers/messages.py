"""Typed messages between the tokenizer manager, the scheduler and the detokenizer.

Each runs in its own process; these plain dataclasses travel between them pickled over ZMQ
(managers/ipc.py). They are grouped below by direction:

    TokenizerManager --TO_SCHEDULER--> Scheduler --FROM_SCHEDULER--> Detokenizer
        --(text added to ReqOutput; control replies passed through)--> TokenizerManager

ShutdownReq goes both ways: the tokenizer side asks the scheduler to stop, and the scheduler's
last message tells the detokenizer to stop too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.core.logprobs import TokenLogprob, TopLogprobs
from radixlm.sampling.params import SamplingParams


# ------------------------------------------------------ tokenizer manager -> scheduler

@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1      # -1: only the last prompt token (as SGLang)
    top_logprobs_num: int = 0
    stream: bool = False
    token_ids_logprob: list[int] | None = None   # ids whose logprobs every position reports


@dataclass
class AbortReq:
    rid: str | None = None
    # Also the sequences expanded from `rid` (a batch's rid_0, n > 1's rid-1): a client's
    # /abort_request; the server's own aborts name one sequence exactly.
    expanded: bool = False
    abort_all: bool = False          # every request, with finish_reason abort
    shutdown: bool = False           # abort_all because the server stops (503: retry elsewhere)


def expanded_from(req_rid: str, rid: str) -> bool:
    """`req_rid` is a sequence expanded from `rid` (rid_0 of a batch, rid-1 of n > 1), not
    another rid that merely starts like it."""
    return len(req_rid) > len(rid) and req_rid.startswith(rid) and req_rid[len(rid)] in "_-"


@dataclass
class FlushCacheReq:
    pass


@dataclass
class UpdateWeightsReq:
    """Serve the weights of `model_path` (same architecture) from now on; the scheduler does it
    once the running requests have finished, admitting no new ones meanwhile."""
    model_path: str
    load_format: str | None = None
    flush_cache: bool = True


@dataclass
class GetStatsReq:
    """Ask the scheduler for its runtime figures (for /get_server_info and tests)."""


@dataclass
class ProfileReq:
    """/start_profile and /stop_profile (SGLang's fields): run the torch profiler in the
    scheduler process over the next steps and write a Chrome trace."""
    action: str                          # "start" or "stop"
    output_dir: str | None = None        # default: $RADIXLM_TORCH_PROFILER_DIR, else /tmp
    num_steps: int | None = None         # stop by itself after this many scheduler steps
    activities: list[str] | None = None  # "CPU", "GPU"; default: both where there is a GPU
    with_stack: bool = False
    record_shapes: bool = False


@dataclass
class ShutdownReq:
    pass


# ------------------------------------------------------ scheduler -> detokenizer -> tokenizer manager
# (the detokenizer adds text to ReqOutputs and passes the control replies through)

@dataclass
class SchedulerReady:
    """First message from the scheduler: what the tokenizer side needs to know of the model."""
    max_total_num_tokens: int
    max_running_requests: int
    context_len: int
    vocab_size: int
    eos_token_ids: list[int]
    device: str
    dtype: str
    model_path: str
    tokenizer_path: str
    error: str | None = None         # set when start-up failed
    # The error is a flag's ValueError ("--flag ..."), judged once the model loaded: the
    # engine raises it as one (the CLI's exit 2 naming the flag), not as a start-up crash.
    flag_error: bool = False
    speculative: bool = False        # --speculative-algorithm: meta_info gets spec_verify_ct
    # Seconds per start-up phase in the scheduler process (rank 0), in order: imports,
    # weights, kv_cache, cuda_graphs, ...
    startup_phases: dict[str, float] = field(default_factory=dict)
    # Tensor parallelism: the all-reduce paths the ranks agreed on (TPGroup.all_reduce_paths).
    all_reduce_paths: list[str] = field(default_factory=list)
    # The longest prompt the KV pool holds with room for one new token (0: not said)
    max_prompt_tokens: int = 0


@dataclass
class BatchReqOutput:
    outputs: list[ReqOutput]


@dataclass
class ReqOutput:
    """What happened to one request during one scheduler step (deltas, not totals)."""
    rid: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spec_verify_ct: int = 0          # speculative decoding: verify steps so far (a total)
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    output_token_ids_logprobs: list[TopLogprobs] = field(default_factory=list)
    # Sent once, with the first output of the request (prompt logprobs are complete by then).
    input_token_logprobs: list[TokenLogprob] | None = None
    input_top_logprobs: list[TopLogprobs | None] | None = None
    input_token_ids_logprobs: list[TopLogprobs | None] | None = None
    detok: DetokSpec | None = None   # set by the scheduler on the request's first output
    text: str = ""                   # text delta, filled in by the detokenizer


@dataclass
class FinishReason:
    type: str                        # "stop" | "length" | "abort"
    matched: int | str | None = None
    message: str | None = None
    status_code: int | None = None   # 400: the request itself was invalid (e.g. bad grammar)
    length: int | None = None        # "length": the token budget that ended it (SGLang's key)

    def to_json(self) -> dict[str, Any]:
        # SGLang's shapes: "matched" only on a stop ({"type": "stop", "matched": id or
        # string}), "length" on a budget cut, message/status_code on an abort.
        out: dict[str, Any] = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        if self.length is not None:
            out["length"] = self.length
        if self.message is not None:
            out["message"] = self.message
        if self.status_code is not None:
            out["status_code"] = self.status_code
        return out


@dataclass
class DetokSpec:
    """How the detokenizer must turn a request's tokens into text (sent with its first output)."""
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    no_stop_trim: bool = False
    min_new_tokens: int = 0       # stop strings count from this token on
    stop_regex: list[str] = field(default_factory=list)


@dataclass
class FlushCacheResult:
    success: bool
    message: str = ""


@dataclass
class UpdateWeightsResult:
    success: bool
    message: str = ""
    model_path: str = ""        # the directory now served (on success)


@dataclass
class ProfileResult:
    success: bool
    message: str = ""
    trace_path: str | None = None    # the Chrome trace written (stop)
    # GPU activity over the profiled window (stop, when GPU was profiled): kernel time with
    # overlapping kernels counted once, the first kernel's start to the last one's end, count
    gpu_busy_s: float | None = None
    gpu_span_s: float | None = None
    num_kernels: int = 0
    steps: int = 0                   # scheduler steps profiled


@dataclass
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int
    max_total_num_tokens: int
    available_kv_tokens: int         # free in the allocator
    evictable_kv_tokens: int         # held by the radix cache, unlocked
    protected_kv_tokens: int         # held by the radix cache, locked by running requests
    token_usage: float               # fraction of the KV pool in use by running requests
    cache_hit_rate: float            # cached prompt tokens / prompt tokens, since start
    num_retractions: int
    new_token_ratio: float
    overlapped_steps: int = 0        # steps launched before the previous step's results were read
    decode_steps: int = 0            # decode steps launched since start
    extend_steps: int = 0            # extend (prefill) steps launched since start
    grammar_rejections: int = 0      # constrained tokens sampled without the mask and rejected
    grammar_device_rows: int = 0     # constrained rows masked from their state on the device
    short_prefills: int = 0          # prompts computed as rows of a decode step (short_prefill.py)
    generated_tokens_total: int = 0  # tokens sampled since start
    last_gen_throughput: float = 0.0 # tokens/s over the last window of steps
    weight_bytes: int = 0            # model parameters and buffers on the device
    kv_cache_bytes: int = 0          # the KV pool
    # Speculative decoding since start (1.0 / 0.0 without it): tokens per verify step, and the
    # share of draft tokens accepted
    spec_accept_length: float = 1.0
    spec_accept_rate: float = 0.0
    spec_verify_steps: int = 0
    spec_cost_ratio: float = 0.0     # a verify step's time over a plain one's (spec_policy.py)
    spec_pipelined_steps: int = 0    # verify steps built before the previous one was read
    # The hierarchical cache since start (0 without it), in tokens: copied host -> device,
    # device -> host, and read from the file tier (of those, read ahead of the match while
    # their requests waited)
    hicache_loaded_tokens: int = 0
    hicache_backed_up_tokens: int = 0
    hicache_storage_hit_tokens: int = 0
    hicache_storage_prefetched_tokens: int = 0


# What each side may receive (the scheduler ignores, with a warning, anything else).
TO_SCHEDULER = (TokenizedGenerateReq, AbortReq, FlushCacheReq, GetStatsReq, ProfileReq,
                ShutdownReq)
FROM_SCHEDULER = (SchedulerReady, BatchReqOutput, FlushCacheResult, SchedulerStats,
                  ProfileResult, ShutdownReq)
