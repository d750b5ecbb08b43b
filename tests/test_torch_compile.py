"""--enable-torch-compile (model_executor/torch_compile.py) on the CPU, where inductor generates
C++: the compiled decode forward gives the eager forward's logits, one dynamic graph serves
every batch size up to --torch-compile-max-bs, the engine's greedy tokens equal HF transformers'
on real checkpoints, and what cannot be compiled is refused by name before the weights load.
(On the GPU the same graphs are captured per batch size: tests/test_gpu_engine.py.)"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_pool_empty, hf_greedy, tiny_checkpoint, write_tiny_config

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "The capital of France is a city that", "1, 2, 3, 4,"]
NEW_TOKENS = 10


def test_compiled_decode_matches_eager_for_every_batch_size(tmp_path):
    from radixlm.config import ServerArgs
    from radixlm.managers.messages import TokenizedGenerateReq
    from radixlm.model_executor.forward_pass import run_model
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from radixlm.sampling.params import SamplingParams
    from radixlm.scheduler.config import SchedulerConfig
    from radixlm.scheduler.scheduler import Scheduler

    path = write_tiny_config(tmp_path / "tiny", vocab_size=512)
    args = ServerArgs(model_path=path, load_format="dummy", device="cpu", max_total_tokens=2048,
                      enable_torch_compile=True, torch_compile_max_bs=8)
    runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(args))
    assert runner.startup.seconds["torch_compile"] > 0
    compiled = runner.compiled_decode
    frames_after_warm_up = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    seen: dict[int, float] = {}
    real_forward = runner.forward

    def forward_checked(fb, *a, **k):
        if compiled.can_run(fb):    # the compiled logits against the eager ones, same inputs
            runner.attn_backend.init_forward_metadata(fb)
            got = compiled(fb)
            want = run_model(runner.model, runner.attn_backend, fb)[1]
            seen[fb.batch_size] = max(seen.get(fb.batch_size, 0.0),
                                      (got - want).abs().max().item())
        return real_forward(fb, *a, **k)

    runner.forward = forward_checked
    sched = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda t: [],
                      lambda m: None)
    for i in range(3):      # different lengths: the batch shrinks 3 -> 2 -> 1
        ids = list(range(5 + 3 * i, 20 + 7 * i))
        sched.handle_message(TokenizedGenerateReq(
            rid=f"r{i}", input_ids=ids,
            sampling_params=SamplingParams(max_new_tokens=4 + 3 * i, temperature=0)))
    while sched.has_work:
        sched.step()
    assert set(seen) == {1, 2, 3}
    assert max(seen.values()) < 1e-4, seen
    # The graph compiled at start-up (2 rows) served sizes 1 and 3 without a recompile.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames_after_warm_up


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tmp_path_factory, tokenizer):
    import transformers
    path = tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = [hf_greedy(hf, tokenizer(p).input_ids, NEW_TOKENS) for p in PROMPTS]
    assert len({tuple(w) for w in want}) > 1, "a degenerate model: every prompt says the same"
    return path, want


def test_engine_with_torch_compile_matches_hf(make_engine, smollm_dir, model):
    """Qwen3's q/k norms and rotary are traced from PyTorch code here, not the fused kernel."""
    path, want = model
    engine = make_engine(model_path=path, tokenizer_path=smollm_dir, max_total_tokens=2048,
                         enable_torch_compile=True, torch_compile_max_bs=4)
    assert engine.ready.startup_phases["torch_compile"] > 0
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    assert [o["output_ids"] for o in engine.generate(PROMPTS, params)] == want
    assert_pool_empty(engine)


def test_unsupported_models_and_flags_are_refused(smollm_dir, tmp_path):
    from radixlm.config import ServerArgs
    from radixlm.model_executor.model_runner import ModelRunner
    from radixlm.model_executor.runner_config import RunnerConfig

    with pytest.raises(ValueError, match="--torch-compile-max-bs: must be >= 1"):
        ServerArgs(torch_compile_max_bs=0)
    moe = tiny_checkpoint(tmp_path / "moe", "qwen3-moe")
    dense = tiny_checkpoint(tmp_path / "dense", "llama")
    cases = [({"model_path": moe}, "--enable-torch-compile: supported for .*Qwen3MoeForCausalLM"),
             ({"model_path": dense, "quantization": "fp8"}, "--quantization fp8"),
             ({"model_path": dense, "kv_cache_dtype": "fp8_e4m3"}, "--kv-cache-dtype")]
    for kwargs, message in cases:
        args = ServerArgs(tokenizer_path=smollm_dir, device="cpu", max_total_tokens=512,
                          enable_torch_compile=True, **kwargs)
        with pytest.raises(ValueError, match=message):
            ModelRunner(RunnerConfig.from_server_args(args))
