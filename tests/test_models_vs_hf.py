"""Tiny random configs of each architecture: our prefill and decode logits equal HF transformers'
on the same weights, also when the prompt's prefix comes from the radix cache."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm.core.forward_batch import ForwardMode
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.scheduler.request import Req
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.schedule_batch import ScheduleBatch

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, tie_word_embeddings=False)


def _configs():
    yield "llama", transformers.LlamaConfig(**TINY, architectures=["LlamaForCausalLM"])
    yield "llama3-rope", transformers.LlamaConfig(
        **TINY, architectures=["LlamaForCausalLM"],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    yield "llama-tied-bias", transformers.LlamaConfig(
        **{**TINY, "tie_word_embeddings": True}, attention_bias=True,
        architectures=["LlamaForCausalLM"])
    yield "qwen2", transformers.Qwen2Config(**TINY, architectures=["Qwen2ForCausalLM"])
    yield "qwen3", transformers.Qwen3Config(**TINY, head_dim=32, architectures=["Qwen3ForCausalLM"])
    # Mixture of experts: 2 or 3 of 4-8 experts per token, so a batch exercises every expert.
    yield "mixtral", transformers.MixtralConfig(
        **{**TINY, "intermediate_size": 32}, num_local_experts=4, num_experts_per_tok=2,
        architectures=["MixtralForCausalLM"])
    yield "qwen2-moe", transformers.Qwen2MoeConfig(
        **TINY, moe_intermediate_size=16, shared_expert_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, mlp_only_layers=[1], architectures=["Qwen2MoeForCausalLM"])
    yield "qwen3-moe", transformers.Qwen3MoeConfig(
        **TINY, head_dim=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"])
    # DeepSeek: MLA (latent cache, absorbed weights), a dense first layer, then MoE with shared
    # experts. V2 without a q low-rank step and with group-limited routing; V3 with q_lora,
    # sigmoid grouped routing and a correction bias, and YaRN rope scaling.
    mla = dict(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
               kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
               n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
               max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
    yield "deepseek-v2", transformers.DeepseekV2Config(
        **mla, q_lora_rank=None, n_routed_experts=8, topk_method="group_limited_greedy",
        n_group=4, topk_group=2, routed_scaling_factor=1.5,
        architectures=["DeepseekV2ForCausalLM"])
    yield "deepseek-v3", transformers.DeepseekV3Config(
        **mla, q_lora_rank=24, n_routed_experts=8, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        architectures=["DeepseekV3ForCausalLM"])


@pytest.fixture(scope="module", params=list(_configs()), ids=lambda p: p[0])
def pair(request, tmp_path_factory):
    name, cfg = request.param
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # HF initialises biases to zero; make them matter
        for n, p in [*hf.named_parameters(), *hf.named_buffers()]:
            if n.endswith("bias"):
                p.normal_(0, 0.1)
    path = tmp_path_factory.mktemp(name)
    hf.save_pretrained(path)
    runner, kv = create_runner_and_kv(RunnerConfig(model_path=str(path), device="cpu",
                                                   max_total_tokens=512))
    return hf, runner, kv


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _extend(runner, kv, reqs):
    cache = kv.prefix_cache
    for r in reqs:
        m = cache.match_prefix(r.fill_ids[:r.seq_len - 1])
        cache.inc_lock_ref(m.last_node)
        r.prefix_indices, r.last_node = m.indices, m.last_node
        r.extend_input_len = r.seq_len - len(m.indices)
    fb = ScheduleBatch(reqs, ForwardMode.EXTEND).prepare_extend(kv, runner.device)
    return runner.forward(fb).next_token_logits


def _decode(runner, kv, reqs):
    for r in reqs:  # the decode step reads its input token where the sampler leaves it
        runner.last_token_ids[r.req_pool_idx] = r.output_ids[-1]
    fb = ScheduleBatch(reqs, ForwardMode.DECODE).prepare_decode(kv, runner.last_token_ids)
    return runner.forward(fb).next_token_logits


def test_prefill_and_decode_match_hf(pair):
    hf, runner, kv = pair
    kv.flush()
    cache = kv.prefix_cache
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (5, 17, 1, 30)]
    reqs = [Req(f"r{i}", p, SamplingParams(), seed=0) for i, p in enumerate(prompts)]
    logits = _extend(runner, kv, reqs)
    for r, row in zip(reqs, logits):
        torch.testing.assert_close(row, _hf_logits(hf, r.fill_ids)[-1], atol=1e-4, rtol=1e-4)
    for _ in range(4):  # greedy decode steps, batched over requests of different lengths
        for r, row in zip(reqs, logits):
            r.output_ids.append(int(row.argmax()))
        logits = _decode(runner, kv, reqs)
        for r, row in zip(reqs, logits):
            torch.testing.assert_close(row, _hf_logits(hf, r.fill_ids)[-1], atol=1e-4, rtol=1e-4)
    for r in reqs:
        cache.cache_finished_req(r)


def test_prefix_from_radix_cache_matches_hf(pair):
    hf, runner, kv = pair
    kv.flush()
    cache = kv.prefix_cache
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(0, 97, (24,), generator=g).tolist()
    first = Req("a", shared + [1, 2, 3], SamplingParams(), seed=0)
    _extend(runner, kv, [first])
    cache.cache_finished_req(first)
    second = Req("b", shared + [4, 5], SamplingParams(), seed=0)
    logits = _extend(runner, kv, [second])
    assert second.prefix_len == 24, "the shared prefix should come from the radix cache"
    torch.testing.assert_close(logits[0], _hf_logits(hf, second.fill_ids)[-1], atol=1e-4,
                               rtol=1e-4)
    second.output_ids.append(int(logits[0].argmax()))
    logits = _decode(runner, kv, [second])
    torch.testing.assert_close(logits[0], _hf_logits(hf, second.fill_ids)[-1], atol=1e-4,
                               rtol=1e-4)
    cache.cache_finished_req(second)


def test_verify_step_scores_every_draft_token(pair):
    """A VERIFY step (several new tokens on top of a running request's KV, as speculative
    decoding and multi-token jump-forward use) gives, for every new token, HF's logits at that
    position: the backend attends causally over the cached prefix plus the drafts."""
    from radixlm.core.forward_batch import ForwardBatch
    from radixlm.model_executor.forward_pass import run_model

    hf, runner, kv = pair
    kv.flush()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 97, (11,), generator=g).tolist()
    drafts = torch.randint(0, 97, (4,), generator=g).tolist()
    req = Req("v", prompt, SamplingParams(), seed=0)
    _extend(runner, kv, [req])                    # the prompt's KV is now in the pool
    n, start = len(drafts), req.kv_allocated_len
    locs = kv.alloc_extend(req.req_pool_idx, start, n, "drafts")
    kv.req_to_token_pool.write(req.req_pool_idx, start, locs)
    fb = ForwardBatch(
        forward_mode=ForwardMode.VERIFY, batch_size=1, input_ids=torch.tensor(drafts),
        positions=torch.arange(start, start + n), out_cache_loc=locs,
        req_pool_indices=torch.tensor([req.req_pool_idx]),
        seq_lens=torch.tensor([start + n]), seq_lens_cpu=[start + n],
        extend_prefix_lens_cpu=[start], extend_seq_lens_cpu=[n])
    assert fb.forward_mode.is_extend and not fb.forward_mode.is_decode
    with torch.inference_mode():
        hidden, last = run_model(runner.model, runner.attn_backend, fb)
        every = runner.model.compute_logits(hidden)
    want = _hf_logits(hf, prompt + drafts)[len(prompt):]
    torch.testing.assert_close(every, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(last[0], want[-1], atol=1e-4, rtol=1e-4)
    req.kv_allocated_len = start + n
    kv.prefix_cache.cache_finished_req(req)


@pytest.mark.parametrize("page_size,max_rows", [(1, None), (16, None), (1, 4), (16, 4)])
def test_decode_with_jump_forward_rows_matches_hf(pair, page_size, max_rows):
    """A request that jumped forward rides in the next decode step with one row per forced token
    (the step stays a decode step: one CUDA graph, no extend pass). Every row gives HF's logits
    at its position, the request beside it is unaffected, and decoding goes on correctly from
    the jumped tokens; with pages, the released tail page and the new one line up. With a row
    cap (the largest CUDA graph) the forced tokens that do not fit come in the next step, and
    the request samples only after its last one."""
    hf, runner, kv = pair
    if page_size != 1:
        runner, kv = create_runner_and_kv(RunnerConfig(
            model_path=runner.config.model_path, device="cpu", max_total_tokens=512,
            page_size=page_size))
    kv.flush()
    g = torch.Generator().manual_seed(4)
    a = Req("a", torch.randint(0, 97, (9,), generator=g).tolist(), SamplingParams(), seed=0)
    b = Req("b", torch.randint(0, 97, (14,), generator=g).tolist(), SamplingParams(), seed=0)
    reqs = [a, b]
    logits = _extend(runner, kv, reqs)
    for _ in range(3):
        for r, row in zip(reqs, logits):
            r.output_ids.append(int(row.argmax()))
        logits = _decode(runner, kv, reqs)
    for r, row in zip(reqs, logits):
        r.output_ids.append(int(row.argmax()))   # sampled, no KV yet (kv_allocated_len + 1)
    # b's last two output tokens are replaced by five forced ones (position 16 starts a page).
    forced = torch.randint(0, 97, (5,), generator=g).tolist()
    keep = b.seq_len - 2
    assert keep == 16 and b.kv_allocated_len == 17
    kv.release_tails([(b.req_pool_idx, keep, b.kv_allocated_len)])
    b.jump_to(2, forced, keep)
    assert b.input_on_host and b.num_decode_tokens == 5
    want_b = _hf_logits(hf, b.fill_ids)[keep:]
    done = 0   # forced tokens of b computed so far
    while True:
        runner.last_token_ids[a.req_pool_idx] = a.output_ids[-1]
        runner.last_token_ids[b.req_pool_idx] = 0    # b's sampled token is stale: never read
        batch = ScheduleBatch(reqs, ForwardMode.DECODE)
        fb = batch.prepare_decode(kv, runner.last_token_ids, max_rows)
        n = fb.batch_size - 1
        assert fb.forward_mode.is_decode and n == (5 if max_rows is None else min(3, 5 - done))
        every = runner.forward(fb).next_token_logits
        torch.testing.assert_close(every[0], _hf_logits(hf, a.fill_ids)[-1], atol=1e-4,
                                   rtol=1e-4)
        torch.testing.assert_close(every[1:], want_b[done:done + n], atol=1e-4, rtol=1e-4)
        done += n
        kv.check_invariant([(r.kv_allocated_len, r.prefix_len) for r in reqs])
        assert batch.last_rows.tolist() == [0, n]
        assert batch.sample_rows() == ([0, 1] if done == 5 else [0])
        assert b.input_on_host == (done < 5)
        a.output_ids.append(int(every[0].argmax()))
        if done == 5:
            b.output_ids.append(int(every[-1].argmax()))
            break
    slots = kv.req_to_token_pool.req_to_token[b.req_pool_idx, :b.seq_len - 1]
    assert bool((slots % page_size == torch.arange(b.seq_len - 1) % page_size).all())
    logits = _decode(runner, kv, reqs)
    for r, row in zip(reqs, logits):
        torch.testing.assert_close(row, _hf_logits(hf, r.fill_ids)[-1], atol=1e-4, rtol=1e-4)
    for r in reqs:
        kv.prefix_cache.cache_finished_req(r)


def test_kv_cache_spec_matches_the_pool(pair):
    """What the model declares per token is what the runner's KV pool holds per token: K and
    V per KV head, or for MLA one latent of kv_lora_rank + qk_rope_head_dim (V is its prefix,
    not stored again)."""
    _, runner, _ = pair
    mc, spec = runner.model_config, runner.model.kv_cache_spec
    per_token = spec.bytes_per_token(runner.dtype)
    if mc.is_mla:
        latent = mc.kv_lora_rank + mc.qk_rope_head_dim
        assert (spec.kind, spec.num_layers, spec.num_kv_heads, spec.head_dim) == (
            "mla", mc.num_layers, 1, latent)
        assert per_token == mc.num_layers * latent * runner.dtype.itemsize
    else:
        assert (spec.kind, spec.num_layers, spec.num_kv_heads, spec.head_dim) == (
            "mha", mc.num_layers, mc.num_kv_heads, mc.head_dim)
        assert per_token == (2 * mc.num_layers * mc.num_kv_heads * mc.head_dim
                             * runner.dtype.itemsize)
    assert runner.kv_pool.nbytes == runner.kv_pool.num_slots * per_token


def test_deepseek_routing_the_class_does_not_implement_is_refused():
    import dataclasses
    from radixlm.core.model_config import ModelConfig
    from radixlm.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
    cfgs = dict(_configs())
    v2 = ModelConfig.from_hf(cfgs["deepseek-v2"], None)
    with pytest.raises(ValueError, match="topk_method 'noaux_tc'"):
        DeepseekV2ForCausalLM(dataclasses.replace(v2, moe_topk_method="noaux_tc"))
    v3 = ModelConfig.from_hf(cfgs["deepseek-v3"], None)
    with pytest.raises(ValueError, match="scoring_func 'softmax'"):
        DeepseekV3ForCausalLM(dataclasses.replace(v3, moe_scoring="softmax"))
    DeepseekV3ForCausalLM(dataclasses.replace(v3, moe_scoring="sigmoid",
                                              moe_topk_method="noaux_tc"))
