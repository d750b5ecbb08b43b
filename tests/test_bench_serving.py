"""`radixlm bench serving` against a real `radixlm serve` subprocess (bundled model, CPU), with
the native and the OpenAI backends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import start_server, stop_server
from radixlm.bench import serving

DATASET = ["--num-prompts", "6", "--min-input-len", "8", "--max-input-len", "48",
           "--min-output-len", "2", "--max-output-len", "6", "--request-rate", "50"]


@pytest.fixture(scope="module")
def server_url():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # the server inherits it: small shared CPUs
        proc, url = start_server("--max-total-tokens", "4096")
    yield url
    stop_server(proc)


def check_result(res: dict, num_prompts: int) -> None:
    assert res["completed"] == num_prompts and res["failed"] == 0, res["errors"]
    # ignore_eos: every request produced exactly what it asked for.
    assert res["output_len_mismatches"] == 0
    assert res["total_output_tokens"] == res["output_tokens_requested"]
    assert res["token_count_sources"] == ["server"]
    d = res["duration_s"]
    assert res["request_throughput"] == pytest.approx(num_prompts / d)
    assert res["output_throughput"] == pytest.approx(res["total_output_tokens"] / d)
    assert res["input_throughput"] == pytest.approx(res["total_input_tokens"] / d)
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        m = res[name]
        assert 0 < m["median"] <= m["p90"] <= m["p99"], (name, m)
        assert m["mean"] > 0
    assert res["ttft_ms"]["median"] <= res["e2e_ms"]["median"]
    for r in res["requests"]:
        assert r["ok"] and 0 < r["ttft"] <= r["e2e"]
        assert r["output_tokens"] == r["requested_output_tokens"]


@pytest.mark.parametrize("backend", ["radixlm", "openai"])
def test_serving_backends(server_url, backend, tmp_path, capsys):
    out = tmp_path / "serving.json"
    assert serving.main(["--backend", backend, "--base-url", server_url, *DATASET,
                         "--max-concurrency", "4", "--output", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(out.read_text())
    assert res["summary"] == last and last.startswith(f"serving {backend} random: 6/6 ok")
    check_result(res, 6)
    assert res["model"] == "SmolLM2-135M-Instruct"
    assert res["tokenizer"] == res["server_model_info"]["tokenizer_path"]
    assert res["settings"]["prompt_format"] == ("ids" if backend == "radixlm" else "text")
    if backend == "radixlm":   # ids are sent as they are: the server counts them all
        assert res["total_input_tokens"] == res["dataset"]["input_tokens_sent"]


def test_serving_module_entry_shared_prefix_text(server_url, tmp_path):
    """`python -m radixlm.bench.serving`, native backend with text prompts, shared prefixes."""
    out = tmp_path / "serving.json"
    proc = subprocess.run(
        [sys.executable, "-m", "radixlm.bench.serving", "--base-url", server_url,
         "--prompt-format", "text", "--dataset", "shared-prefix", "--num-groups", "2",
         "--prompts-per-group", "2", "--system-prompt-len", "32", "--question-len", "6",
         "--max-output-len", "3", "--shuffle", "--output", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert proc.stdout.strip().splitlines()[-1] == res["summary"]
    check_result(res, 4)


def test_failed_requests_are_counted(server_url, tmp_path):
    """Prompts longer than the context: every request fails with a 400, the run does not
    (it writes its results), but exits 1: nothing was measured."""
    out = tmp_path / "serving.json"
    assert serving.main(["--base-url", server_url, "--num-prompts", "2",
                         "--min-input-len", "9000", "--max-input-len", "9000",
                         "--max-output-len", "2", "--output", str(out)]) == 1
    res = json.loads(out.read_text())
    assert res["completed"] == 0 and res["failed"] == 2
    assert "400" in res["errors"][0] and res["ttft_ms"]["median"] is None


def test_unreachable_server_and_unwritable_output_are_one_line_errors(server_url, tmp_path):
    with pytest.raises(SystemExit, match="cannot reach http://127.0.0.1:9 "):
        serving.main(["--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match="--output .*cannot write there"):
        serving.main(["--base-url", server_url, "--num-prompts", "1",
                      "--output", str(blocker / "x.json")])
