"""Unit tests of the request checks that need no server: the JSON body reader, the request
limits, non-finite sampling parameters, the CLI's unknown-flag message, the throughput meter."""

from __future__ import annotations

import math

import pytest

from radixlm.cli import main as cli_main
from radixlm.config import ServerArgs
from radixlm.entrypoints.request_body import MAX_JSON_DEPTH, BodyError, parse_json
from radixlm.entrypoints.request_limits import check_generate_limits
from radixlm.managers.generate_request import GenerateReqInput
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.throughput import GenThroughput


def test_parse_json_names_the_non_finite_field():
    with pytest.raises(BodyError, match=r"`sampling_params\[1\]\.top_p` must be a finite"):
        parse_json(b'{"sampling_params": [{"top_p": 0.5}, {"top_p": -Infinity}]}')
    with pytest.raises(BodyError, match="`the body`|finite"):
        parse_json(b"NaN")
    with pytest.raises(BodyError, match="`x` must be a finite number, got inf"):
        parse_json(b'{"x": 1e400}')
    # Large but finite numbers and long lists of ids are fine.
    assert parse_json(b'{"x": 1e300, "ids": [' + b",".join([b"7"] * 10000) + b"]}")["x"] == 1e300


def test_parse_json_bounds_nesting_and_reports_malformed_input():
    ok = b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1)
    parse_json(ok)
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        with pytest.raises(BodyError, match="nested") as e:
            parse_json(b"[" * depth + b"]" * depth)
        assert e.value.status == 400
    with pytest.raises(BodyError, match="malformed JSON"):
        parse_json(b'{"a": ')
    with pytest.raises(BodyError, match="malformed JSON"):
        parse_json(b'{"a": "\xff"}')
    assert parse_json(b"") == {}


@pytest.mark.parametrize("raw", [
    b'{"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"temperature": 0.7}}',
    b'{"seed": 18446744073709551616, "ids": [1, -9223372036854775809]}',   # beyond 64 bits
    b'{"a": 9223372036854775807, "b": -9223372036854775808, "c": 1e20, "d": [2.5e19]}',
    b'{"a": 1, "a": 2, "t": "\\u00e9\\ud83d\\ude00", "x": -0.0, "y": 1.0000000000000002}',
    b'{"x": NaN}', b'{"x": 1e999}', b'{"t": "\\ud800"}', b'{"a": ', b'\xef\xbb\xbf{}',
    '{"t": "x"}'.encode("utf-16"), b"[" * 101 + b"]" * 101, b"", b"[]", b"7",
])
def test_parse_json_gives_what_json_gives_with_or_without_orjson(raw, monkeypatch):
    """orjson (when installed) parses bodies; whatever it refuses or could render otherwise
    (integers beyond 64 bits, which it makes floats) goes to json: the result, or the error,
    is the same as json's alone."""
    from radixlm.entrypoints import request_body

    def outcome():
        try:
            got = parse_json(raw)
            return "ok", got, [type(v) for v in (got.values() if isinstance(got, dict) else [])]
        except BodyError as e:
            return "error", str(e), e.status
    fast = outcome()
    monkeypatch.setattr(request_body, "orjson", None)
    assert fast == outcome()


def test_generate_limits_count_prompts_n_and_stops():
    args = ServerArgs(max_n_per_request=2, max_prompts_per_request=3, max_stop_strings=1)

    def check(body):
        check_generate_limits(args, GenerateReqInput.from_dict(body))

    check({"text": ["a", "b", "c"], "sampling_params": {"n": 2}})
    check({"prompt": ["a", "b", "c"]})          # the `prompt` alias counts the same
    check({"input_ids": [1, 2, 3, 4, 5]})  # one prompt of five ids
    bad = [({"text": ["a"] * 4}, "prompts"),
           ({"prompt": ["a"] * 4}, "prompts"),
           ({"input_ids": [[1]] * 4}, "prompts"),
           ({"text": "a", "sampling_params": {"n": 3}}, "sampling_params.n"),
           ({"text": ["a", "b"], "sampling_params": [{}, {"n": 3}]}, "sampling_params.n"),
           ({"text": "a", "sampling_params": {"stop": ["x", "y"]}}, "sampling_params.stop")]
    for body, word in bad:
        with pytest.raises(ValueError, match=word):
            check(body)


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "frequency_penalty",
                                   "presence_penalty", "repetition_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_sampling_params_reject_non_finite(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        SamplingParams.from_dict({field: value}).validate()


def test_logit_bias_must_be_finite():
    with pytest.raises(ValueError, match=r"logit_bias\[5\] must be a finite"):
        SamplingParams.from_dict({"logit_bias": {"5": math.nan}}).validate()


def test_cli_unknown_flag_names_the_subcommand_and_the_nearest_flag(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["serve", "--prot", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: radixlm serve" in err and "did you mean --port?" in err
    with pytest.raises(SystemExit):
        cli_main(["generate", "Hi", "--max-tokens", "5"])
    err = capsys.readouterr().err
    assert "usage: radixlm generate" in err and "--max-new-tokens" in err
    with pytest.raises(SystemExit):
        cli_main(["serve", "--zzzzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzzzz" in err and "did you mean" not in err


def test_gen_throughput_excludes_idle_time():
    now = [0.0]
    meter = GenThroughput(window_s=1.0, window_steps=1000, clock=lambda: now[0])
    for _ in range(11):          # 10 steps of 8 tokens after the first, 0.01 s apart
        meter.add(8)
        now[0] += 0.01
    assert meter.read() == pytest.approx(8 / 0.01)
    now[0] += 100.0              # idle for a long time, then a slower burst
    for _ in range(5):
        meter.add(4)
        now[0] += 0.02
    assert meter.read() == pytest.approx(4 / 0.02)
    assert meter.total_tokens == 11 * 8 + 5 * 4
    meter.add(0)                 # a step without tokens changes nothing
    assert meter.read() == pytest.approx(4 / 0.02)


def test_parse_json_rejects_unpaired_surrogates_but_keeps_pairs():
    with pytest.raises(BodyError, match=r"`text` contains an unpaired UTF-16 surrogate"):
        parse_json(b'{"text": "\\ud800 hi"}')
    with pytest.raises(BodyError, match=r"`messages\[0\]\.content`"):
        parse_json(b'{"messages": [{"content": "a\\uDFFFb"}]}')
    assert parse_json(b'{"t": "\\ud83d\\ude00"}') == {"t": "\U0001F600"}   # a valid pair


def test_sglang_flag_spellings_and_values_checked_before_the_engine_starts(capsys):
    """SGLang's other names for the parallel sizes parse as ours; a bad --attention-backend,
    --log-level or --device is refused when the flags are read, naming the flag (before, the
    engine met them after loading the model)."""
    import argparse
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for argv, want in ((["--tp", "2"], 2), (["--tensor-parallel-size", "4"], 4),
                       (["--tp-size", "8"], 8)):
        assert ServerArgs.from_cli_args(parser.parse_args(argv)).tp_size == want
    ns = parser.parse_args(["--data-parallel-size", "3", "--model", "/m"])
    args = ServerArgs.from_cli_args(ns)
    assert args.dp_size == 3 and args.model_path == "/m"
    with pytest.raises(SystemExit):
        parser.parse_args(["--attention-backend", "flashinfer"])
    assert "--attention-backend" in capsys.readouterr().err
    for field, value in (("attention_backend", "fa3"), ("log_level", "loud"),
                         ("device", "bogus")):
        with pytest.raises(ValueError, match=field.replace("_", "-")):
            ServerArgs(**{field: value})
    assert ServerArgs(device="cuda:1", log_level="WARNING").device == "cuda:1"
