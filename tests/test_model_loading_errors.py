"""A model directory, a tokenizer or a config override that cannot work: refused at start-up
with one line naming the flag (a ValueError "--flag: ..."; the CLI prints it and exits 2), never
served with weights silently cut to fit, nor an override silently dropped."""

from __future__ import annotations

import json
import types

import pytest

from helpers import tiny_checkpoint


def _runner(path: str, **kw):
    from radixlm.model_executor.model_runner import create_runner_and_kv
    from radixlm.model_executor.runner_config import RunnerConfig
    return create_runner_and_kv(RunnerConfig(**{"model_path": path, "device": "cpu",
                                                "max_total_tokens": 256, **kw}))


def _edit_config(path: str, **fields) -> None:
    with open(f"{path}/config.json") as f:
        config = json.load(f)
    config.update(fields)
    with open(f"{path}/config.json", "w") as f:
        json.dump(config, f)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


@pytest.mark.parametrize("override,tensor", [
    ({"intermediate_size": 64}, r"mlp\."),         # checkpoint rows beyond the config's
    ({"num_key_value_heads": 1}, "qkv_proj"),
    ({"vocab_size": 1000}, "(embed_tokens|lm_head)"),
])
def test_weights_larger_than_the_config_are_refused(llama, override, tensor):
    with pytest.raises(ValueError, match=rf"^--model-path: the checkpoint does not fit .*"
                                         rf"{tensor}.*the model's config asks for"):
        _runner(llama, json_model_override_args=json.dumps(override))


def test_layers_the_config_does_not_have_are_refused(llama):
    with pytest.raises(ValueError, match=r"^--model-path: .*'layers\.1\..*' has no matching"):
        _runner(llama, json_model_override_args='{"num_hidden_layers": 1}')


def test_a_config_json_that_cannot_be_read_names_the_flag(tmp_path):
    from radixlm.model_executor.weight_source import load_hf_config
    for text in ('{"architectures": ["LlamaForCausalLM"], "hidden_size": ', "[]"):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match=r"^--model-path: .*config\.json cannot be read"):
            load_hf_config(str(tmp_path))


def test_override_errors_name_the_override_flag(llama):
    with pytest.raises(ValueError, match=r"^--json-model-override-args: .*'abc'"):
        _runner(llama, json_model_override_args='{"max_position_embeddings": "abc"}')
    with pytest.raises(ValueError, match=r"^--json-model-override-args: .*rope_theta must be"):
        _runner(llama, json_model_override_args='{"rope_theta": -5}')


def test_a_rope_theta_override_reaches_rope_parameters():
    """transformers v5 configs hold rope_theta in rope_parameters too, where it is read."""
    from radixlm.model_executor.model_runner import apply_model_overrides
    config = types.SimpleNamespace(rope_theta=1e4,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    apply_model_overrides(config, {"rope_theta": 10.0})
    assert config.rope_theta == 10.0 and config.rope_parameters["rope_theta"] == 10.0
    apply_model_overrides(config, {"rope_parameters": {"rope_type": "default",
                                                       "rope_theta": 7.0}})
    assert config.rope_parameters["rope_theta"] == 7.0
    # rope_scaling (the older name, which SGLang users pass to stretch the context) too
    apply_model_overrides(config, {"rope_scaling": {"type": "linear", "factor": 8.0}})
    assert config.rope_parameters == {"rope_type": "linear", "factor": 8.0, "rope_theta": 7.0}
    apply_model_overrides(config, {"rope_scaling": None})
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 7.0}
    with pytest.raises(ValueError, match="rope_scaling must be an object"):
        apply_model_overrides(config, {"rope_scaling": 8})


def test_sizes_must_be_positive_integers(llama):
    for bad in ('{"hidden_size": "big"}', '{"num_attention_heads": 0}'):
        with pytest.raises(ValueError, match=r"^--json-model-override-args: .*must be a "
                                             r"positive integer"):
            _runner(llama, json_model_override_args=bad)


def test_a_path_that_holds_no_tokenizer_names_the_flag(tmp_path, smollm_dir):
    from radixlm.model_executor.weight_source import load_tokenizer
    with pytest.raises(ValueError, match=r"^--tokenizer-path: no tokenizer could be loaded"):
        load_tokenizer(f"{smollm_dir}/tokenizer.json")
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match=r"^--model-path: no tokenizer .*--skip-tokenizer-init"):
        load_tokenizer(str(tmp_path), flag="model-path")


def test_a_kv_pool_too_large_for_memory_names_the_flag(llama):
    with pytest.raises(ValueError, match=r"^--max-total-tokens 100000000000000: a KV pool"):
        _runner(llama, max_total_tokens=10 ** 14)


def test_seeds_beyond_64_bits_are_refused():
    from radixlm.config import ServerArgs
    with pytest.raises(ValueError, match="--random-seed: must fit in 64 bits"):
        ServerArgs(random_seed=10 ** 20)
    assert ServerArgs(random_seed=2 ** 64 - 1).random_seed == 2 ** 64 - 1
