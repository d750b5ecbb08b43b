"""The hierarchical cache on a GPU: the copy kernel that reads and writes the page-locked host
pool directly (every dtype, row sizes that need 4-, 2- and 1-byte words, scattered slots) equals
PyTorch's gathers, and an engine with HiCache (CUDA graphs + overlap, the defaults) gives the
tokens the engine without it gives while prefixes go device -> host -> device.

The tokenizer comes from RADIXLM_TEST_TOKENIZER (a directory of tokenizer files) where set, so
this file runs on a GPU machine without the bundled GGUF; else from the bundled model."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import assert_pool_empty

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype,heads,dim", [
    (torch.bfloat16, 8, 128), (torch.float16, 2, 64), (torch.float32, 1, 3),
    (torch.float8_e4m3fn, 1, 6), (torch.float8_e4m3fn, 3, 1)])
def test_gpu_tier_copies_equal_torch(dtype, heads, dim):
    from radixlm.mem_cache.kv_transfer import TierCopier
    from radixlm.mem_cache.pools import KVPool

    layers, device_slots, host_slots, n = 3, 300, 700, 257
    dev = KVPool(device_slots, layers, heads, dim, dtype, "cuda")
    host = KVPool(host_slots, layers, heads, dim, dtype, "cpu", pin_memory=True,
                  single_allocation=True)
    assert host.k_buffers[0].is_pinned()
    gen = torch.Generator().manual_seed(0)
    for b in host.buffers():
        b.copy_(torch.randn(b.shape, generator=gen).to(dtype))
    for b in dev.buffers():
        b.copy_(torch.randn(b.shape, generator=gen).to(dtype))
    copier = TierCopier(dev, host)
    d_slots = torch.randperm(device_slots - 1, generator=gen)[:n] + 1
    h_slots = torch.randperm(host_slots - 1, generator=gen)[:n] + 1
    before_dev = [b.clone() for b in dev.buffers()]

    copier.to_device(h_slots, d_slots.cuda())
    copier.synchronize()
    for b, old, hb in zip(dev.buffers(), before_dev, host.buffers()):
        want = old.view(torch.uint8).clone()        # bytes: index_put has no fp8 kernel
        want[d_slots.cuda()] = hb.view(torch.uint8)[h_slots].cuda()
        assert torch.equal(b.view(torch.uint8), want)   # and nothing else moved

    # Device -> host into other host slots, from a different set of device rows.
    d2 = torch.randperm(device_slots - 1, generator=gen)[:n] + 1
    h2 = torch.randperm(host_slots - 1, generator=gen)[:n] + 1
    before_host = [b.clone() for b in host.buffers()]
    copier.to_host(d2.cuda(), h2)
    copier.synchronize()
    for hb, old, b in zip(host.buffers(), before_host, dev.buffers()):
        want = old.view(torch.uint8).clone()
        want[h2] = b.view(torch.uint8)[d2.cuda()].cpu()
        assert torch.equal(hb.view(torch.uint8), want)


@pytest.fixture(scope="module")
def tokenizer_dir(request) -> str:
    return os.environ.get("RADIXLM_TEST_TOKENIZER") or request.getfixturevalue("smollm_dir")


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         initializer_range=0.02)
    path = tmp_path_factory.mktemp("random_llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


DOC = ("Radix trees share prefixes between requests, so a long document that many questions "
       "refer to is computed once. ") * 12


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_gpu_engine_hicache_same_tokens(make_engine, random_llama, tokenizer_dir, policy,
                                        monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")     # float32 GEMMs in IEEE fp32
    fillers = [f"Filler text number {i}: " + "lorem ipsum dolor sit amet " * 30
               for i in range(4)]
    sequence = [DOC + "Question: what is shared?"] + fillers + [DOC + "Question: why?"]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    results = {}
    for hicache in (False, True):
        engine = make_engine(model_path=random_llama, tokenizer_path=tokenizer_dir,
                             device="cuda", dtype="float32", max_total_tokens=600,
                             cuda_graph_max_bs=8, enable_hierarchical_cache=hicache,
                             hicache_ratio=8.0, hicache_write_policy=policy)
        outs = [engine.generate(p, params, return_logprob=True) for p in sequence]
        # The same again as one batch: loads and backups inside a running batch.
        outs += engine.generate(sequence, [params] * len(sequence), return_logprob=True)
        assert_pool_empty(engine)
        results[hicache] = outs
        engine.shutdown()
    assert [o["output_ids"] for o in results[False]] == [o["output_ids"] for o in results[True]]
    # The logprobs too (float32, the same kernels): a loaded prefix with wrong KV would move
    # them even where a near-random model's greedy tokens stay the same.
    for off, on in zip(results[False], results[True]):
        lp_off = torch.tensor([lp for lp, *_ in off["meta_info"]["output_token_logprobs"]])
        lp_on = torch.tensor([lp for lp, *_ in on["meta_info"]["output_token_logprobs"]])
        assert torch.allclose(lp_off, lp_on, atol=1e-3), (lp_off - lp_on).abs().max()
    assert results[False][5]["meta_info"]["cached_tokens"] < 20      # the device lost the doc
    assert results[True][5]["meta_info"]["cached_tokens"] >= 240     # the host had it


def test_gpu_engine_file_tier_restart_same_tokens(make_engine, random_llama, tokenizer_dir,
                                                  tmp_path, monkeypatch):
    """The file tier on a GPU: blocks written through the writer thread's device -> host copy,
    read back by a restarted engine (by its prefetch threads, or by the match), give the tokens
    and logprobs that recomputing gives."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    prompt = DOC + "Question: what is shared?"
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    base = dict(model_path=random_llama, tokenizer_path=tokenizer_dir, device="cuda",
                dtype="float32", max_total_tokens=600, cuda_graph_max_bs=8)
    engine = make_engine(**base)
    plain = engine.generate(prompt, params, return_logprob=True)
    engine.shutdown()
    tier = dict(base, enable_hierarchical_cache=True, hicache_storage_backend="file",
                hicache_storage_dir=str(tmp_path / "l3"))
    first = make_engine(**tier)
    assert first.generate(prompt, params)["meta_info"]["cached_tokens"] == 0
    first.shutdown()                              # the queued writes are flushed
    again = make_engine(**tier)
    out = again.generate(prompt, params, return_logprob=True)
    assert out["meta_info"]["cached_tokens"] >= 192           # 3 blocks of 64 from the files
    assert out["output_ids"] == plain["output_ids"]
    lp = [torch.tensor([x for x, *_ in o["meta_info"]["output_token_logprobs"]])
          for o in (plain, out)]
    assert torch.allclose(lp[0], lp[1], atol=1e-3), (lp[0] - lp[1]).abs().max()
    again.shutdown()
