"""On a GPU, the engine's fast paths (CUDA graphs for decode, the overlap scheduler, fused small
ops) give the same greedy tokens as the plain paths, on the bundled model and on a random-weight
model. float32 with TF32 off, so the only differences are summation orders (graph batches are
padded to a captured size, which can change cuBLAS's kernel choice)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from helpers import assert_pool_empty

pytestmark = pytest.mark.gpu

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woman who kept bees. Every morning she",
    "A list of three colours: red,",
    "Q: What is the boiling point of water at sea level?\nA:",
]
# Different lengths so requests leave the batch (and the graph batch size changes) mid-run.
LENGTHS = [40, 7, 33, 19, 26]


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory, smollm_dir):
    """A small Llama with std-0.02 random weights (clear argmax margins, unlike the dummy
    loader's near-uniform logits) and the bundled tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("random_llama")
    LlamaForCausalLM(config).save_pretrained(path)
    for name in os.listdir(smollm_dir):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(smollm_dir, name), path)
    return str(path)


@pytest.fixture(params=["bundled", "random"])
def model_path(request, smollm_dir, random_model_dir):
    return smollm_dir if request.param == "bundled" else random_model_dir


def _generate(make_engine, model_path: str, **flags) -> list[list[int]]:
    # 5 requests -> graph sizes 8 then 4, 2, 1 as they finish (padding rows included).
    engine = make_engine(model_path=model_path, device="cuda", dtype="float32",
                         max_total_tokens=8192, cuda_graph_max_bs=16, **flags)
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in LENGTHS]
    outs = [o["output_ids"] for o in engine.generate(PROMPTS, params)]
    assert [len(o) for o in outs] == LENGTHS
    assert_pool_empty(engine)
    engine.shutdown()
    return outs


def _fast_paths_match_plain(run, monkeypatch) -> list:
    """run(**flags) -> outputs: graphs + overlap, and graphs alone, give the plain loop's."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    plain = run(disable_cuda_graph=True, disable_overlap_schedule=True)
    assert run() == plain
    assert run(disable_overlap_schedule=True) == plain
    return plain


def test_gpu_graphs_and_overlap_match_plain_paths(make_engine, model_path, monkeypatch):
    plain = _fast_paths_match_plain(
        lambda **flags: _generate(make_engine, model_path, **flags), monkeypatch)
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "1")
    unfused = _generate(make_engine, model_path)
    assert unfused == plain
    # The batch-1 steps at the end launch their kernels with PDL (utils/pdl.py).
    monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", "")
    monkeypatch.setenv("RADIXLM_DISABLE_PDL", "1")
    assert _generate(make_engine, model_path) == plain


def test_gpu_seeded_sampling_kernels_match_pytorch_sampler(make_engine, smollm_dir,
                                                           monkeypatch):
    """Seeded sampled requests (top-p, top-k, both with min-p, plain temperature, greedy in the
    same batch) draw the same tokens with the sampler's kernels (cut-off search, one-pass
    draw) as with its PyTorch code: the noise is a function of (seed, position, token)."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    kinds = [dict(top_p=0.9), dict(top_k=20), dict(top_k=50, top_p=0.8, min_p=0.05),
             dict(), dict(temperature=0)]
    params = [{"max_new_tokens": n, "temperature": 0.8, "seed": 11 + i, "ignore_eos": True,
               **kind} for i, (n, kind) in enumerate(zip(LENGTHS, kinds))]
    outs = []
    for disable in ("", "1"):
        monkeypatch.setenv("RADIXLM_DISABLE_FUSED_OPS", disable)
        engine = make_engine(model_path=smollm_dir, device="cuda", dtype="float32",
                             max_total_tokens=8192, cuda_graph_max_bs=16)
        outs.append([o["output_ids"] for o in engine.generate(PROMPTS, params)])
        assert_pool_empty(engine)
        engine.shutdown()
    assert [len(o) for o in outs[0]] == LENGTHS
    assert outs[0] == outs[1]


def test_gpu_draft_trees_match_plain_paths(make_engine, smollm_dir, monkeypatch):
    """NGRAM draft trees, verified through the decode graphs captured with tree masks (and
    eagerly), and pipelined chains give the tokens of the plain loop without drafts."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    plain = _generate(make_engine, smollm_dir, disable_cuda_graph=True,
                      disable_overlap_schedule=True)
    trees = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8,
                 speculative_ngram_max_bfs_breadth=3)
    assert _generate(make_engine, smollm_dir, **trees) == plain
    assert _generate(make_engine, smollm_dir, disable_cuda_graph=True, **trees) == plain
    # Chains: under overlap, verify steps are pipelined (built on the guess that the step in
    # flight accepts every draft, dropped where it does not).
    monkeypatch.setenv("RADIXLM_SPEC_PIPELINE", "1")
    monkeypatch.setenv("RADIXLM_SPEC_PIPELINE_MIN_FULL_RATE", "0")
    chains = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)
    assert _generate(make_engine, smollm_dir, **chains) == plain


CHARACTER = {"type": "object",
             "properties": {"name": {"type": "string", "maxLength": 24},
                            "house": {"enum": ["Gryffindor", "Slytherin", "Ravenclaw",
                                               "Hufflepuff"]},
                            "wand": {"type": "object",
                                     "properties": {"wood": {"type": "string", "maxLength": 12},
                                                    "core": {"enum": ["phoenix feather",
                                                              "dragon heartstring",
                                                              "unicorn hair"]}},
                                     "required": ["wood", "core"]}},
             "required": ["name", "house", "wand"]}


def _structured(make_engine, model_path: str, **flags) -> list[dict]:
    import json
    engine = make_engine(model_path=model_path, device="cuda", dtype="float32",
                         max_total_tokens=8192, cuda_graph_max_bs=16, **flags)
    names = ["Harry Potter", "Luna Lovegood", "Severus Snape", "Cho Chang", "Dobby"]
    prompts = [engine.apply_chat_template([{"role": "user", "content":
                                            f"Describe {n} as JSON."}]) for n in names]
    params = [{"max_new_tokens": 96, "temperature": 0, "json_schema": json.dumps(CHARACTER)}
              for _ in names]
    # A regex request and a free one in the same batch.
    prompts += ["The weather in Paris: ", "Once upon a time"]
    params += [{"max_new_tokens": 40, "temperature": 0,
                "regex": r"\{\"city\": \"Paris\", \"sky\": \"(sunny|cloudy|rainy)\"\}"},
               {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}]
    outs = engine.generate(prompts, params)
    assert_pool_empty(engine)
    engine.shutdown()
    for out in outs[:len(names)]:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert set(json.loads(out["text"])) == {"name", "house", "wand"}
    return [o["output_ids"] for o in outs]


def test_gpu_structured_jump_forward_matches_plain_paths(make_engine, smollm_dir, monkeypatch):
    """Jump-forward's forced tokens ride in decode steps (one row per token, the rows past the
    largest graph in the next step): through CUDA graphs and the overlap scheduler they give
    the same tokens as the plain loop."""
    _fast_paths_match_plain(lambda **flags: _structured(make_engine, smollm_dir, **flags),
                            monkeypatch)


def test_gpu_torch_compile_matches_plain_paths(make_engine, model_path, monkeypatch):
    """--enable-torch-compile: sizes up to 4 run inductor's graphs inside the CUDA graphs, the
    size-8 graph the eager forward; both give the plain loop's tokens."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    plain = _generate(make_engine, model_path, disable_cuda_graph=True,
                      disable_overlap_schedule=True)
    assert _generate(make_engine, model_path, enable_torch_compile=True,
                     torch_compile_max_bs=4) == plain


def test_gpu_optimistic_grammar_matches_masked_plain_loop(make_engine, smollm_dir, monkeypatch):
    """Unmasked constrained rows, rejected ones drawn again from saved logits on a side stream,
    and the regexes' device automata (masks and state moves in the draw kernel), through CUDA
    graphs and the overlap scheduler: the tokens and logprobs of xgrammar's masked sampling in
    the plain loop."""
    from test_grammar_sampling import CASES
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    prompts = [p for p, _ in CASES]
    params = [{"max_new_tokens": 28, **c} for _, c in CASES]

    def run(**flags):
        engine = make_engine(model_path=smollm_dir, device="cuda", dtype="float32",
                             max_total_tokens=8192, cuda_graph_max_bs=16, **flags)
        outs = engine.generate(prompts, params, return_logprob=True)
        stats = engine.get_stats()
        assert_pool_empty(engine)
        engine.shutdown()
        return outs, stats

    monkeypatch.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")
    want, plain = run(disable_cuda_graph=True, disable_overlap_schedule=True,
                      disable_optimistic_grammar=True)
    monkeypatch.delenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA")
    got, fast = run()
    assert plain.grammar_rejections == 0 and fast.grammar_rejections > 0
    assert plain.grammar_device_rows == 0 and fast.grammar_device_rows > 0
    for w, g in zip(want, got):
        assert g["output_ids"] == w["output_ids"]
        assert ([lp for lp, _, _ in g["meta_info"]["output_token_logprobs"]]
                == pytest.approx([lp for lp, _, _ in w["meta_info"]["output_token_logprobs"]],
                                 abs=1e-3))
