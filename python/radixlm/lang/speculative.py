"""API speculative execution: fewer calls to endpoints that bill per call.

With `@function(num_api_spec_tokens=N)`, a program such as

    s += context + "Name:" + gen("name", stop="\\n") + "\\nJob:" + gen("job", stop="\\n")

sends its first gen as one call that ignores the gen's stop and generates up to
max(N, max_tokens) tokens. The gen takes the text up to its first stop string; the rest is kept.
Text the program appends next ("\\nJob:") is matched against the kept text and consumed; the
next gen, if the kept text still holds a stop of its own, takes its value from there without a
call. Any mismatch drops the kept text, and the next gen makes a normal call, so a program
whose template the model does not follow still gets every variable, at the usual cost.

A value is taken from kept text only when it is exactly what a separate call would have
returned (for greedy decoding, where the continuation does not depend on how the call was
split): its stop string is in the text, or the speculative call ended by itself (end of
sequence) with no stop string in it; and it is provably within the gen's own max_tokens (it
has no more bytes than that, and every token is at least one byte), unless the speculative call
had that very limit. Gens with constraints (regex, json_schema, dtype), logprob requests or
min_tokens, and gens whose settings differ from the speculative call's, always make their own
call. Streaming programs do not speculate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from radixlm.lang.backends.base import Backend, GenResult, PromptContext
from radixlm.lang.ir import SamplingArgs

# Settings that may differ between the speculative call and the gens that share it.
_PER_GEN_FIELDS = ("stop", "max_new_tokens")


def _settings_key(args: SamplingArgs) -> tuple:
    """Everything but stop and max tokens: gens sharing one call must agree on the rest."""
    return tuple(getattr(args, f.name) for f in dataclasses.fields(args)
                 if f.name not in _PER_GEN_FIELDS)


def _stops(args: SamplingArgs) -> list[str]:
    if args.stop is None:
        return []
    return [args.stop] if isinstance(args.stop, str) else [s for s in args.stop if s]


def _eligible(args: SamplingArgs) -> bool:
    # (a stop_regex is matched by the server: such a gen makes its own call)
    return (args.regex is None and args.json_schema is None and not args.stop_regex
            and not args.return_logprob
            and not args.min_new_tokens and args.max_new_tokens is not None
            and args.max_new_tokens > 0)


@dataclass
class _Kept:
    """Generated text the program has not used yet, and what produced it."""
    text: str
    key: tuple                       # the settings of the call (see _settings_key)
    ended_by_model: bool             # the call stopped by itself, not at its token limit
    limit: int                       # the call's max tokens
    fresh: bool                      # nothing taken from it yet
    meta: dict[str, Any]


class ApiSpeculator:
    """The kept text of one program state (forks start without any). Used by the state's
    executor from its worker thread only, so it needs no lock."""

    def __init__(self, num_tokens: int):
        if not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_api_spec_tokens must be a positive integer, got "
                             f"{num_tokens!r}")
        self.num_tokens = num_tokens
        self._kept: _Kept | None = None
        self.calls_saved = 0          # gens answered from kept text (for tests and logging)
        self._too_long = False        # the last _take failed only for want of a size proof

    def reset(self) -> None:
        self._kept = None

    def on_append(self, text: str) -> None:
        """The program appended `text`: consume it from the kept text, or drop the kept text."""
        kept = self._kept
        if kept is None or not text:
            return
        if kept.text.startswith(text):
            kept.text = kept.text[len(text):]
            kept.fresh = False
        else:
            self._kept = None

    def generate(self, backend: Backend, ctx: PromptContext, args: SamplingArgs) -> GenResult:
        """The gen's value: from kept text when it settles it, else from a (speculative) call."""
        if not _eligible(args):
            self._kept = None
            return backend.generate(ctx, args)
        if self._kept is not None and self._kept.key == _settings_key(args):
            taken = self._take(args)
            if taken is not None:
                self.calls_saved += 1
                return taken
            if self._too_long:
                # The kept text answers the gen but cannot be proven to fit its max_tokens: a
                # new speculative call would most likely write the same and fail the same
                # proof. Ask normally, once.
                self._kept = None
                return backend.generate(ctx, args)
        limit = max(args.max_new_tokens, self.num_tokens)
        res = backend.generate(ctx, dataclasses.replace(args, stop=None, max_new_tokens=limit))
        reason = (res.meta_info.get("finish_reason") or {}).get("type")
        self._kept = _Kept(res.text, _settings_key(args), ended_by_model=reason != "length",
                           limit=limit, fresh=True, meta=res.meta_info)
        taken = self._take(args)
        if taken is not None:
            return taken
        # The speculative text does not settle this gen (no stop in it, and it was cut at a
        # limit above the gen's own): ask again, normally.
        self._kept = None
        return backend.generate(ctx, args)

    def _take(self, args: SamplingArgs) -> GenResult | None:
        kept = self._kept
        assert kept is not None
        self._too_long = False
        if not kept.text:
            return None
        cuts = [(pos, stop) for stop in _stops(args) if (pos := kept.text.find(stop)) >= 0]
        if cuts:
            pos, matched = min(cuts)
            reason: dict[str, Any] = {"type": "stop", "matched": matched}
        elif kept.ended_by_model or (kept.fresh and kept.limit == args.max_new_tokens):
            pos, matched = len(kept.text), None
            reason = dict(kept.meta.get("finish_reason") or {"type": "stop"})
        else:
            return None
        value = kept.text[:pos]
        same_call = kept.fresh and kept.limit == args.max_new_tokens
        self._too_long = not same_call and len(value.encode()) > args.max_new_tokens
        if self._too_long:
            return None  # might be longer than the gen's max_tokens: cannot tell without tokens
        # The stop string stays kept: the program's next text usually starts with it.
        kept.text = kept.text[pos:]
        if kept.fresh:   # this gen's own call, which ran on past its stop
            meta = {**kept.meta, "finish_reason": reason, "speculative_call": True}
        else:            # answered by an earlier gen's call: no call of its own
            meta = {"id": kept.meta.get("id"), "finish_reason": reason, "speculative": True}
        kept.fresh = False
        return GenResult(value, meta)


# ---------------------------------------------------------------------- chat endpoints
# A chat call cannot continue a partly written assistant message, so under speculation the
# message `assistant("Name:" + gen("name", stop="\n") + "\nJob:" + gen("job", stop="\n"))` is
# collected whole, sent as one call when the role ends (the model writes the whole message,
# typically following a format shown earlier in the conversation), and the reply is parsed
# against the collected template: literal text must match, each gen takes the text up to its
# stop (the last one may take the rest).

def chat_call_args(gens_args: list[SamplingArgs], num_tokens: int) -> SamplingArgs:
    """The one call's settings: the first gen's, without stop, long enough for every gen."""
    for args in gens_args:
        if args.regex is not None or args.json_schema is not None:
            from radixlm.lang.errors import UnsupportedByBackendError
            raise UnsupportedByBackendError(
                "a constrained gen (regex, json_schema, dtype) cannot be part of an assistant "
                "message written by API speculative execution on a chat endpoint")
    first = gens_args[0]
    return dataclasses.replace(first, stop=None, max_new_tokens=max(first.max_new_tokens or 0,
                                                                    num_tokens))


def match_chat_template(reply: str, items: list[str | SamplingArgs]) -> list[str] | None:
    """The gens' values if `reply` follows the template (str: literal text; SamplingArgs: a
    gen with those settings), else None."""
    values: list[str] = []
    rest = reply
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not rest.startswith(item):
                return None
            rest = rest[len(item):]
            continue
        cuts = [pos for stop in _stops(item) if (pos := rest.find(stop)) >= 0]
        if cuts:
            values.append(rest[:min(cuts)])
            rest = rest[min(cuts):]
        elif all(isinstance(later, str) and not later.strip() for later in items[i + 1:]):
            values.append(rest)          # the last gen (only whitespace after it): the rest
            rest = ""
        else:
            return None
    return values
