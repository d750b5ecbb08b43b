"""MoE and MLA models on the GPU: fp32 logits against HF transformers, bf16 logits of the Triton
path against the torch path (prefill and decode), and the fast paths (CUDA graphs, the overlap
scheduler) giving the plain loop's greedy tokens in fp32."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import assert_pool_empty, tiny_checkpoint

pytestmark = pytest.mark.gpu
ARCHS = ["mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v2", "deepseek-v3"]
PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "The capital of France is a city that", "1, 2, 3, 4,"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def tokenizer_dir(request):
    """The bundled model's tokenizer (RADIXLM_TEST_TOKENIZER_DIR: a copy of its files, on a
    GPU machine without the bundled model installed)."""
    return (os.environ.get("RADIXLM_TEST_TOKENIZER_DIR")
            or request.getfixturevalue("smollm_dir"))


def _logits_per_step(checkpoint: str, dtype: str, backend: str, steps: int = 3,
                     lengths: tuple[int, ...] = (7, 130, 1, 45)):
    """Logits of a prefill of prompts of `lengths` tokens and `steps` decode steps, each
    fed HF fp32's greedy token so that every configuration sees the same inputs; also HF's
    logits for the same rows. One prompt: decode steps of one row (the batch-1 kernels:
    one-row GEMVs, MLA's absorbed products)."""
    import transformers

    from radixlm.core.forward_batch import ForwardMode
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    from radixlm.sampling.params import SamplingParams
    from radixlm.scheduler.request import Req
    from radixlm.scheduler.schedule_batch import ScheduleBatch

    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    runner, kv = create_runner_and_kv(RunnerConfig(
        model_path=checkpoint, device="cuda", dtype=dtype, max_total_tokens=4096,
        attention_backend=backend, disable_cuda_graph=True))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in lengths]
    reqs = [Req(f"r{i}", p, SamplingParams(), seed=0) for i, p in enumerate(prompts)]
    for r in reqs:
        r.extend_input_len = r.seq_len
    fb = ScheduleBatch(reqs, ForwardMode.EXTEND).prepare_extend(kv, runner.device)
    ours, theirs = [], []
    logits = runner.forward(fb).next_token_logits
    for _ in range(steps + 1):
        ours.append(logits.float().cpu())
        with torch.no_grad():
            want = torch.stack([hf(torch.tensor([r.fill_ids])).logits[0, -1] for r in reqs])
        theirs.append(want)
        for r, row in zip(reqs, want):
            r.output_ids.append(int(row.argmax()))
            runner.last_token_ids[r.req_pool_idx] = r.output_ids[-1]
        fb = ScheduleBatch(reqs, ForwardMode.DECODE).prepare_decode(kv, runner.last_token_ids)
        logits = runner.forward(fb).next_token_logits
    return ours, theirs


def _max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().amax(-1) / b.abs().amax(-1)).max())


@pytest.mark.parametrize("lengths", [(7, 130, 1, 45), (130,)], ids=["batch4", "batch1"])
def test_gpu_fp32_kernels_match_hf(checkpoint, lengths):
    """Every Triton kernel of the model (MLA or GQA attention, routing, alignment, grouped
    GEMMs) in fp32 against HF transformers."""
    ours, hf = _logits_per_step(checkpoint, "float32", "triton", lengths=lengths)
    for step, (a, b) in enumerate(zip(ours, hf)):
        assert _max_rel_err(a, b) < 1e-4, f"step {step}"


@pytest.mark.parametrize("lengths", [(7, 130, 1, 45), (130,)], ids=["batch4", "batch1"])
def test_gpu_bf16_kernels_match_torch_path(checkpoint, lengths, monkeypatch):
    """bf16: the Triton path against the torch path (torch_native attention, per-expert loop,
    torch routing, no fused kernels) on the same GPU. Not against HF fp32: bf16 rounding alone
    can flip a token's expert choice (seen on DeepSeek-V3's sigmoid routing, identically on
    both of our paths), after which that row's logits differ by far more than rounding."""
    fast, _ = _logits_per_step(checkpoint, "bfloat16", "triton", lengths=lengths)
    import radixlm.layers.moe.experts as experts
    import radixlm.layers.moe.topk as topk
    monkeypatch.setattr(experts, "triton_available", lambda: False)
    monkeypatch.setattr(topk, "triton_available", lambda: False)
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "1")
    ref, _ = _logits_per_step(checkpoint, "bfloat16", "torch_native", lengths=lengths)
    for step, (a, b) in enumerate(zip(fast, ref)):
        assert _max_rel_err(a, b) < 3e-2, f"step {step}"


def _generate(make_engine, path, tokenizer_dir, **flags):
    engine = make_engine(model_path=path, tokenizer_path=tokenizer_dir, device="cuda",
                         dtype="float32", max_total_tokens=8192, cuda_graph_max_bs=16,
                         **flags)
    lengths = [20, 5, 17, 11]
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in lengths]
    outs = [o["output_ids"] for o in engine.generate(PROMPTS, params)]
    assert [len(o) for o in outs] == lengths
    assert_pool_empty(engine)
    engine.shutdown()
    return outs


def test_gpu_graphs_and_overlap_match_plain(make_engine, checkpoint, tokenizer_dir, monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    plain = _generate(make_engine, checkpoint, tokenizer_dir, disable_cuda_graph=True,
                      disable_overlap_schedule=True)
    assert _generate(make_engine, checkpoint, tokenizer_dir) == plain
    assert _generate(make_engine, checkpoint, tokenizer_dir, disable_overlap_schedule=True) == plain
