"""`radixlm bench router`: its parts end to end on the CPU (trivial workers for the overhead;
two tiny dummy engines for the shared-prefix workload and for the failover), and the hit-rate
ceiling."""

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


def tiny_engine_args(tmp_path, smollm_dir) -> str:
    model = tmp_path / "tiny"
    write_tiny_config(model, vocab_size=49152)
    return (f"--device cpu --model-path {model} --load-format dummy "
            f"--tokenizer-path {smollm_dir} --max-total-tokens 1200")


def test_cache_part_with_two_tiny_engines(tmp_path, smollm_dir, capsys):
    out = tmp_path / "c.json"
    engine = tiny_engine_args(tmp_path, smollm_dir)
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


def test_failover_part_loses_no_request_sent_after_the_kill(tmp_path, smollm_dir, capsys):
    out = tmp_path / "f.json"
    # 32 requests at 10/s, at most 4 at once: several are in flight when an engine is killed
    # 1.5 s in, and about half are sent after.
    engine = tiny_engine_args(tmp_path, smollm_dir)
    assert bench.main(["--part", "failover", "--engine-args", engine, "--num-engines", "2",
                       "--share-gpu", "--num-groups", "4", "--prompts-per-group", "8",
                       "--system-prompt-len", "60", "--question-len", "8", "--output-len", "8",
                       "--request-rate", "10", "--max-concurrency", "4", "--kill-after", "1.5",
                       "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    kill, s, metrics = res["kill"], res["summary"], res["router_metrics"]
    assert {"engine", "url", "at_s", "in_flight_on_engine", "port_down_s", "taken_out_s",
            "requests_per_engine_after"} <= kill.keys()
    assert {"total", "succeeded", "failed", "failed_sent_before_kill", "failed_sent_after_kill",
            "recover_s", "throughput_before_kill", "throughput_after_kill",
            "timeline"} <= s.keys()
    assert len(res["requests"]) == s["total"] == 32
    assert all({"sent_s", "end_s", "ok"} <= r.keys() for r in res["requests"])
    assert kill["at_s"] >= 1.5 and s["sent_after_kill"] > 0
    assert s["failed_sent_after_kill"] == 0
    # Non-streamed requests in flight on the killed engine are retried elsewhere as well.
    assert s["failed"] == 0 and s["succeeded"] == 32
    victim = kill["engine"]
    assert res["healthy_at_end"] == [i != victim for i in range(2)]
    assert s["taken_out_s"] is not None and s["recover_s"] == s["taken_out_s"] < 5
    # The killed engine's requests went to the other: every request sent after the kill, and
    # each one that failed on the killed engine (all retried).
    assert kill["requests_to_others_after"] >= s["sent_after_kill"]
    assert metrics["retries"] == metrics["worker_failures"].get(kill["url"], 0)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("router failover: engine ") and "0 after: target 0" in line
