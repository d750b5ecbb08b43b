"""`radixlm bench router`: both parts end to end on the CPU (trivial workers for the overhead;
two tiny dummy engines for the shared-prefix workload), and the hit-rate ceiling."""

from __future__ import annotations

import json

import pytest

from helpers import write_tiny_config
from radixlm.bench import router as bench

pytestmark = pytest.mark.slow


def test_ceiling_is_the_longest_prefix_shared_with_any_earlier_request():
    ids = [[1, 2, 3, 4], [1, 2, 3, 9], [7, 7], [1, 2, 5, 5], [1, 2, 3, 4, 6]]
    # 0 + 3 + 0 + 2 + 4 cached of 4 + 4 + 2 + 4 + 5 tokens.
    assert bench.ceiling_hit_rate(ids) == pytest.approx(9 / 19)
    assert bench.ceiling_hit_rate([[1, 2], [1, 2]]) == pytest.approx(1 / 4)   # one computed


def test_overhead_part(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert bench.main(["--part", "overhead", "--num-requests", "30", "--duration", "0.5",
                       "--concurrency", "4", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["radixlm"]["requests_per_s"] > 0 and res["direct"]["median_ms"] > 0
    assert res["radixlm"]["added_median_ms"] == pytest.approx(
        res["radixlm"]["median_ms"] - res["direct"]["median_ms"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("router overhead:")


def test_cache_part_with_two_tiny_engines(tmp_path, smollm_dir, capsys):
    model = tmp_path / "tiny"
    write_tiny_config(model, vocab_size=49152)
    out = tmp_path / "c.json"
    engine = (f"--device cpu --model-path {model} --load-format dummy "
              f"--tokenizer-path {smollm_dir} --max-total-tokens 1200")
    assert bench.main(["--engine-args", engine, "--num-engines", "2", "--share-gpu",
                       "--num-groups", "4", "--prompts-per-group", "3",
                       "--system-prompt-len", "120", "--question-len", "8",
                       "--output-len", "2", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    runs = {(r["router"], r["policy"]): r for r in res["runs"]}
    aware, rr = runs[("radixlm", "cache_aware")], runs[("radixlm", "round_robin")]
    for r in res["runs"]:
        assert r["output_tokens"] == 4 * 3 * 2 and r["prompt_tokens"] > 0
    assert sorted(rr["requests_per_engine"]) == [6, 6]
    # Each group's questions follow its first request: every later one hits the system prompt.
    assert aware["cache_hit_rate"] > rr["cache_hit_rate"]
    assert aware["cache_hit_rate"] <= res["ceiling_hit_rate"] + 0.02
    assert aware["cache_hit_rate"] >= res["ceiling_hit_rate"] - 0.05
    assert "cache_aware vs round_robin" in capsys.readouterr().out.strip().splitlines()[-1]
