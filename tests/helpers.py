"""Helpers shared by the engine tests."""

from __future__ import annotations

import torch


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy tokens from HF transformers with its own KV cache, never stopping at EOS."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        toks = []
        for _ in range(n):
            t = int(out.logits[0, -1].argmax())
            toks.append(t)
            out = model(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
    return toks


def tiny_checkpoint(path, arch: str, num_kv_heads: int = 2, num_heads: int = 4) -> str:
    """A tiny random checkpoint of `arch` with the bundled tokenizer's vocabulary size (pass
    tokenizer_path=<bundled> to the engine): dense Llama / Qwen2 / Qwen3, MoE and MLA.
    `num_heads` query heads share the 64-wide hidden state (MLA models keep their own)."""
    import transformers

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  head_dim=64 // num_heads,
                  max_position_embeddings=512, tie_word_embeddings=arch != "llama",
                  bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    moe = dict(moe_intermediate_size=32, num_experts_per_tok=2)
    mla = dict(common, head_dim=8, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
               v_head_dim=16, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1,
               n_group=4, topk_group=2, **moe)
    config = {"llama": lambda: transformers.LlamaConfig(**common),
              "qwen2": lambda: transformers.Qwen2Config(**common),
              "qwen3": lambda: transformers.Qwen3Config(**common),
              "qwen3-moe": lambda: transformers.Qwen3MoeConfig(**common, num_experts=8, **moe),
              "qwen2-moe": lambda: transformers.Qwen2MoeConfig(
                  **common, num_experts=4, shared_expert_intermediate_size=48, **moe),
              "mixtral": lambda: transformers.MixtralConfig(
                  **{**common, "intermediate_size": 32}, num_local_experts=4,
                  num_experts_per_tok=2),
              "deepseek-v2": lambda: transformers.DeepseekV2Config(
                  **mla, q_lora_rank=None, topk_method="group_limited_greedy"),
              "deepseek-v3": lambda: transformers.DeepseekV3Config(**mla, q_lora_rank=24),
              }[arch]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():   # larger than the default init, so that logits differ clearly
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
    model.save_pretrained(path)
    return str(path)


def assert_pool_empty(engine) -> None:
    """After every request ended: nothing is held by requests or locked in the tree."""
    stats = engine.get_stats()
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
    assert stats.protected_kv_tokens == 0
    assert stats.available_kv_tokens + stats.evictable_kv_tokens == stats.max_total_num_tokens


# ---------------------------------------------------------------------- real server processes

import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

# free_port and stop_server are re-exported for the tests.
from radixlm.utils.server_process import free_port, launch_server, stop_server  # noqa: E402,F401


def start_server(*extra: str, timeout_s: float = 240) -> tuple[subprocess.Popen, str]:
    """`radixlm serve` on the CPU on a free port, as a real subprocess; returns once /health
    answers."""
    return launch_server(["--device", "cpu", "--log-level", "warning", *extra], timeout_s)


def cli_error(argv: list[str], capsys) -> tuple[int, str]:
    """Run `radixlm ARGV`, which must exit with an error: (exit code, what it wrote on stderr)."""
    import pytest

    from radixlm.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err


def serve_app_in_thread(engine, server_args):
    """Generator for a fixture: the HTTP app of `engine` (real or fake) served by uvicorn in a
    thread of this process; yields the base URL, stops the server after."""
    import threading
    import time

    import uvicorn

    from radixlm.entrypoints.http_server import create_app
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, server_args), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the in-process server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def openai_client(url: str, timeout: float = 120):
    """The official client against a test server's /v1: no retries, so a failure shows as one."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=timeout)


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def is_alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------- tiny random configs

def write_tiny_config(directory, vocab_size: int = 65536) -> str:
    """A two-layer Llama config.json for `--load-format dummy`. The default vocabulary is larger
    than the bundled tokenizer's 49152, as with the big-vocab configs in benchmarks/configs served
    with the SmolLM2 tokenizer: the random model samples ids the tokenizer has no text for."""
    import json

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 1024, "vocab_size": vocab_size,
              "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": "float32", "hidden_act": "silu"}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return str(directory)


# ---------------------------------------------------------------------- Triton interpreter tier
# A test file runs its small kernel cases under TRITON_INTERPRET=1 in a child process (the
# variable is read when `@triton.jit` decorates a kernel, i.e. at import): the pytest test calls
# run_file_under_interpreter(__file__), and the file's `__main__` calls run_interpreter_cases.

def run_interpreter_cases(cases) -> int:
    """Run (description, case) pairs; a case returns its max error (or None) and fails by
    AssertionError. Prints one ok/FAIL line each, with its seconds (the interpreter is slow:
    the CPU suite's time goes to the longest cases); returns the process exit status."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before running"
    torch.set_num_threads(1)
    failed = 0
    for desc, case in cases:
        start = time.perf_counter()
        try:
            err = case()
            print(f"ok   {err if err is not None else 0.0:9.2e} {time.perf_counter() - start:6.1f}s"
                  f"  {desc}", flush=True)
        except AssertionError as e:
            failed += 1
            print(f"FAIL {desc}: {e}", flush=True)
    return 1 if failed else 0


def run_file_under_interpreter(path: str, unset_env: tuple[str, ...] = ()) -> None:
    import sys
    env = dict(os.environ, TRITON_INTERPRET="1")
    for name in unset_env:
        env.pop(name, None)
    proc = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True,
                          timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]


def run_cpu_interpreter_cases(path: str) -> None:
    """A kernel test file's own cases (its __main__) in a child under TRITON_INTERPRET=1, on a
    machine without a GPU (with one, the file's GPU tests cover the kernels)."""
    import pytest
    import torch
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the GPU tests cover the kernels")
    run_file_under_interpreter(path)


def sync_checked_backend(calls: list):
    """A TritonAttnBackend subclass whose forward_decode raises on any host-device sync (CUDA
    sync debug mode "error") and appends to `calls` each time it ran."""
    from radixlm.layers.attention.triton_backend import TritonAttnBackend

    class SyncChecked(TritonAttnBackend):
        def forward_decode(self, *args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return super().forward_decode(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                calls.append(1)

    return SyncChecked


# ---------------------------------------------------------------------- a scheduler in this process

def submit_and_wait_for_grammars(sched, prompts_and_params) -> list:
    """Hand (prompt text, SamplingParams) pairs to an in-process Scheduler as requests r0, r1,
    ... and wait until their grammars compiled; returns the waiting requests, in order."""
    import time

    from radixlm.managers.messages import TokenizedGenerateReq
    for i, (prompt, params) in enumerate(prompts_and_params):
        sched.handle_message(TokenizedGenerateReq(
            rid=f"r{i}", input_ids=sched.tokenizer.encode(prompt), sampling_params=params))
    while any(r.grammar_future is not None and not r.grammar_future.done()
              for r in sched.waiting):
        time.sleep(0.01)
    return list(sched.waiting)


def cpu_scheduler(args, send, load_tokenizer=None):
    """A Scheduler over the model of ServerArgs `args` on the CPU, in this process, with no
    transport: nothing to receive, each output message passed to `send`. Its tokenizer is
    `load_tokenizer(the runner's tokenizer path)`, by default the light one (tokenizer.json)."""
    from radixlm.model_executor.light_tokenizer import load_ids_tokenizer
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from radixlm.scheduler.config import SchedulerConfig
    from radixlm.scheduler.scheduler import Scheduler

    runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(args))
    tokenizer = (load_tokenizer or load_ids_tokenizer)(runner.tokenizer_path)
    return Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda t: [], send,
                     tokenizer=tokenizer)
