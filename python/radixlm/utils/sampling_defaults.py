"""Server-wide sampling defaults, beneath what a request sets:

- `--preferred-sampling-params '{"temperature": 0.3}'`: a JSON object of sampling_params that
  every request (native and /v1) takes for the fields it leaves out.
- `--sampling-defaults model` (the default, as in SGLang): /v1 requests that leave out
  temperature, top_p, top_k, min_p or repetition_penalty take the value the model's
  generation_config.json recommends (Qwen3: temperature 0.6, top_p 0.95, top_k 20), if it
  gives one; `openai` keeps the API's neutral defaults (temperature 1, no cut-offs).

A request's own value wins over both; a model default wins over a preferred one on /v1.
Stdlib only: the config module checks the flags before anything heavy is imported.
"""

from __future__ import annotations

import json
import os
from typing import Any

from radixlm.utils.json_flag import parse_json_object

SAMPLING_DEFAULTS = ("model", "openai")
# generation_config.json keys that are sampling parameters, under the same names.
MODEL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def parse_preferred(text: str | None) -> dict[str, Any]:
    """--preferred-sampling-params as a dict. Raises ValueError naming what is wrong (the
    caller checks the values themselves as a request's sampling_params)."""
    return parse_json_object(text, "sampling parameters")


def model_sampling_defaults(model_dir: str, mode: str) -> dict[str, Any]:
    """The sampling parameters the model's generation_config.json recommends (mode "model"),
    or none (mode "openai", or no such file). A value of the wrong type is left out."""
    if mode != "model":
        return {}
    try:
        with open(os.path.join(model_dir, "generation_config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    out: dict[str, Any] = {}
    for key in MODEL_SAMPLING_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(value) if key == "top_k" else float(value)
    return out
