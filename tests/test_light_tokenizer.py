"""The light tokenizer (model_executor/light_tokenizer.py) the scheduler and the detokenizer use
instead of transformers' must give transformers' answers, id for id and character for character,
on the bundled model's tokenizer; and it must refuse the tokenizers where it might not."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest

from radixlm.model_executor.gguf_convert import bundled_gguf_path
from radixlm.model_executor.light_tokenizer import (LightTokenizer, full_tokenizer,
                                                    light_tokenizer_reason, load_ids_tokenizer)
from radixlm.model_executor.weight_source import load_tokenizer, resolve_tokenizer_dir

TEXTS = [
    "", " ", "  two  spaces ", "Hello, world!", "The capital of France is Paris.\n\nNext line",
    "naïve café – “quotes” — 東京 🚀🚀 emoji", "\t tabs\tand\r\nwindows newlines",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>text after",
    'def f(x):\n    return {"a": [1, 2.5e-3, null]}  # code', "don't won't I'm we're they've",
    " .leading punctuation ,spaces ?", "1234567890 3.14159 -42", "a" * 300,
]


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    return resolve_tokenizer_dir(bundled_gguf_path())


@pytest.fixture(scope="module")
def pair(tokenizer_dir):
    light = load_ids_tokenizer(bundled_gguf_path())
    assert isinstance(light, LightTokenizer), light_tokenizer_reason(tokenizer_dir)
    return light, load_tokenizer(tokenizer_dir)


def test_encode_matches_transformers(pair):
    light, hf = pair
    for text in TEXTS:
        assert light.encode(text, add_special_tokens=False) == \
            hf.encode(text, add_special_tokens=False), text


def test_decode_matches_transformers(pair):
    light, hf = pair
    assert len(light) == len(hf)
    rng = random.Random(0)
    n = len(hf)
    special = sorted(hf.all_special_ids)
    cases = [[i] for i in range(0, n, 97)] + [[i] for i in special]
    cases += [[rng.randrange(n) for _ in range(rng.randrange(1, 24))] for _ in range(200)]
    cases += [rng.sample(special, 1) + [rng.randrange(n) for _ in range(5)] + special
              for _ in range(20)]
    # Partial UTF-8: the first token of a multi-byte character decodes as U+FFFD in both.
    cases += [hf.encode(t, add_special_tokens=False)[:k] for t in TEXTS[5:6] for k in range(1, 12)]
    for ids in cases:
        for skip in (False, True):
            assert light.decode(ids, skip_special_tokens=skip,
                                spaces_between_special_tokens=True) == \
                hf.decode(ids, skip_special_tokens=skip), (ids, skip)


def test_encode_with_special_tokens_is_transformers_own(pair):
    light, hf = pair
    for text in TEXTS[:4]:
        assert light.encode(text) == hf.encode(text)


def test_full_gives_transformers_tokenizer_once(pair):
    light, hf = pair
    full = full_tokenizer(light)
    assert type(full) is type(hf) and full_tokenizer(light) is full
    assert full_tokenizer(hf) is hf


def _edit_json(path: str, changes: dict) -> None:
    with open(path) as f:
        data = json.load(f)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    with open(path, "w") as f:
        json.dump(data, f)


def _variant(src: str, dst: str, **config_changes) -> str:
    """A copy of the tokenizer dir with tokenizer_config.json edited. Only the small files are
    copied; the weights (half a GB) are linked, so the tests do not fill the disk."""
    os.makedirs(dst)
    for name in os.listdir(src):
        source = os.path.join(src, name)
        if name.endswith((".safetensors", ".gguf", ".bin")):
            os.symlink(source, os.path.join(dst, name))
        elif os.path.isfile(source):
            shutil.copy(source, os.path.join(dst, name))
    _edit_json(os.path.join(dst, "tokenizer_config.json"), config_changes)
    return dst


@pytest.mark.parametrize("changes, reason", [
    ({"tokenizer_class": "Qwen2Tokenizer"}, "tokenizer class"),
    ({"clean_up_tokenization_spaces": True}, "clean_up_tokenization_spaces"),
    ({"clean_up_tokenization_spaces": None}, "clean_up_tokenization_spaces"),
    ({"auto_map": {"AutoTokenizer": ["x.Tok", None]}}, "custom tokenizer code"),
    ({"split_special_tokens": True}, "split_special_tokens"),
])
def test_refuses_what_transformers_may_answer_differently(tokenizer_dir, tmp_path, changes,
                                                          reason):
    path = _variant(tokenizer_dir, str(tmp_path / "tok"), **changes)
    assert reason in (light_tokenizer_reason(path) or "")
    if "auto_map" not in changes:   # (transformers would look for the custom code)
        assert not isinstance(load_ids_tokenizer(path), LightTokenizer)


def test_refuses_without_tokenizer_json(tokenizer_dir, tmp_path):
    path = _variant(tokenizer_dir, str(tmp_path / "tok"))
    os.remove(os.path.join(path, "tokenizer.json"))
    assert light_tokenizer_reason(path) == "no tokenizer.json"


def _assert_refused_or_equal(path: str) -> None:
    """Where the light tokenizer is offered it must give transformers' answers."""
    light = load_ids_tokenizer(path)
    if not isinstance(light, LightTokenizer):
        return
    hf = load_tokenizer(path)
    assert len(light) == len(hf)
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False)
        assert light.encode(text, add_special_tokens=False) == ids, text
        for skip in (False, True):
            assert light.decode(ids, skip_special_tokens=skip) == \
                hf.decode(ids, skip_special_tokens=skip), text


def test_truncation_and_padding_in_tokenizer_json_are_not_applied(tokenizer_dir, tmp_path):
    path = _variant(tokenizer_dir, str(tmp_path / "tok"))
    _edit_json(os.path.join(path, "tokenizer.json"), {
        "truncation": {"direction": "Right", "max_length": 4, "strategy": "LongestFirst",
                       "stride": 0},
        "padding": {"strategy": {"Fixed": 32}, "direction": "Right", "pad_to_multiple_of": None,
                    "pad_id": 2, "pad_type_id": 0, "pad_token": "<|im_end|>"}})
    assert isinstance(load_ids_tokenizer(path), LightTokenizer)
    _assert_refused_or_equal(path)


@pytest.mark.parametrize("changes", [
    {"extra_special_tokens": ["<tok_x>"]},
    {"additional_special_tokens": ["<tok_y>"]},
    {"eos_token": "<tok_z>"},
])
def test_special_tokens_the_files_lack_are_refused(tokenizer_dir, tmp_path, changes):
    path = _variant(tokenizer_dir, str(tmp_path / "tok"), **changes)
    assert not isinstance(load_ids_tokenizer(path), LightTokenizer)


def test_a_named_token_not_special_in_tokenizer_json_is_refused(tokenizer_dir, tmp_path):
    path = _variant(tokenizer_dir, str(tmp_path / "tok"))
    tj = os.path.join(path, "tokenizer.json")
    with open(tj) as f:
        data = json.load(f)
    for token in data["added_tokens"]:
        if token["content"] == "<|im_end|>":
            token["special"] = False
    with open(tj, "w") as f:
        json.dump(data, f)
    assert not isinstance(load_ids_tokenizer(path), LightTokenizer)
    _assert_refused_or_equal(path)


@pytest.mark.parametrize("model_type, light", [("qwen2", False), ("phi3", False),
                                               ("llama", True)])
def test_model_types_transformers_rebuilds_are_refused(tokenizer_dir, tmp_path, model_type,
                                                       light):
    path = _variant(tokenizer_dir, str(tmp_path / "tok"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": model_type}, f)
    assert isinstance(load_ids_tokenizer(path), LightTokenizer) == light
    assert (f"model type {model_type!r}" == light_tokenizer_reason(path)) != light
