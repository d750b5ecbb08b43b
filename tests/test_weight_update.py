"""/update_weights_from_disk (Engine.update_weights_from_disk): another checkpoint of the same
architecture is served in place; a checkpoint that does not fit, or fails half-way, leaves the
served weights as they were; requests running when it is asked finish first."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
from safetensors.torch import load_file, save_file

from helpers import start_server, stop_server

PROMPT = "The capital of France is"
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def _checkpoint(root, smollm_dir: str, name: str, change=None, config: dict | None = None) -> str:
    """A copy of the bundled model's directory whose weights `change` edits (a dict of
    tensors in, out) and whose config.json takes `config`'s fields."""
    path = root / name
    path.mkdir()
    for f in os.listdir(smollm_dir):
        if f != "config.json" and (f != "model.safetensors" or change is None):
            os.symlink(os.path.join(smollm_dir, f), path / f)
    if change is not None:
        tensors = load_file(os.path.join(smollm_dir, "model.safetensors"))
        save_file(change(tensors), str(path / "model.safetensors"))
    with open(os.path.join(smollm_dir, "config.json")) as f:
        cfg = json.load(f)
    (path / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    return str(path)


def _flip_embeddings(tensors: dict) -> dict:
    return {k: (-v if "embed_tokens" in k else v) for k, v in tensors.items()}


def _drop_last_layer_norm(tensors: dict) -> dict:
    # (every tensor but one is copied before the loader notices what is missing)
    return {k: v for k, v in tensors.items() if not k.endswith("model.norm.weight")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, smollm_dir):
    root = tmp_path_factory.mktemp("weights")
    return {"same": _checkpoint(root, smollm_dir, "same"),
            "flipped": _checkpoint(root, smollm_dir, "flipped", _flip_embeddings),
            "broken": _checkpoint(root, smollm_dir, "broken", _drop_last_layer_norm),
            "wider": _checkpoint(root, smollm_dir, "wider", config={"hidden_size": 640})}


@pytest.fixture(scope="module")
def engine(checkpoints):
    from radixlm.entrypoints.engine import Engine
    e = Engine(model_path=checkpoints["same"], device="cpu", log_level="warning",
               max_total_tokens=4096)
    yield e
    e.shutdown()


def test_update_weights_in_place_and_back(engine, checkpoints):
    before = engine.generate(PROMPT, GREEDY)["output_ids"]

    ok, message = engine.update_weights_from_disk(checkpoints["flipped"])
    assert ok, message
    assert engine.generate(PROMPT, GREEDY)["output_ids"] != before
    assert engine.ready.model_path == checkpoints["flipped"]

    for bad, reason in (("wider", "hidden_size"), ("broken", "restored"),
                        ("/nonexistent/model", "model_path '/nonexistent/model' does not")):
        ok, message = engine.update_weights_from_disk(checkpoints.get(bad, bad))
        assert not ok and reason in message and "--model-path" not in message, message
    ok, message = engine.update_weights_from_disk(checkpoints["same"])
    assert ok, message
    # Back to the first weights exactly, cache flushed (no stale KV of the flipped model).
    again = engine.generate(PROMPT, GREEDY)
    assert again["output_ids"] == before and again["meta_info"]["cached_tokens"] == 0


def test_running_requests_finish_before_the_update(engine, checkpoints):
    long = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    want = engine.generate(PROMPT, long)["output_ids"]
    got = {}
    worker = threading.Thread(target=lambda: got.update(engine.generate(PROMPT, long)))
    worker.start()
    while engine.get_stats().num_running_reqs == 0 and worker.is_alive():
        time.sleep(0.01)
    ok, _ = engine.update_weights_from_disk(checkpoints["flipped"])
    worker.join()
    # The running request was computed with the weights it started with.
    assert ok and got["output_ids"] == want


def test_update_weights_endpoint(checkpoints):
    """Also --weight-version (reported, and replaced by an update that names one) and
    --json-model-override-args (a config.json field replaced: the context length here)."""
    proc, url = start_server("--model-path", checkpoints["same"], "--max-total-tokens", "4096",
                             "--weight-version", "step-0",
                             "--json-model-override-args", '{"max_position_embeddings": 300}')
    try:
        info = httpx.get(url + "/get_model_info", timeout=30).json()
        assert info["weight_version"] == "step-0" and info["context_length"] == 300
        resp = httpx.post(url + "/update_weights_from_disk", timeout=120,
                          json={"model_path": checkpoints["flipped"], "weight_version": "step-1"})
        assert resp.status_code == 200 and resp.json()["success"] is True
        info = httpx.get(url + "/get_model_info", timeout=30).json()
        assert info["model_path"] == checkpoints["flipped"] and info["weight_version"] == "step-1"
        resp = httpx.post(url + "/update_weights_from_disk", timeout=120,
                          json={"model_path": checkpoints["wider"]})
        assert resp.status_code == 400 and resp.json()["success"] is False
        assert "hidden_size" in resp.json()["message"]
        resp = httpx.post(url + "/update_weights_from_disk", json={"path": "x"}, timeout=30)
        assert resp.status_code == 400 and "model_path" in resp.text
        resp = httpx.post(url + "/update_weights_from_disk", timeout=30, json={
            "model_path": checkpoints["same"], "is_async": True})
        assert resp.status_code == 400 and "is_async" in resp.text
        # abort_all_requests (SGLang's): a running request ends aborted, then the update
        done = {}
        t = threading.Thread(target=lambda: done.update(r=httpx.post(url + "/generate", json={
            "text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 250,
                                                "ignore_eos": True}}, timeout=300).json()))
        t.start()
        while httpx.get(url + "/get_server_info", timeout=30).json()["num_running_reqs"] < 1:
            time.sleep(0.1)
        resp = httpx.post(url + "/update_weights_from_disk", timeout=120, json={
            "model_path": checkpoints["same"], "abort_all_requests": True})
        assert resp.status_code == 200 and resp.json()["success"] is True
        t.join(timeout=120)
        assert done["r"]["meta_info"]["finish_reason"]["type"] == "abort"
        out = httpx.post(url + "/generate", json={"text": PROMPT, "sampling_params": GREEDY},
                         timeout=60).json()
        assert out["meta_info"]["completion_tokens"] == 8
    finally:
        stop_server(proc)


@pytest.mark.gpu
def test_gpu_update_reaches_the_cuda_graphs(make_engine, tmp_path):
    """On a GPU with CUDA graphs and the overlap scheduler: the captured graphs read the new
    weights (overwritten in place), and going back gives the first tokens again. Two random
    small Llamas, token ids in and out (--skip-tokenizer-init: no tokenizer files needed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        dirs.append(str(tmp_path / f"llama{seed}"))
        LlamaForCausalLM(config).save_pretrained(dirs[-1])
    engine = make_engine(model_path=dirs[0], device="cuda", skip_tokenizer_init=True,
                         max_total_tokens=8192)
    prompts = [[1, 2, 3, 4, 5], [10, 20, 30], [7] * 9]
    params = [{**GREEDY, "max_new_tokens": 16}] * 3

    def run():
        return [o["output_ids"] for o in engine.generate(input_ids=prompts,
                                                         sampling_params=params)]

    before = run()
    assert engine.update_weights_from_disk(dirs[1])[0]
    assert all(a != b for a, b in zip(before, run()))
    assert engine.update_weights_from_disk(dirs[0])[0]
    assert run() == before
