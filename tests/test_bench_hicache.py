"""`radixlm bench hicache` end to end on the CPU: tiny dummy servers (off, on) for a multi-turn
workload whose histories do not fit the device cache but do fit the host tier, and for the
long-document workload; the bandwidth part's flag checks."""

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
        "--num-docs", "4", "--doc-len", "300", "--questions-per-doc", "2",
        "--part", "multi-turn,long-doc", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    lines = capsys.readouterr().out.strip().splitlines()
    for part, requests in (("multi-turn", 12), ("long-doc", 8)):
        off, on = res[part]["off"], res[part]["on"]
        assert off["requests"] == on["requests"] == requests
        assert on["prompt_tokens"] == off["prompt_tokens"]
        # The histories (~4 x 260 tokens) and the documents (4 x ~310) do not fit 600 device
        # slots: only the host tier keeps them.
        assert on["cache_hit_rate"] > off["cache_hit_rate"] + 0.2, part
        assert on["hicache_loaded_tokens"] > 0 and on["hicache_backed_up_tokens"] > 0
        assert off["hicache_loaded_tokens"] == off["hicache_backed_up_tokens"] == 0
        assert res[part]["throughput_ratio"] == pytest.approx(on["total_throughput"]
                                                              / off["total_throughput"])
        assert any(line.startswith(f"hicache {part}: throughput") for line in lines)


@pytest.mark.parametrize("argv,message", [
    (["--part", "bogus"], "--part: unknown"),
    (["--part", "bandwidth"], "--bandwidth-model-path"),
    (["--doc-len", "0"], "--doc-len must be >= 1"),
])
def test_bench_hicache_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit):
        hicache.main(argv)
    assert message in capsys.readouterr().err
