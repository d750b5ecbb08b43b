"""Hostile and odd input against a real server: every bad request gets an OpenAI-shaped 4xx
naming what is wrong, and the server goes on serving. Also SGLang's info endpoints (what
sglang-router and sglang.bench_serving read) and the request limits (server settings)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from helpers import start_server, stop_server

CONTEXT = 512
LIMITS = ["--max-n-per-request", "4", "--max-prompts-per-request", "8",
          "--max-stop-strings", "4", "--max-request-body-mb", "1"]


@pytest.fixture(scope="module")
def url():
    proc, url = start_server("--context-length", str(CONTEXT), "--max-total-tokens", "4096",
                             *LIMITS)
    yield url
    stop_server(proc)


def post_raw(url: str, path: str, raw: bytes, **kw) -> httpx.Response:
    return httpx.post(url + path, content=raw, timeout=60,
                      headers={"content-type": "application/json"}, **kw)


def assert_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["object"] == "error" and body["error"]["code"] == status
    for word in words:
        assert word in body["error"]["message"], body["error"]["message"]
    return body["error"]


def assert_serving(url: str) -> None:
    """A normal request right after an error succeeds."""
    r = httpx.post(url + "/generate", timeout=60, json={
        "text": "The capital of France is", "sampling_params": {"max_new_tokens": 3,
                                                                 "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3


# ---------------------------------------------------------------------- non-finite numbers

NON_FINITE = [
    ("/generate", '{"text": "hi", "sampling_params": {"temperature": NaN}}',
     "sampling_params.temperature"),
    ("/generate", '{"text": "hi", "sampling_params": {"temperature": 1e999}}',
     "sampling_params.temperature"),
    ("/generate", '{"text": "hi", "sampling_params": {"top_p": Infinity}}',
     "sampling_params.top_p"),
    ("/generate", '{"text": "hi", "sampling_params": {"frequency_penalty": -Infinity}}',
     "sampling_params.frequency_penalty"),
    ("/generate", '{"text": ["a", "b"], "sampling_params": [{}, {"min_p": NaN}]}',
     "sampling_params[1].min_p"),
    ("/generate", '{"text": "hi", "sampling_params": {"logit_bias": {"5": NaN}}}',
     "sampling_params.logit_bias.5"),
    ("/v1/completions", '{"prompt": "hi", "temperature": NaN}', "temperature"),
    ("/v1/completions", '{"prompt": "hi", "presence_penalty": -1e999}', "presence_penalty"),
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"5": Infinity}}', "logit_bias.5"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "hi"}], "top_p": NaN}', "top_p"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": Infinity}',
     "repetition_penalty"),
]


@pytest.mark.parametrize("path,raw,field", NON_FINITE,
                         ids=[f"{p}-{f}" for p, _, f in NON_FINITE])
def test_non_finite_numbers_are_rejected(url, path, raw, field):
    assert_error(post_raw(url, path, raw.encode()), 400, field, "finite")


@pytest.mark.parametrize("path,raw,words", [
    ("/generate", b'{"text": "\\ud800 hi", "sampling_params": {"max_new_tokens": 2}}',
     ("text", "surrogate")),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
     ("messages[0].content", "surrogate")),
    ("/tokenize", b'{"prompt": "\\ud800"}', ("prompt", "surrogate")),
    ("/generate", b'{"text": "hi", "rid": 123}', ("rid",)),
    ("/generate", b'{"text": "hi", "image_data": "http://x/y.png"}', ("image_data",)),
    ("/generate", b'{"text": "hi", "lora_path": "my-adapter"}', ("lora_path",)),
    ("/generate", b'{"text": "hi", "data_parallel_rank": 1}', ("data_parallel_rank",)),
])
def test_odd_strings_are_a_400(url, path, raw, words):
    assert_error(post_raw(url, path, raw), 400, *words)
    assert_serving(url)


def test_neutral_sglang_fields_are_accepted(url):
    r = httpx.post(url + "/generate", timeout=60, json={
        "text": "hi", "data_parallel_rank": 0, "image_data": None, "return_hidden_states": False,
        "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text


def test_after_non_finite_the_server_serves(url):
    assert_error(post_raw(url, "/generate",
                          b'{"text": "hi", "sampling_params": {"temperature": NaN}}'), 400)
    assert_serving(url)


# ---------------------------------------------------------------------- nesting and size

@pytest.mark.parametrize("path", ["/generate", "/tokenize", "/detokenize", "/abort_request",
                                  "/v1/completions", "/v1/chat/completions"])
def test_deeply_nested_json_is_a_400(url, path):
    deep = b'{"text": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert_error(post_raw(url, path, deep), 400, "nested")
    moderately = b'{"text": ' + b"[" * 150 + b"]" * 150 + b"}"  # under the parser's limit
    assert_error(post_raw(url, path, moderately), 400, "nested")
    assert_serving(url)


@pytest.mark.parametrize("ids", [
    b"[[1, 2], [3, [4]]]", b"[[1, 2], [1.5]]", b"[[1, 2], [true]]", b'[[1, 2], ["3"]]',
    b"[[1, 2], [18446744073709551616]]", b"[[1, 2], [NaN]]",
    b"[[1, 2], " + b"[" * 150 + b"]" * 150 + b"]", b"[[1, 2], " + b"[" * 5000 + b"]" * 5000 + b"]",
])
def test_bad_ids_in_a_batch_are_a_400(url, ids):
    """/generate leaves the type scan of a batch's id lists to the request's own check (one scan
    of 1M ids, not two): whatever they hold besides ints is still a 400."""
    error = assert_error(post_raw(url, "/generate", b'{"input_ids": ' + ids + b"}"), 400)
    assert any(word in error["message"] for word in ("input_ids", "nested", "finite",
                                                     "vocabulary")), error["message"]
    assert_serving(url)


def test_body_over_the_size_limit_is_a_413(url):
    big = json.dumps({"text": "x" * (2 * 1024 * 1024)}).encode()
    assert_error(post_raw(url, "/generate", big), 413, "--max-request-body-mb")

    def chunks():  # no Content-Length: the limit holds for a chunked body too
        for _ in range(3):
            yield b" " * (512 * 1024)

    r = httpx.post(url + "/v1/completions", content=chunks(), timeout=60,
                   headers={"content-type": "application/json"})
    assert_error(r, 413)
    assert_serving(url)


def test_long_text_is_rejected_before_tokenizing(url):
    text = "word " * 150_000  # 750 kB: under the body limit, far over the context
    start = time.monotonic()
    r = httpx.post(url + "/generate", json={"text": text}, timeout=60)
    assert_error(r, 400, "context length")
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": text}]})
    assert_error(r, 400, "context length")
    # ... also spread over many messages (checked before the chat template renders them)
    for messages in ([{"role": "user", "content": "hi"}] * 20_000,
                     [{"role": "user", "content": [{"type": "text", "text": "word " * 4000}]}]
                     * 40):
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={"messages": messages})
        assert_error(r, 400, "context length")
        assert r.json()["error"]["param"] == "messages"
    assert time.monotonic() - start < 20  # tokenizing them would take far longer
    assert_serving(url)


# ---------------------------------------------------------------------- request limits

def test_n_limit(url):
    r = httpx.post(url + "/generate", timeout=60,
                   json={"text": "hi", "sampling_params": {"n": 5, "max_new_tokens": 1}})
    assert_error(r, 400, "--max-n-per-request")
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    with pytest.raises(openai.BadRequestError, match="--max-n-per-request"):
        client.completions.create(model="m", prompt="hi", n=5, max_tokens=1)
    ok = client.completions.create(model="m", prompt="hi", n=4, max_tokens=1)
    assert len(ok.choices) == 4


def test_batch_and_stop_limits(url):
    r = httpx.post(url + "/generate", json={"text": ["a"] * 9}, timeout=60)
    assert_error(r, 400, "--max-prompts-per-request")
    r = httpx.post(url + "/generate", json={"input_ids": [[1, 2]] * 9}, timeout=60)
    assert_error(r, 400, "--max-prompts-per-request")
    r = httpx.post(url + "/v1/completions", json={"prompt": ["a"] * 9}, timeout=60)
    assert_error(r, 400, "--max-prompts-per-request")
    r = httpx.post(url + "/generate", timeout=60,
                   json={"text": "a", "sampling_params": {"stop": list("abcde")}})
    assert_error(r, 400, "--max-stop-strings")
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "a"}], "stop": list("abcde")})
    assert_error(r, 400, "--max-stop-strings")
    assert_serving(url)


def test_two_output_constraints_are_rejected_on_v1(url):
    body = {"prompt": "Give JSON:", "max_tokens": 8, "regex": "[a-z]+",
            "response_format": {"type": "json_object"}}
    assert_error(httpx.post(url + "/v1/completions", json=body, timeout=60), 400, "regex")
    body = {"prompt": "x", "regex": "a+", "ebnf": 'root ::= "a"', "max_tokens": 2}
    assert_error(httpx.post(url + "/v1/completions", json=body, timeout=60), 400, "ebnf")
    # response_format alone now applies to completions too (it used to be ignored there)
    body = {"prompt": "A JSON object:", "max_tokens": 6, "temperature": 0,
            "response_format": {"type": "json_object"}}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"].lstrip().startswith("{")


# ---------------------------------------------------------------------- max_new_tokens rule

def test_max_new_tokens_beyond_the_context_is_refused_on_both_apis(url):
    """As SGLang (and OpenAI): a budget the request names past what the context leaves is a
    400 (--allow-auto-truncate clamps it); an unnamed one (the default) is clamped."""
    prompt = [1] * (CONTEXT - 3)
    r = httpx.post(url + "/generate", timeout=120, json={
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 10 ** 12,
                                                 "ignore_eos": True}})
    assert_error(r, 400, "Requested token count exceeds the model's maximum context length")
    r = httpx.post(url + "/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": 10 ** 9, "ignore_eos": True})
    assert_error(r, 400, "Requested token count exceeds")
    assert r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 10 ** 9})
    assert_error(r, 400, "Requested token count exceeds")
    assert r.json()["error"]["param"] == "max_completion_tokens"
    # Exactly what is left is fine; the default budget (128) is clamped to it
    r = httpx.post(url + "/generate", timeout=120, json={
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3, r.text
    r = httpx.post(url + "/generate", timeout=120, json={
        "input_ids": prompt, "sampling_params": {"ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    # A prompt that leaves no room at all is still an error on both.
    r = httpx.post(url + "/generate", json={"input_ids": [1] * CONTEXT}, timeout=60)
    assert_error(r, 400, "context")
    r = httpx.post(url + "/v1/completions", json={"prompt": [1] * CONTEXT}, timeout=60)
    assert_error(r, 400, "context")


# ---------------------------------------------------------------------- SGLang's info endpoints

def test_model_info_and_server_info_under_both_names(url):
    a, b = (httpx.get(url + p, timeout=30).json() for p in ("/model_info", "/get_model_info"))
    assert a == b
    assert a["model_path"] and a["tokenizer_path"] and a["is_generation"] is True
    assert a["served_model_name"] == "SmolLM2-135M-Instruct"
    httpx.post(url + "/generate", timeout=60, json={
        "text": "Count: 1, 2,", "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}})
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(url + path, timeout=30).json()
        assert info["model_path"] == a["model_path"]  # what is served, never null
        states = info["internal_states"]
        assert isinstance(states, list) and len(states) == 1
        state = states[0]
        assert state["avg_spec_accept_length"] == 1.0
        assert state["last_gen_throughput"] > 0
        usage = state["memory_usage"]
        assert usage["weight"] > 0 and usage["kvcache"] > 0
        assert usage["token_capacity"] == info["max_total_num_tokens"]
