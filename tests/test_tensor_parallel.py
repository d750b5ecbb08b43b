"""Tensor parallelism on the CPU (gloo): `--tp-size N` gives the tokens `--tp-size 1` gives, on
the bundled model and on tiny random Llama / Qwen2 / Qwen3 checkpoints (one with fewer KV heads
than ranks; TP2, TP4 and TP8) and MoE / MLA ones (experts split like dense MLPs, MLA heads split
over a latent every rank computes), with prompt logprobs close; bad sizes are refused with the
flag named; a rank that dies takes the engine down instead of leaving it hanging."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from helpers import tiny_checkpoint
from radixlm.managers.tokenizer_manager import EngineDeadError

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "The capital of France is a city that"]   # the third shares the first's prefix
GREEDY = {"max_new_tokens": 12, "temperature": 0}


def run(make_engine, tp: int, **kwargs) -> tuple[list[list[int]], list[list[float]]]:
    engine = make_engine(tp_size=tp, max_total_tokens=2048, **kwargs)
    assert engine.ready.all_reduce_paths == ([] if tp == 1 else ["gloo"])
    outs = engine.generate(PROMPTS, GREEDY, return_logprob=True, logprob_start_len=0)
    ids = [o["output_ids"] for o in outs]
    lps = [[lp for lp, *_ in o["meta_info"]["input_token_logprobs"][1:]] +
           [lp for lp, *_ in o["meta_info"]["output_token_logprobs"]] for o in outs]
    engine.shutdown()
    return ids, lps


def assert_same(a, b) -> None:
    (ids_a, lp_a), (ids_b, lp_b) = a, b
    assert ids_a == ids_b
    for x, y in zip(lp_a, lp_b):
        assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-4, rtol=1e-4)


def test_bundled_model_tp3_equals_tp1(make_engine):
    """SmolLM2-135M has 9 attention heads and 3 KV heads: 3 ranks (2 does not divide 9)."""
    assert_same(run(make_engine, 1), run(make_engine, 3))


@pytest.mark.parametrize("arch, kv_heads", [("llama", 1), ("qwen2", 2), ("qwen3", 4),
                                            ("qwen3-moe", 2), ("deepseek-v3", 4)])
def test_tiny_models_tp2_equal_tp1(make_engine, tmp_path, smollm_dir, arch, kv_heads):
    model = tiny_checkpoint(tmp_path / arch, arch, kv_heads)
    kwargs = dict(model_path=model, tokenizer_path=smollm_dir)
    assert_same(run(make_engine, 1, **kwargs), run(make_engine, 2, **kwargs))


def test_llama_tp4_and_tp8_equal_tp1(make_engine, tmp_path, smollm_dir):
    """Issue 19's sizes on the CPU (4 and 8 gloo ranks sharing its cores): 8 query heads and
    2 KV heads, so both replicate the KV heads; the vocabulary and the MLP split 8 ways."""
    model = tiny_checkpoint(tmp_path / "llama8", "llama", num_kv_heads=2, num_heads=8)
    kwargs = dict(model_path=model, tokenizer_path=smollm_dir)
    base = run(make_engine, 1, **kwargs)
    for tp in (4, 8):
        assert_same(base, run(make_engine, tp, **kwargs))


def test_awq_checkpoint_tp2_equals_tp1(make_engine, tmp_path, smollm_dir):
    """4-bit weights are sharded by the layers' loaders (packed words, groups of scales and
    zeros): both ranks together compute what one does."""
    import json

    from safetensors.torch import load_file

    from quant_formats import write_quantized_checkpoint
    tiny_checkpoint(tmp_path / "llama", "llama", 2)
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    state = load_file(str(tmp_path / "llama" / "model.safetensors"))
    write_quantized_checkpoint(state, config, tmp_path / "awq", "awq", group=32)
    kwargs = dict(model_path=str(tmp_path / "awq"), tokenizer_path=smollm_dir)
    assert_same(run(make_engine, 1, **kwargs), run(make_engine, 2, **kwargs))


def test_fp8_moe_mla_checkpoint_tp2_equals_tp1(make_engine, tmp_path, smollm_dir):
    """A DeepSeek-V3 FP8 block-scaled checkpoint: experts split by whole scale blocks, MLA's
    projections sharded with their block scales, kv_b_proj widened per rank."""
    import json

    from safetensors.torch import load_file

    from quant_formats import write_quantized_checkpoint
    tiny_checkpoint(tmp_path / "v3", "deepseek-v3", 4)
    config = json.loads((tmp_path / "v3" / "config.json").read_text())
    state = load_file(str(tmp_path / "v3" / "model.safetensors"))
    write_quantized_checkpoint(state, config, tmp_path / "fp8", "fp8-block")
    kwargs = dict(model_path=str(tmp_path / "fp8"), tokenizer_path=smollm_dir)
    assert_same(run(make_engine, 1, **kwargs), run(make_engine, 2, **kwargs))


def test_structured_and_overlap_under_tp(make_engine, tmp_path, smollm_dir, monkeypatch):
    """The overlap scheduler and a grammar (every rank fills the same mask) give what TP1
    gives."""
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    model = tiny_checkpoint(tmp_path / "m", "llama", 2)
    params = {"max_new_tokens": 10, "temperature": 0, "regex": r"[a-z ]{4,9}\."}
    outs = []
    for tp in (1, 2):
        engine = make_engine(model_path=model, tokenizer_path=smollm_dir, tp_size=tp,
                             max_total_tokens=2048)
        outs.append([o["output_ids"] for o in engine.generate(PROMPTS, params)]
                    + [o["output_ids"] for o in engine.generate(PROMPTS, GREEDY)])
        engine.shutdown()
    assert outs[0] == outs[1]


def test_bad_tp_sizes_are_refused_naming_the_flag(make_engine):
    with pytest.raises(ValueError, match="--tp-size 2: num_attention_heads"):
        make_engine(tp_size=2)
    with pytest.raises(ValueError, match="--tp-size"):
        make_engine(tp_size=0)


def test_serve_with_a_bad_tp_size_says_why_in_a_line():
    """`radixlm serve --tp-size 2` on a 9-head model: exit code 2 and the reason naming the
    flag, as for other bad flags, not a traceback per rank."""
    import subprocess
    import sys

    from helpers import free_port
    r = subprocess.run([sys.executable, "-m", "radixlm.cli", "serve", "--tp-size", "2",
                        "--device", "cpu", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "radixlm serve: error: --tp-size 2: num_attention_heads (9) is not divisible" \
        in r.stderr
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_dead_rank_takes_the_engine_down(make_engine, tmp_path, smollm_dir):
    model = tiny_checkpoint(tmp_path / "m", "llama", 2)
    engine = make_engine(model_path=model, tokenizer_path=smollm_dir, tp_size=2,
                         max_total_tokens=2048)
    ranks = [p for name, p in engine._children.processes if "TP rank" in name]
    os.kill(ranks[1].pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    with pytest.raises(EngineDeadError, match="TP rank 1"):
        while time.monotonic() < deadline:
            engine.generate("Hello", GREEDY)
            time.sleep(0.2)
    for _, proc in engine._children.processes:   # none left waiting in a collective
        proc.wait(timeout=30)


def test_two_nodes_on_one_host(make_engine, tmp_path, smollm_dir):
    """`--nnodes 2`: node 1 is a separate `radixlm serve --node-rank 1` command that runs only
    its rank; node 0 serves. Same tokens as TP1; node 1 exits when node 0 shuts down."""
    import subprocess
    import sys

    from helpers import free_port

    model = tiny_checkpoint(tmp_path / "m", "qwen2", 2)
    expected = run(make_engine, 1, model_path=model, tokenizer_path=smollm_dir)
    addr = f"127.0.0.1:{free_port()}"
    common = ["--device", "cpu", "--model-path", model, "--tokenizer-path", smollm_dir,
              "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr,
              "--log-level", "warning"]
    node1 = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", *common,
                              "--node-rank", "1", "--max-total-tokens", "2048"])
    try:
        got = run(make_engine, 2, model_path=model, tokenizer_path=smollm_dir, nnodes=2,
                  node_rank=0, dist_init_addr=addr)
        assert_same(expected, got)
        assert node1.wait(timeout=60) == 0
    finally:
        if node1.poll() is None:
            node1.kill()


def test_a_node_that_never_joins_is_a_clear_error(make_engine):
    from helpers import free_port

    with pytest.raises(RuntimeError, match="did not all join .* within 3 s .*--dist-timeout"):
        make_engine(tp_size=3, nnodes=3, node_rank=0, dist_timeout=3,
                    dist_init_addr=f"127.0.0.1:{free_port()}")


@pytest.mark.parametrize("flags, message", [
    (["--tp-size", "2", "--nnodes", "2"], "--dist-init-addr: is required"),
    (["--tp-size", "3", "--nnodes", "2", "--dist-init-addr", "h:1"], "--nnodes"),
    (["--node-rank", "1"], "--node-rank"),
    (["--dist-init-addr", "nohost"], "--dist-init-addr"),
    (["--tp-size", "0"], "--tp-size"),
    (["--dp-size", "0"], "--dp-size"),
    (["--base-gpu-id", "-1"], "--base-gpu-id"),
])
def test_bad_parallel_flags_name_the_flag(flags, message, capsys):
    from helpers import cli_error

    _, err = cli_error(["serve", "--device", "cpu", *flags], capsys)
    assert message in err
