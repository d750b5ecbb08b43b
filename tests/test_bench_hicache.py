"""`radixlm bench hicache` end to end on the CPU: two tiny dummy servers (off, on), a multi-turn
workload whose histories do not fit the device cache but do fit the host tier."""

from __future__ import annotations

import json

import pytest

from helpers import write_tiny_config
from radixlm.bench import hicache

pytestmark = pytest.mark.slow


def test_bench_hicache_multi_turn(tmp_path, smollm_dir, capsys):
    model = tmp_path / "tiny"
    write_tiny_config(model, vocab_size=49152)
    out = tmp_path / "h.json"
    assert hicache.main([
        "--server-args", f"--device cpu --model-path {model} --load-format dummy "
                         f"--tokenizer-path {smollm_dir}",
        "--max-total-tokens", "600", "--num-users", "4", "--num-turns", "3",
        "--system-prompt-len", "200", "--question-len", "16", "--output-len", "8",
        "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    off, on = res["off"], res["on"]
    assert off["requests"] == on["requests"] == 12
    assert on["prompt_tokens"] == off["prompt_tokens"]
    # The histories (~4 x 260 tokens) do not fit 600 device slots: only the host tier keeps them.
    assert on["cache_hit_rate"] > off["cache_hit_rate"] + 0.2
    assert res["throughput_ratio"] == pytest.approx(on["total_throughput"]
                                                    / off["total_throughput"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("hicache: throughput")
