"""The functions a program is written with: `function`, `gen`, `select`, roles, backends."""

from __future__ import annotations

from typing import Any, Callable

from radixlm.lang.choices import ChoicesMethod, resolve
from radixlm.lang.default_backend import resolve_backend
# (SGLang's api module has these too: scripts import them from it)
from radixlm.lang.default_backend import get_default_backend, set_default_backend  # noqa: F401
from radixlm.lang.errors import UnsupportedByBackendError
from radixlm.lang.ir import (Expr, ExprList, Gen, RoleBegin, RoleEnd, SamplingArgs, Select,
                             SeparateReasoning, to_expr)
from radixlm.lang.program import Program

_DTYPES = (None, int, float, str, bool)
_DTYPE_NAMES = {"int": int, "float": float, "str": str, "bool": bool}   # SGLang takes these too


def function(func: Callable[..., Any] | None = None, *, num_api_spec_tokens: int | None = None,
             bind_arguments: dict[str, Any] | None = None) -> Any:
    """`@function` or `@function(...)`: turn `f(s, ...)` into a Program."""
    def wrap(f: Callable[..., Any]) -> Program:
        return Program(f, num_api_spec_tokens, bind_arguments)
    return wrap(func) if func is not None else wrap


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        n: int | None = None, stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None, stop_regex: str | list[str] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, repetition_penalty: float | None = None,
        ignore_eos: bool | None = None, seed: int | None = None,
        return_logprob: bool | None = None, logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None, return_text_in_logprobs: bool | None = None,
        dtype: type | str | None = None, choices: list[str] | None = None,
        choices_method: ChoicesMethod | str | None = None, regex: str | None = None,
        json_schema: str | dict | None = None) -> Expr:
    """Generate text into variable `name`. Unset settings take the run's defaults.
    dtype=int / float / bool / str (or "int", "float", "bool", "str") constrains the text to a
    number, True / False, or a double-quoted string; the variable holds the text, as in
    SGLang (int(s["n"]) converts it);
    choices=[...] is select(name, choices) (temperature 0 unless given);
    n > 1 draws n samples in one request: the variable holds the list of them, and the
    program's text goes on with the first."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"gen n must be an integer >= 1, got {n!r}")
    if choices is not None:
        if n not in (None, 1):
            raise ValueError("gen takes n or choices, not both (select picks one choice)")
        return select(name, choices, temperature=temperature or 0.0,
                      choices_method=choices_method)
    if isinstance(dtype, str):
        dtype = _DTYPE_NAMES.get(dtype, dtype)
    if dtype not in _DTYPES:
        raise ValueError(f"gen dtype must be int, float, bool or str, got {dtype!r}")
    if regex is not None and json_schema is not None:
        raise ValueError("gen takes at most one of regex and json_schema")
    args = SamplingArgs(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop,
        stop_token_ids=stop_token_ids, stop_regex=stop_regex, temperature=temperature,
        top_p=top_p, top_k=top_k,
        min_p=min_p, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty, ignore_eos=ignore_eos, sampling_seed=seed,
        regex=regex, json_schema=SamplingArgs.schema_text(json_schema),
        return_logprob=return_logprob, logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs)
    return Gen(name, args, dtype)


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: ChoicesMethod | str | None = None) -> Expr:
    """Append the most likely of `choices` (scored by the backend from prompt logprobs) and
    store it in variable `name`. choices_method: token_length_normalized (default: highest
    mean token logprob) or greedy_token_selection."""
    if not choices or not isinstance(choices, (list, tuple)) or \
            not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select needs choices: a non-empty list of non-empty strings")
    return Select(name, list(choices), float(temperature), resolve(choices_method))


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Expr:
    """`separate_reasoning(gen("answer"), model_type="deepseek-r1")`: once the gen ran, the
    variable holds the answer and `answer_reasoning_content` the thinking before it
    (model_type: a --reasoning-parser name: deepseek-r1 or qwen3)."""
    from radixlm.parsers.reasoning import REASONING_PARSERS   # (stdlib only)
    if model_type not in REASONING_PARSERS:
        raise ValueError(f"separate_reasoning model_type must be one of "
                         f"{sorted(REASONING_PARSERS)}, got {model_type!r}")
    inner = to_expr(expr) if expr is not None else ExprList([])
    names = inner.defined_vars()
    if not names:
        raise ValueError("separate_reasoning needs a named gen to split, e.g. "
                         "separate_reasoning(gen(\"answer\"), model_type=\"deepseek-r1\")")
    return ExprList([inner, SeparateReasoning(names, model_type)])


def image(expr: Any = None) -> Expr:
    """SGLang's image input: radixlm serves text-only models, so a program that uses one
    fails here, clearly, rather than running without the image."""
    raise UnsupportedByBackendError("image() needs a vision-language model; radixlm serves "
                                    "text-only models")


def video(path: Any = None, num_frames: int = -1) -> Expr:
    raise UnsupportedByBackendError("video() needs a vision-language model; radixlm serves "
                                    "text-only models")


# ---------------------------------------------------------------------- roles

def _role(role: str, expr: Any) -> Expr:
    body = [] if expr is None else [to_expr(expr)]
    return ExprList([RoleBegin(role), *body, RoleEnd(role)])


def system(expr: Any = None) -> Expr:
    return _role("system", expr)


def user(expr: Any = None) -> Expr:
    return _role("user", expr)


def assistant(expr: Any = None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


# ---------------------------------------------------------------------- backends

def flush_cache(backend: Any = None, empty_cache: bool = True) -> Any:
    """Drop the prefix cache of `backend` (default: the default backend), as SGLang's: False
    when there is no backend at all. empty_cache is sent on to a server that takes it
    (SGLang's /flush_cache; radixlm's ignores it)."""
    if backend is None and get_default_backend() is None:
        return False
    return resolve_backend(backend).flush_cache(empty_cache=empty_cache)


def get_server_info(backend: Any = None) -> dict[str, Any] | None:
    """The server's settings and state; None when there is no backend at all (SGLang's)."""
    if backend is None and get_default_backend() is None:
        return None
    return resolve_backend(backend).get_server_info()
