"""A model whose vocabulary is larger than its tokenizer's: the big-vocab configs in
benchmarks/configs run with random weights and the bundled SmolLM2 tokenizer (49152 ids), so the
model samples ids the tokenizer has no text for. They must decode as nothing, never crash, on the
native and the OpenAI endpoints, streaming or not, and under `bench serving`."""

from __future__ import annotations

import json

import httpx
import pytest

from helpers import start_server, stop_server, write_tiny_config
from radixlm.bench import serving
from radixlm.managers.detokenizer import IncrementalDetokenizer

TOKENIZER_VOCAB = 49152


class StrictTokenizer:
    """A tokenizer that fails on unknown ids the way slow (Python) tokenizers do."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def decode(self, ids, **kw) -> str:
        if any(i >= len(self.inner) for i in ids):
            raise IndexError("piece id is out of range")
        return self.inner.decode(ids, **kw)


@pytest.mark.parametrize("strict", [False, True])
def test_detokenizer_drops_ids_beyond_the_tokenizer(tokenizer, strict):
    tok = StrictTokenizer(tokenizer) if strict else tokenizer
    known = tokenizer("Hello world, this is a test.", add_special_tokens=False).input_ids
    ids = []
    for i, t in enumerate(known):   # an unknown id after every known one, one at the very end
        ids += [t, TOKENIZER_VOCAB + 1000 * i]
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push([t], finished=False) for t in ids] + [detok.push([], finished=True)]
    assert "".join(deltas) == detok.text == tokenizer.decode(known)
    only_unknown = IncrementalDetokenizer(tok)
    assert only_unknown.push([60000, 65000], finished=True) == ""


@pytest.fixture(scope="module")
def big_vocab_server(tmp_path_factory, smollm_dir):
    model = write_tiny_config(tmp_path_factory.mktemp("big_vocab"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        proc, url = start_server("--model-path", model, "--load-format", "dummy",
                                 "--tokenizer-path", smollm_dir, "--max-total-tokens", "4096")
    yield url
    stop_server(proc)


def test_endpoints_serve_out_of_range_ids(big_vocab_server):
    url = big_vocab_server
    params = {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True,
              "sampling_seed": 7}
    out = httpx.post(url + "/generate", json={"text": "Hello", "sampling_params": params},
                     timeout=60).json()
    # Random weights: near-uniform over 65536 ids, so about a quarter have no text.
    assert out["meta_info"]["completion_tokens"] == 24
    assert any(t >= TOKENIZER_VOCAB for t in out["output_ids"]), out["output_ids"]

    with httpx.stream("POST", url + "/generate", timeout=60,
                      json={"text": "Hello", "sampling_params": params, "stream": True}) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith("data:") and line != "data: [DONE]"]
    assert r.status_code == 200 and "error" not in events[-1]
    # Same seed, same tokens and text as the non-streaming request.
    assert events[-1]["output_ids"] == out["output_ids"] and events[-1]["text"] == out["text"]

    body = {"model": "x", "prompt": "Hello", "max_tokens": 24, "temperature": 1.0,
            "ignore_eos": True, "seed": 7}
    done = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    assert done["usage"]["completion_tokens"] == 24 and done["choices"][0]["finish_reason"]
    with httpx.stream("POST", url + "/v1/completions", timeout=60,
                      json={**body, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2][5:])["usage"]
    assert usage["completion_tokens"] == 24


@pytest.mark.parametrize("backend", ["radixlm", "openai"])
def test_bench_serving_on_big_vocab(big_vocab_server, backend, tmp_path):
    out = tmp_path / "serving.json"
    assert serving.main(["--backend", backend, "--base-url", big_vocab_server,
                         "--num-prompts", "4", "--min-input-len", "8", "--max-input-len", "32",
                         "--min-output-len", "4", "--max-output-len", "12",
                         "--temperature", "1.0", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["completed"] == 4 and res["failed"] == 0, res["errors"]
    # Counted by the server: chunks that carry only text-less ids still count their tokens.
    assert res["total_output_tokens"] == res["output_tokens_requested"]
