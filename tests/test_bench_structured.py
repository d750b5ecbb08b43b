"""`radixlm bench structured` end to end on the CPU with tiny counts (two engines, one after the
other), plus the output validators it relies on."""

from __future__ import annotations

import json
import re

from radixlm.bench import structured

RUN_KEYS = {"requests", "wall_s", "requests_per_s", "output_tokens", "output_tokens_per_s",
            "finish_reasons", "stop_fraction", "valid_fraction", "valid_fraction_of_stopped",
            "forward_passes_per_request"}


def test_validators_accept_well_formed_outputs():
    city = ('{\n  "name": "Paris",\n  "country": "France",\n  "latitude": 48.86,\n'
            '  "population": 2100000,\n  "top 3 landmarks": ["Eiffel Tower", "Louvre", '
            '"Notre Dame"]\n}')
    assert re.fullmatch(structured.CITY_REGEX, city)
    assert not re.fullmatch(structured.CITY_REGEX, city[:-1])
    character = {"name": "Harry Potter", "house": "Gryffindor", "blood status": "Half-blood",
                 "occupation": "student", "wand": {"wood": "Holly", "core": "Phoenix feather",
                                                   "length": 11},
                 "alive": "Alive", "patronus": "Stag", "bogart": "Dementor"}
    assert structured._valid_character(json.dumps(character))
    assert not structured._valid_character(json.dumps({**character, "house": "Durmstrang"}))
    assert not structured._valid_character(json.dumps(character)[:-1])


def test_bench_structured_smoke(tmp_path, monkeypatch, capsys):
    # One math thread per engine process: on a small shared CPU, thread oversubscription makes
    # every step many times slower; the children inherit this environment.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "structured.json"
    # Only the regex workload: the bundled model writes ~130 tokens per character JSON, which
    # would double the run time; the JSON validator is tested above.
    rc = structured.main(["--device", "cpu", "--num-requests", "2", "--batch-size", "2",
                          "--mask-tokens", "8", "--repeats", "1", "--workloads", "regex",
                          "--workload-repeats", "2", "--mask-batch-sizes", "1",
                          "--output", str(out)])
    assert rc == 0
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith("structured: jump-forward ")

    res = json.loads(out.read_text())
    assert res["summary"] == last_line
    for key in ("device_name", "torch_version", "command", "argv", "engine_args", "engines",
                "jump_forward", "mask_overhead", "stop_fraction", "valid_fraction_of_stopped"):
        assert key in res, key
    assert res["argv"][:2] == ["--device", "cpu"]
    assert res["engines"]["jump_forward_on"]["server_args"]["disable_jump_forward"] is False
    assert res["engines"]["jump_forward_off"]["server_args"]["disable_jump_forward"] is True

    jf = res["jump_forward"]
    assert jf["speedup"] > 0
    assert set(jf["workloads"]) == {"regex"}
    for name, w in jf["workloads"].items():
        assert w["speedup"] > 0
        for side in ("on", "off"):
            run = w[side]
            assert RUN_KEYS <= set(run), (name, side, RUN_KEYS - set(run))
            assert run["requests"] == 2
            assert len(run["wall_s_samples"]) == 2           # --workload-repeats: the median
            assert min(run["wall_s_samples"]) <= run["wall_s"] <= max(run["wall_s_samples"])
            assert run["requests_per_s"] > 0 and run["output_tokens_per_s"] > 0
            # The grammar guarantees validity of every output that ended by itself.
            if run["finish_reasons"].get("stop"):
                assert run["valid_fraction_of_stopped"] == 1.0, (name, side, run)
        # Off: one forward pass per output token; on: never more passes than tokens.
        assert w["off"]["forward_passes_per_request"] == w["off"]["output_tokens"] / 2
        on = w["on"]
        if on["forward_passes_per_request"] is not None:
            assert 0 < on["forward_passes_per_request"] <= on["output_tokens"] / 2

    mask = res["mask_overhead"]
    assert mask["batch_size"] == 2 and mask["tokens_per_request"] == 8
    assert mask["unconstrained_step_ms"] > 0 and mask["constrained_step_ms"] > 0
    assert mask["mixed_step_ms"] > 0 and len(mask["samples_step_ms"]["mixed"]) == 1
    assert "(half constrained: " in last_line
    assert mask["all_full_length"] and mask["constrained_valid_fraction"] == 1.0
    # The first token comes from the prefill: at least 7 decode steps and 1 extend a round.
    for name in ("unconstrained", "constrained", "mixed"):
        assert mask["decode_steps_per_round"][name] >= 7, mask
        assert mask["extend_steps_per_round"][name] >= 1, mask
    # --mask-batch-sizes: the same measurement at the other batch sizes, in the summary too.
    [other] = mask["other_batch_sizes"]
    assert other["batch_size"] == 1 and other["all_full_length"]
    assert "at bs 1)" in last_line


def test_grammar_fill_benchmark_times_each_grammar(tokenizer, tmp_path):
    """`bench grammar-fill`: its examples are outputs the grammars accept (so the matchers are
    spread over real states), and every fill way is timed."""
    from radixlm.bench import grammar_fill
    examples = grammar_fill.EXAMPLES
    assert structured._valid_character(examples["json_schema"])
    assert re.fullmatch(structured.CITY_REGEX, examples["city_regex"])
    assert re.fullmatch(structured.MASK_REGEX, examples["mask_regex"])
    out = tmp_path / "fill.json"
    assert grammar_fill.main(["--tokenizer-path", tokenizer.name_or_path, "--batch-size", "4",
                              "--repeats", "1", "--output", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == set(examples)
    for r in results.values():
        assert set(r["fill_ms_by_threads"]) == {str(t) for t in grammar_fill.THREADS}
        assert all(v > 0 for v in r["fill_ms_by_threads"].values())
        assert r["per_row_us_serial"] > 0 and r["overlap_fraction"] >= 0
