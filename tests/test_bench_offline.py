"""`radixlm bench offline` end to end on the CPU with tiny datasets: the JSON figures must add
up (ignore_eos makes the output token count exact), and the HF baseline runs on a tiny random
config whose vocabulary is larger than its tokenizer's."""

from __future__ import annotations

import json

import pytest

from helpers import write_tiny_config
from radixlm import cli
from radixlm.bench import offline
from radixlm.bench.datasets import DatasetArgs, make_requests

TINY = ["--device", "cpu", "--max-total-tokens", "4096"]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    # One math thread per engine process: on a small shared CPU, oversubscription makes every
    # step many times slower; the children inherit this environment.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _check_figures(res: dict, expected_outputs: list[int]) -> None:
    r = res["results"]
    assert r["requests"] == len(expected_outputs)
    assert r["output_tokens"] == sum(expected_outputs) == res["output_tokens_requested"]
    assert res["all_full_length"] and res["finish_reasons"] == {"length": len(expected_outputs)}
    assert r["wall_s"] > 0
    assert r["output_tokens_per_s"] == pytest.approx(r["output_tokens"] / r["wall_s"])
    assert r["total_tokens_per_s"] == pytest.approx(
        (r["input_tokens"] + r["output_tokens"]) / r["wall_s"])
    assert r["requests_per_s"] == pytest.approx(r["requests"] / r["wall_s"])
    for key in ("device_name", "torch_version", "argv", "command", "engine_args", "engine",
                "dataset", "settings", "summary"):
        assert key in res, key


def test_offline_random_through_cli(tmp_path, capsys, tokenizer):
    out = tmp_path / "offline.json"
    flags = ["--num-prompts", "5", "--min-input-len", "4", "--max-input-len", "40",
             "--min-output-len", "2", "--max-output-len", "7", "--seed", "1"]
    assert cli.main(["bench", "offline", *TINY, *flags, "--output", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(out.read_text())
    assert res["summary"] == last and last.startswith("offline random: 5 reqs")
    assert res["argv"][:2] == ["--device", "cpu"]
    # The same dataset, rebuilt here: the engine produced exactly the requested lengths.
    reqs = make_requests(DatasetArgs(num_prompts=5, min_input_len=4, max_input_len=40,
                                     min_output_len=2, max_output_len=7, seed=1),
                         49152, tokenizer)
    _check_figures(res, [r.output_len for r in reqs])
    assert res["results"]["input_tokens"] == sum(len(r.input_ids) for r in reqs)
    assert res["hf_baseline"] is None


def test_offline_shared_prefix(tmp_path, capsys):
    out = tmp_path / "offline.json"
    flags = ["--dataset", "shared-prefix", "--num-groups", "2", "--prompts-per-group", "3",
             "--system-prompt-len", "40", "--question-len", "6", "--min-output-len", "2",
             "--max-output-len", "4"]
    assert offline.main([*TINY, *flags, "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert capsys.readouterr().out.strip().splitlines()[-1] == res["summary"]
    ds = res["dataset"]
    assert ds["num_requests"] == 6 and ds["input_len"] == {"min": 46, "max": 46, "mean": 46}
    assert 2 <= ds["output_len"]["min"] <= ds["output_len"]["max"] <= 4
    assert res["results"]["input_tokens"] == 6 * 46
    assert 0.0 <= res["cache_hit_rate"] <= 1.0
    assert res["output_tokens_requested"] == res["results"]["output_tokens"]
    assert res["all_full_length"]


def test_offline_hf_baseline_on_tiny_big_vocab_config(tmp_path, capsys, smollm_dir):
    model = write_tiny_config(tmp_path / "tiny")
    out = tmp_path / "offline.json"
    assert offline.main([*TINY, "--model-path", str(model), "--load-format", "dummy",
                         "--tokenizer-path", smollm_dir, "--num-prompts", "5",
                         "--max-input-len", "24", "--min-output-len", "3",
                         "--max-output-len", "9", "--temperature", "1.0",
                         "--hf-baseline", "--hf-batch-size", "2", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert capsys.readouterr().out.strip().splitlines()[-1] == res["summary"]
    assert res["engine"]["vocab_size"] == 65536 and res["engine"]["tokenizer_vocab_size"] == 49152
    assert res["all_full_length"]
    hf = res["hf_baseline"]
    assert hf["batch_size"] == 2 and hf["num_batches"] == 3
    h = hf["results"]
    # Only each request's own length counts; padded rows generate more.
    assert h["output_tokens"] == res["results"]["output_tokens"]
    assert hf["generated_tokens_incl_padding"] >= h["output_tokens"]
    assert h["output_tokens_per_s"] == pytest.approx(h["output_tokens"] / h["wall_s"])
    assert res["ratio_engine_over_hf"] == pytest.approx(
        res["results"]["output_tokens_per_s"] / h["output_tokens_per_s"])
    assert "HF" in res["summary"]
