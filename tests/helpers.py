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


def assert_pool_empty(engine) -> None:
    """After every request ended: nothing is held by requests or locked in the tree."""
    stats = engine.get_stats()
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
    assert stats.protected_kv_tokens == 0
    assert stats.available_kv_tokens + stats.evictable_kv_tokens == stats.max_total_num_tokens


# ---------------------------------------------------------------------- real server processes

import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*extra: str, timeout_s: float = 240) -> tuple[subprocess.Popen, str]:
    """`radixlm serve` on a free port, as a real subprocess; returns once /health answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                             "--device", "cpu", "--log-level", "warning", *extra],
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} during start-up")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError("server did not become healthy in time")


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


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
