"""Sampling parameters of one request, in SGLang's native `sampling_params` shape.

Validation lives here so that the offline Engine and the HTTP server reject bad input with the
same message (a ValueError naming the field; the server turns it into HTTP 400).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from radixlm.sampling.stop_regex import stop_regex_error

# top_k = -1 means "no top-k filtering" (SGLang's convention); we normalise it to the vocab size
# lazily in the sampler, so the stored value keeps the user's meaning.
TOP_K_ALL = -1
# Temperatures below this are greedy (dividing by them would overflow float32).
SAMPLING_EPS = 1e-6


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    # (dataclasses.fields costs ~0.1 ms a call: 25 ms for a batch of 256 prompts)
    return frozenset(f.name for f in dataclasses.fields(cls))


# SGLang sampling_params keys that this server does not implement: a request that sets one is
# refused rather than served as if the key were not there (a field that is accepted must work).
UNSUPPORTED_KEYS = ("custom_params",)
# The output constraints (structured outputs), at most one a request; each a string (JSON text
# for json_schema and structural_tag).
CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
# `seed` is this server's alias of `sampling_seed`.
ALIASES = {"seed": "sampling_seed"}


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    # Regular expressions that stop the request like stop strings (sampling/stop_regex.py)
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    # Structured outputs (filled by the structured-output issue); at most one may be set.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    # SGLang's structural tag, JSON: {"type": "structural_tag", "structures": [{"begin", "schema",
    # "end"}], "triggers": [...]} (free text; a trigger starts a structure held to its schema)
    # or xgrammar's {"type": "structural_tag", "format": {...}}
    structural_tag: str | None = None
    # A stream's chunk every this many tokens (None: the server's --stream-interval); the
    # first token and the end are sent at once. Changes no output, only how it is chunked.
    stream_interval: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Build from a request dict; `None` means default. A key that is not a sampling
        parameter is an error naming it, as in SGLang (whose SamplingParams takes the dict as
        keyword arguments), so a typo (`temprature`) or another API's name (`max_tokens`) is not
        silently served with the default."""
        d = dict(d or {})
        known = _field_names(cls)
        unknown = [k for k in d if k not in known and k not in ALIASES]
        for k in unknown:
            if k in UNSUPPORTED_KEYS:
                if d[k] not in (None, "", [], {}):
                    raise ValueError(f"sampling_params.{k} is not supported by this server")
            else:
                hint = " (the native API's name is max_new_tokens)" if k == "max_tokens" else ""
                raise ValueError(f"sampling_params: unknown key {k!r}{hint}")
        kwargs = {k: v for k, v in d.items() if k in known and v is not None}
        for alias, name in ALIASES.items():    # the field's own name wins over its alias
            if d.get(alias) is not None and name not in kwargs:
                kwargs[name] = d[alias]
        for name in ("stop", "stop_regex"):
            if isinstance(kwargs.get(name), str):
                kwargs[name] = [kwargs[name]]
        if "stop_token_ids" in kwargs:
            if not isinstance(kwargs["stop_token_ids"], (list, tuple)):
                raise ValueError("stop_token_ids must be a list of token ids")
            kwargs["stop_token_ids"] = list(kwargs["stop_token_ids"])
        if isinstance(kwargs.get("json_schema"), dict):  # accept the schema itself, too
            kwargs["json_schema"] = json.dumps(kwargs["json_schema"])
        if "logit_bias" in kwargs:
            try:
                kwargs["logit_bias"] = {int(k): _bias_value(v)
                                        for k, v in dict(kwargs["logit_bias"]).items()}
            except (TypeError, ValueError) as e:
                raise ValueError(f"logit_bias must map token ids to numbers: {e}") from None
        try:
            params = cls(**kwargs)
        except TypeError as e:  # pragma: no cover - defensive, kwargs are filtered above
            raise ValueError(str(e)) from None
        return params

    @property
    def has_penalties(self) -> bool:
        """Repetition, frequency or presence penalty: logits that depend on the output."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    def check_token_ids(self, vocab_size: int | None) -> None:
        """The token ids the request names (stop_token_ids, logit_bias) exist in the vocabulary:
        the part of validation that needs the model, done once the model is known."""
        error = _token_ids_error(self, vocab_size)
        if error is not None:
            raise ValueError(error)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the offending field (token ids against the vocabulary too,
        when its size is given)."""
        _check_type("max_new_tokens", self.max_new_tokens, int)
        _check_type("min_new_tokens", self.min_new_tokens, int)
        _check_type("top_k", self.top_k, int)
        _check_type("n", self.n, int)
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            _check_type(name, getattr(self, name), (int, float))
            _check_finite(name, getattr(self, name))
        if self.stream_interval is not None:
            _check_type("stream_interval", self.stream_interval, int)
            if self.stream_interval < 1:
                raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                             f"({self.max_new_tokens})")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < TOP_K_ALL:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not (0.0 < self.repetition_penalty <= 2.0):
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError("stop must be a string or a list of strings")
        if any(s == "" for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if not isinstance(self.stop_regex, list):
            raise ValueError("stop_regex must be a string or a list of strings")
        for i, pattern in enumerate(self.stop_regex):
            error = stop_regex_error(pattern)
            if error is not None:
                raise ValueError(f"stop_regex[{i}] {error}")
        if self.sampling_seed is not None:
            _check_type("sampling_seed", self.sampling_seed, int)
            if not -2 ** 63 <= self.sampling_seed < 2 ** 64:   # (the noise hashes 64 bits)
                raise ValueError(f"sampling_seed must fit in 64 bits, got {self.sampling_seed}")
        self.check_token_ids(vocab_size)
        for tid, bias in self.logit_bias.items():
            _check_finite(f"logit_bias[{tid}]", bias)
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        for name in CONSTRAINT_KINDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {type(value).__name__}")
        constraints = [n for n in CONSTRAINT_KINDS if getattr(self, n) is not None]
        if len(constraints) > 1:
            raise ValueError(f"only one of {', '.join(CONSTRAINT_KINDS)} may be set, got "
                             f"{constraints}")


def _token_ids_error(params: "SamplingParams", vocab_size: int | None) -> str | None:
    for tid in params.stop_token_ids:
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0 or (
                vocab_size is not None and tid >= vocab_size):
            return f"stop_token_ids contains an unknown token id: {tid!r}"
    for tid in params.logit_bias:
        if tid < 0 or (vocab_size is not None and tid >= vocab_size):
            return f"logit_bias names an unknown token id: {tid}"
    return None


def _check_finite(name: str, value: float) -> None:
    # NaN passes every range check (all comparisons are false) and would sample garbage.
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


def _bias_value(value: Any) -> float:
    """A logit_bias value: a number (not a bool, nor a string holding one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _check_type(name: str, value: Any, types: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        kind = "an integer" if types is int else "a number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
