"""The expressions a program appends to its state (`s += ...`).

A program is ordinary Python; what it appends is one of a handful of expression objects:
text, a generation, a selection among choices, and the begin / end of a chat role. `+` between
expressions (or an expression and a str) builds a list, so that `"A:" + gen("x")` reads like
string concatenation while still being executed in order by the state's executor.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.lang.choices import ChoicesMethod


@dataclass
class SamplingArgs:
    """Generation settings of one gen; `None` means "the program's default" (see `merged`).

    Field names follow the native /generate `sampling_params` where a backend needs them, so
    `to_native()` is a plain filter; the lang-level spelling (`max_tokens`) is mapped in `gen()`.
    """
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None             # samples: the variable holds a list, the text the first
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    sampling_seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    # Logprob requests travel beside sampling_params in the native API.
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None

    LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num",
                      "return_text_in_logprobs")

    def merged(self, defaults: "SamplingArgs") -> "SamplingArgs":
        """Self's settings, with the unset ones taken from `defaults`."""
        return SamplingArgs(**{f.name: v if (v := getattr(self, f.name)) is not None
                               else getattr(defaults, f.name)
                               for f in dataclasses.fields(self)})

    def to_native(self) -> dict[str, Any]:
        """The `sampling_params` dict of a native /generate request (unset fields left out)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in self.LOGPROB_FIELDS and getattr(self, f.name) is not None}
        for name in ("stop", "stop_regex"):
            if isinstance(out.get(name), str):
                out[name] = [out[name]]
        return out

    def logprob_fields(self) -> dict[str, Any]:
        return {k: v for k in self.LOGPROB_FIELDS if (v := getattr(self, k)) is not None}

    @staticmethod
    def schema_text(schema: str | dict | None) -> str | None:
        return json.dumps(schema) if isinstance(schema, dict) else schema


class Expr:
    """Base of everything that can be appended to a program state."""

    def __add__(self, other: Any) -> "ExprList":
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> "ExprList":
        return ExprList([to_expr(other), self])

    def defined_vars(self) -> list[str]:
        """Variable names this expression sets when it runs (so reads can wait for them)."""
        return []


@dataclass(eq=False)
class Text(Expr):
    text: str


@dataclass(eq=False)
class Gen(Expr):
    name: str | None
    sampling: SamplingArgs
    dtype: type | None = None        # int / float / bool / str: the text constrained to one

    def defined_vars(self) -> list[str]:
        return [self.name] if self.name else []


@dataclass(eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float
    method: ChoicesMethod

    def defined_vars(self) -> list[str]:
        return [self.name] if self.name else []


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    """Sets variable `name` to the text appended since the matching VarScopeBegin."""
    name: str

    def defined_vars(self) -> list[str]:
        return [self.name]


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """After the gens `names` ran: each variable keeps the answer, and `<name>_reasoning_content`
    gets the thinking block a reasoning model wrote before it (model_type: a --reasoning-parser
    name). The program's text keeps both."""
    names: list[str]
    model_type: str

    def defined_vars(self) -> list[str]:
        return [f"{n}_reasoning_content" for n in self.names]


@dataclass(eq=False)
class ExprList(Expr):
    items: list[Expr] = field(default_factory=list)

    def __post_init__(self) -> None:
        flat: list[Expr] = []  # keep lists flat so that execution is a simple loop
        for item in self.items:
            flat.extend(item.items if isinstance(item, ExprList) else [item])
        self.items = flat

    def defined_vars(self) -> list[str]:
        return [n for item in self.items for n in item.defined_vars()]


def to_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Text(str(value))  # `s += 3` is a common slip; appending "3" is what was meant
    raise TypeError(f"cannot append a {type(value).__name__} to a program state; append a str, "
                    f"gen(...), select(...) or a role")
