"""Environment knobs, typed, in one place. Read when used, so tests can set them per engine."""

from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def check_invariants() -> bool:
    """RADIXLM_CHECK_INVARIANTS=1: the scheduler checks KV accounting after every step (tests)."""
    return _flag("RADIXLM_CHECK_INVARIANTS")


def cache_dir() -> str:
    """RADIXLM_CACHE_DIR: where converted GGUF models are kept (default ~/.cache/radixlm)."""
    return os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm")


def disable_fused_ops() -> bool:
    """RADIXLM_DISABLE_FUSED_OPS=1: RMSNorm, SiLU-and-mul and rotary run their plain PyTorch code
    on CUDA too, instead of the fused Triton kernels (A/B checks, debugging). Read at each call;
    decode CUDA graphs keep whichever path was active when they were captured (start-up). Under
    tensor parallelism it also turns off the fused all-reduce + RMSNorm (read once, at start-up,
    and agreed by the ranks)."""
    return _flag("RADIXLM_DISABLE_FUSED_OPS")


def disable_moe_fp8_activations() -> bool:
    """RADIXLM_DISABLE_MOE_FP8_ACTIVATIONS=1: FP8 experts keep their inputs in the model's dtype
    at every batch size (weight-only FP8), instead of quantizing them to FP8 (one scale per 128
    inputs of a row) for batches with 4+ rows per expert, where W8A8 was measured faster
    (layers/moe/experts.py). For accuracy checks. Read at each call; decode CUDA graphs keep the
    path active when they were captured (W8A8 is captured for decode batches of 4 * experts /
    top_k tokens and more: 16 on Mixtral)."""
    return _flag("RADIXLM_DISABLE_MOE_FP8_ACTIVATIONS")


def disable_gemv() -> bool:
    """RADIXLM_DISABLE_GEMV=1: batch-1 products of the linear layers run F.linear (cuBLAS) on
    CUDA too, instead of the Triton GEMV where it was measured faster
    (layers/kernels/gemv_kernels.py; A/B checks). Read at each call; decode CUDA graphs keep the
    path active when they were captured."""
    return _flag("RADIXLM_DISABLE_GEMV")


def disable_pdl() -> bool:
    """RADIXLM_DISABLE_PDL=1: the decode step's Triton kernels launch the usual way instead of
    with programmatic dependent launch (utils/pdl.py; A/B checks). Read at each call;
    decode CUDA graphs keep the launches they were captured with."""
    return _flag("RADIXLM_DISABLE_PDL")


def pdl_max_rows() -> int | None:
    """RADIXLM_PDL_MAX_ROWS=N: launch with PDL only the kernels of batches of at most N rows
    (tokens); unset: utils/pdl.py's measured default."""
    value = os.environ.get("RADIXLM_PDL_MAX_ROWS")
    return int(value) if value else None


def disable_quant_gemv() -> bool:
    """RADIXLM_DISABLE_QUANT_GEMV=1: FP8 and 4-bit layers multiply one row with the earlier
    small-M kernels instead of the one-row kernels (layers/quantization/fp8_gemv.py,
    int4_gemv.py; A/B checks). Read at each call; decode CUDA graphs keep the path active when
    they were captured."""
    return _flag("RADIXLM_DISABLE_QUANT_GEMV")


def overlap_on_cpu() -> bool:
    """RADIXLM_OVERLAP_ON_CPU=1: use the overlap scheduler on the CPU too (it is for GPUs, where
    it hides the host's work; the CPU test suite uses this to check it gives the same outputs)."""
    return _flag("RADIXLM_OVERLAP_ON_CPU")


def overlap_prefill_min_tokens() -> int:
    """RADIXLM_OVERLAP_PREFILL_MIN_TOKENS (default 4096): under the overlap scheduler a prefill
    step computing at least this many tokens lets the next prefill be launched before its
    results are read; a smaller one is processed first. A big prefill keeps the GPU busy longer
    than the host takes to launch the next (256 x 4096-token prompts: 0.6 s less end to end on
    an H200); after a small one the GPU would wait anyway, and its requests' answers (often
    whole scoring or program steps) would wait for the next launch (the programs benchmark's
    chains of short requests were 20-30% slower overlapped)."""
    return int(os.environ.get("RADIXLM_OVERLAP_PREFILL_MIN_TOKENS", "4096") or 4096)


def short_prefill_tokens() -> int | None:
    """RADIXLM_SHORT_PREFILL_TOKENS: the most new tokens a request's prefill may have to ride in
    a decode step (its tokens fed as rows, like a jump-forward's) instead of an extend step of
    its own; 0 turns this off. Default (unset): 64 when decode steps run as CUDA graphs, off
    otherwise (scheduler/short_prefill.py)."""
    value = os.environ.get("RADIXLM_SHORT_PREFILL_TOKENS", "")
    return int(value) if value.strip() else None


def disable_grammar_automata() -> bool:
    """RADIXLM_DISABLE_GRAMMAR_AUTOMATA=1: regular grammars (most regexes) stay on xgrammar's
    host matcher instead of running as token automata with their state on the device
    (constrained/token_automaton.py): A/B checks. Read when the grammar backend starts."""
    return _flag("RADIXLM_DISABLE_GRAMMAR_AUTOMATA")


def grammar_fill_threads() -> int | None:
    """RADIXLM_GRAMMAR_FILL_THREADS: threads xgrammar uses to fill a step's grammar masks; unset
    or 0 means automatic (the backend times both ways and keeps the faster). Filling costs ~10 us
    a row for a simple regex, where threads gain little and once lost much (the mask overhead at
    batch 64 was 178% with 8 threads instead of 30.5% in one run), and ~0.2-0.7 ms a row for
    bounded JSON strings or long alternations, where 8 threads were 2-5x faster
    (`radixlm bench grammar-fill`; benchmarks/RESULTS.md, issue 11)."""
    value = int(os.environ.get("RADIXLM_GRAMMAR_FILL_THREADS", "0") or 0)
    return value if value > 0 else None


def health_check_timeout_s() -> float:
    """RADIXLM_HEALTH_CHECK_TIMEOUT (seconds, default 20, SGLang's): how long /health_generate
    waits for the engine to produce anything before it answers 503."""
    return float(os.environ.get("RADIXLM_HEALTH_CHECK_TIMEOUT", "20") or 20)


def api_key() -> str | None:
    """RADIXLM_API_KEY: `radixlm serve`'s --api-key when the flag is not given (the engines of
    `serve --dp-size N` get the key this way, where `ps` does not show it)."""
    return os.environ.get("RADIXLM_API_KEY") or None


def dp_parent_pid() -> int | None:
    """RADIXLM_DIE_WITH_PARENT=<pid>: set by `serve --dp-size N` on its engines, which then exit
    when that process does (even if it was SIGKILLed)."""
    value = os.environ.get("RADIXLM_DIE_WITH_PARENT")
    return int(value) if value else None


LOCAL_GPU = "RADIXLM_LOCAL_GPU"


def local_gpu() -> int | None:
    """RADIXLM_LOCAL_GPU=<index>: set by the engine on each tensor-parallel rank of a GPU node,
    which sees all of the node's ranks' GPUs (NCCL and symmetric memory map peers' memory only
    between GPUs a process can see: with one GPU visible per process they fall back to copies
    through host memory) and uses this one."""
    value = os.environ.get(LOCAL_GPU)
    return int(value) if value else None


# NVLink multicast stays off in every process we start: on shared GPU hosts a program using it
# can put the host's GPUs out of service (../shared/device/README.md); radixlm never needs it.
MULTICAST_OFF = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def keep_multicast_off(env: dict[str, str] | None = None) -> None:
    """Set the multicast-off variables in `env` (default: this process) unless already set."""
    target = os.environ if env is None else env
    for key, value in MULTICAST_OFF.items():
        target.setdefault(key, value)


def one_shot_max_bytes() -> int | None:
    """RADIXLM_ONE_SHOT_MAX_BYTES: tensor-parallel all-reduces up to this size take the
    symmetric-memory one-shot path, larger ones NCCL (default: per world size, see
    distributed/custom_all_reduce.py; 0 turns one-shot off). Must be equal on all ranks."""
    value = os.environ.get("RADIXLM_ONE_SHOT_MAX_BYTES")
    return int(value) if value else None


def two_shot_max_bytes() -> int | None:
    """RADIXLM_TWO_SHOT_MAX_BYTES: all-reduces above the one-shot limit and up to this size take
    the symmetric-memory two-shot path, larger ones NCCL (default 8 MiB; 0 turns two-shot off).
    Must be equal on all ranks."""
    value = os.environ.get("RADIXLM_TWO_SHOT_MAX_BYTES")
    return int(value) if value else None


def fused_all_reduce_norm_enabled() -> bool:
    """RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM=1: tensor-parallel decoder layers all-reduce and then
    normalise in two kernels, not in distributed/fused_all_reduce_norm.py's one (A/B runs)."""
    return not _flag("RADIXLM_DISABLE_FUSED_ALL_REDUCE_NORM")


def spec_pipeline() -> bool:
    """RADIXLM_SPEC_PIPELINE=1: pipelined n-gram verify steps (scheduler/speculation.py), each
    built before the previous one's results are read. Off by default: on the bundled model on an
    H200 it was as fast as waiting, within the runs' spread (benchmarks/RESULTS.md)."""
    return _flag("RADIXLM_SPEC_PIPELINE")


def spec_pipeline_min_full_rate() -> float:
    """RADIXLM_SPEC_PIPELINE_MIN_FULL_RATE (default 0.5): a request's verify steps are pipelined
    while they accepted every draft at least this often (scheduler/speculation.py; 0: always,
    as the tests do to exercise dropped steps)."""
    return float(os.environ.get("RADIXLM_SPEC_PIPELINE_MIN_FULL_RATE", "0.5") or 0.5)


def spec_cost_ratio() -> float | None:
    """RADIXLM_SPEC_COST_RATIO: a fixed cost of a verify step over a plain one for the drafting
    policy (scheduler/spec_policy.py) instead of the one it measures: decisions that do not
    depend on timing (reproducible runs; 1.0: a request never pauses)."""
    value = os.environ.get("RADIXLM_SPEC_COST_RATIO")
    if not value:
        return None
    if float(value) < 1.0:
        raise ValueError(f"RADIXLM_SPEC_COST_RATIO must be at least 1 (a verify step costs at "
                         f"least a plain step), got {value}")
    return float(value)
