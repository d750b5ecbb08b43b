"""StreamExecutor: runs one program state's expressions, in order, on a worker thread.

`s += expr` only queues `expr`; a worker thread (started when the queue fills, gone when it
drains) executes the queue in order. So the program's own thread runs ahead until it reads
something (`s["x"]`, `s.text()`), and the forks of a state, each with its own executor, run
their generations at the same time even when the program appends to them one by one in a loop.

The first error stops the state: later expressions are skipped, and every read raises it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, deque
from typing import Any, Iterator

from radixlm.lang.backends.base import Backend, PromptContext
from radixlm.lang.chat import ChatRenderer
from radixlm.lang.errors import LangError, VariableNotFoundError
from radixlm.lang.ir import (Expr, ExprList, Gen, RoleBegin, RoleEnd, SamplingArgs, Select,
                             SeparateReasoning, Text, VarScopeBegin, VarScopeEnd)
from radixlm.lang.errors import UnsupportedByBackendError
from radixlm.lang.speculative import ApiSpeculator, chat_call_args, match_chat_template

# Regexes that make a gen's text parse as the requested type (str: a double-quoted string
# with JSON's escapes, quotes included, as SGLang's gen_string keeps them).
DTYPE_REGEX: dict[type, str] = {int: r"-?[0-9]+", float: r"-?[0-9]+(\.[0-9]+)?",
                                 bool: r"(True|False)", str: r'"([^"\\\x00-\x1f]|\\.)*"'}


class StreamExecutor:
    def __init__(self, backend: Backend, defaults: SamplingArgs, stream: bool = False,
                 num_api_spec_tokens: int | None = None):
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.num_api_spec_tokens = num_api_spec_tokens
        # API speculative execution (see speculative.py); streaming programs do not speculate.
        self._spec = ApiSpeculator(num_api_spec_tokens) \
            if num_api_spec_tokens is not None and not stream else None
        self._scopes: dict[str, int] = {}        # var_scope name -> where its text starts
        # Under speculation on a chat endpoint: the assistant message being collected (text
        # and gens), sent as one call at its end (see speculative.py).
        self._chat_items: list[Text | Gen] | None = None
        self.text = ""
        self.messages: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, dict[str, Any]] = {}
        self.fork_point = 0                      # len(text) when this state was forked off
        self.error: BaseException | None = None
        self.children: list[StreamExecutor] = []
        self._role: str | None = None            # the role being written
        self._role_begin = ""                    # what its begin rendered to
        self._role_start = 0                     # where its content starts in text
        self._renderer: ChatRenderer | None = None
        self._cond = threading.Condition()
        self._queue: deque[Expr] = deque()
        self._busy = False                       # a worker is draining the queue
        self._pending_vars: Counter[str] = Counter()
        self._closed = False                     # the program will append nothing more
        # run(stream=True): the thread running the program function. A read from any other
        # thread waits for the program to get that far (the program may not have queued the
        # gen yet), not just for what is queued.
        self.program_thread: threading.Thread | None = None
        self._chunks: list[tuple[str | None, str]] = []   # (variable or None, text): text_iter
        # Each variable's latest meta_info while it is produced (text_iter's pairs read it
        # when they yield, as SGLang's: one per variable, since a streamed gen's meta_info
        # carries its logprobs so far and one kept per piece would grow with the square)
        self._latest_meta: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ the program's side

    def submit(self, expr: Expr) -> None:
        with self._cond:
            self._queue.append(expr)
            self._pending_vars.update(expr.defined_vars())
            self._cond.notify_all()     # (a reader outside the program may wait for it)
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._drain, name="radixlm-lang-state",
                                 daemon=True).start()

    def _outside_running_program(self) -> bool:
        """A read from outside a program that is still running (stream=True)."""
        return (not self._closed and self.program_thread is not None
                and threading.current_thread() is not self.program_thread)

    def sync(self, raise_error: bool = True) -> None:
        """Wait until everything queued so far has run (from outside a running program:
        until it has returned and its queue drained); raise the state's error, if any."""
        with self._cond:
            if self._outside_running_program():
                self._cond.wait_for(lambda: self._finished() or self.error is not None)
            self._cond.wait_for(lambda: not self._busy)
            if raise_error and self.error is not None:
                raise self.error

    def get_var(self, name: str) -> Any:
        with self._cond:
            if self._outside_running_program():   # until the program defines it, or ends
                self._cond.wait_for(lambda: name in self._pending_vars or name in self.variables
                                    or self._closed or self.error is not None)
            # Wait only for the expressions that define `name`, not for the whole queue.
            self._cond.wait_for(lambda: self._pending_vars[name] == 0 or self.error is not None)
            if self._pending_vars[name] == 0 and name in self.variables:
                return self.variables[name]
            if self.error is not None:
                raise self.error
            raise VariableNotFoundError(name, list(self.variables))

    def get_meta_info(self, name: str) -> dict[str, Any]:
        self.get_var(name)
        return self.meta_info.get(name, {})

    def set_var(self, name: str, value: Any, meta: Any = None) -> None:
        with self._cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The program itself raised: readers (text_iter) see the error."""
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()

    def close(self) -> None:
        """The program returned: streams end once the queue drains. Forks close with it."""
        with self._cond:
            self._closed = True
            children = list(self.children)
            self._cond.notify_all()
        for child in children:
            child.close()

    def fork(self, n: int) -> list["StreamExecutor"]:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork size must be a positive integer, got {n!r}")
        self.sync()
        if n > 1 and self.text:
            # Commit the shared prefix to the cache once, so the n branches start from it
            # instead of each computing it (they would, arriving together in one batch).
            self.backend.cache_prefix(self.text)
        forks = [self._copy() for _ in range(n)]
        with self._cond:
            self.children.extend(forks)
        return forks

    def _copy(self) -> "StreamExecutor":
        child = StreamExecutor(self.backend, self.defaults, self.stream, self.num_api_spec_tokens)
        child.text, child.fork_point = self.text, len(self.text)
        child.messages = [dict(m) for m in self.messages]
        child.variables, child.meta_info = dict(self.variables), dict(self.meta_info)
        child._role, child._role_begin, child._role_start = \
            self._role, self._role_begin, self._role_start
        child._renderer = self._renderer
        child.program_thread = self.program_thread
        return child

    def text_iter(self, var_name: str | None = None,
                  return_meta_data: bool = False) -> Iterator[Any]:
        """Text as it is appended (only `var_name`'s when given), until the program ends.
        With `var_name` and `return_meta_data` on a streamed run: (text, meta_info) pairs,
        meta_info being the gen's latest when the piece is yielded (SGLang's
        text_async_iter; {} where the backend has sent none)."""
        # (as SGLang: pairs for a streamed run only; a non-streamed one gives the text)
        pairs = return_meta_data and var_name is not None and self.stream
        seen = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: len(self._chunks) > seen or self._finished()
                                    or self.error is not None)
                new, seen = self._chunks[seen:], len(self._chunks)
                done, error = self._finished(), self.error
                meta = self._latest_meta.get(var_name or "", {}) if pairs else {}
            for var, piece in new:
                if piece and (var_name is None or var == var_name):
                    yield (piece, meta) if pairs else piece
            if error is not None:
                raise error
            if done:
                return

    def _finished(self) -> bool:
        return self._closed and not self._busy

    # ------------------------------------------------------------------ the worker's side

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._busy = False
                    self._cond.notify_all()
                    return
                expr = self._queue.popleft()
            try:
                if self.error is None:
                    self._execute(expr)
            except BaseException as e:  # kept for the program's next read
                with self._cond:
                    if self.error is None:
                        self.error = e
            finally:
                with self._cond:
                    self._pending_vars.subtract(expr.defined_vars())
                    self._cond.notify_all()

    def _execute(self, expr: Expr) -> None:
        if self._chat_items is not None and isinstance(expr, (Text, Gen, Select,
                                                             SeparateReasoning)):
            if not isinstance(expr, (Text, Gen)):
                raise UnsupportedByBackendError(
                    f"{type(expr).__name__.lower()}() cannot be part of an assistant message "
                    f"written by API speculative execution on a chat endpoint")
            self._chat_items.append(expr)
        elif isinstance(expr, ExprList):
            for item in expr.items:
                self._execute(item)
        elif isinstance(expr, Text):
            self._append(expr.text)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, SeparateReasoning):
            self._separate_reasoning(expr)
        elif isinstance(expr, RoleBegin):
            self._role_begin_(expr.role)
        elif isinstance(expr, RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, VarScopeBegin):
            self._scopes[expr.name] = len(self.text)
        elif isinstance(expr, VarScopeEnd):
            if expr.name not in self._scopes:
                raise LangError(f"var_scope({expr.name!r}) ends without having begun")
            self._set_result(expr.name, self.text[self._scopes.pop(expr.name):], {})
        else:
            raise TypeError(f"unknown expression {expr!r}")

    def _append(self, text: str, var: str | None = None, speculated: bool = False,
                meta: dict[str, Any] | None = None) -> None:
        # Text from the kept speculative text was consumed when it was taken; anything else
        # must match what is kept, or the kept text is dropped.
        if self._spec is not None and not speculated:
            self._spec.on_append(text)
        with self._cond:
            self.text += text
            self._chunks.append((var, text))
            if var and meta is not None:
                self._latest_meta[var] = meta
            self._cond.notify_all()

    def _context(self) -> PromptContext:
        return PromptContext(self.text, list(self.messages), self._role,
                             self.text[self._role_start:] if self._role else "")

    def _set_result(self, name: str | None, value: Any, meta: dict[str, Any]) -> None:
        if name:
            with self._cond:
                self.variables[name] = value
                self.meta_info[name] = meta

    def _gen(self, expr: Gen) -> None:
        args = expr.sampling.merged(self.defaults)
        if expr.dtype in DTYPE_REGEX and args.regex is None and args.json_schema is None:
            args = dataclasses.replace(args, regex=DTYPE_REGEX[expr.dtype])
        ctx = self._context()
        if (args.n or 1) > 1:
            # n samples in one request, not streamed (a stream follows one text): the text
            # goes on with the first, the variable holds them all.
            if self._spec is not None:
                self._spec.reset()
            res = self.backend.generate(ctx, args)
            self._append(res.text, expr.name, meta=res.meta_info)
            self._set_result(expr.name, res.samples, res.sample_meta)  # type: ignore[arg-type]
            return
        if self.stream:
            parts: list[str] = []
            meta: dict[str, Any] = {}
            for chunk in self.backend.generate_stream(ctx, args):
                parts.append(chunk.delta)
                meta = chunk.meta_info or meta
                self._append(chunk.delta, expr.name, meta=meta)
            text = "".join(parts)
        elif self._spec is not None and self.backend.api_speculation(ctx) == "completion":
            res = self._spec.generate(self.backend, ctx, args)
            text, meta = res.text, res.meta_info
            self._append(text, expr.name, speculated=True, meta=meta)
        else:
            if self._spec is not None:
                self._spec.reset()
            res = self.backend.generate(ctx, args)
            text, meta = res.text, res.meta_info
            self._append(text, expr.name, meta=meta)
        self._set_result(expr.name, text, meta)

    def _separate_reasoning(self, expr: SeparateReasoning) -> None:
        from radixlm.parsers.reasoning import get_reasoning_parser   # (stdlib only)
        parser = get_reasoning_parser(expr.model_type)
        for name in expr.names:
            with self._cond:
                value = self.variables.get(name)
            texts = value if isinstance(value, list) else [value]
            if not all(isinstance(t, str) for t in texts):
                raise LangError(f"separate_reasoning: variable {name!r} holds no text")
            parts = [parser.split(t, parser.starts_in_reasoning, final=True) for t in texts]
            answer = [p.content for p in parts]
            reasoning = [p.reasoning for p in parts]
            many = isinstance(value, list)
            with self._cond:
                self.variables[name] = answer if many else answer[0]
            self._set_result(f"{name}_reasoning_content", reasoning if many else reasoning[0],
                             self.meta_info.get(name) or {})

    def _select(self, expr: Select) -> None:
        res = self.backend.select(self._context(), expr.choices, expr.method, expr.temperature)
        meta = {**res.meta_info, "scores": res.scores, "index": res.index}
        self._append(res.choice, expr.name, meta=meta)
        self._set_result(expr.name, res.choice, meta)

    def _renderer_(self) -> ChatRenderer:
        if self._renderer is None:
            self._renderer = self.backend.chat_renderer()
        return self._renderer

    def _role_begin_(self, role: str) -> None:
        if self._role is not None:
            raise LangError(f"{role}() begins inside {self._role}(); end {self._role} first "
                            f"(roles do not nest)")
        begin = self._renderer_().begin(self.messages, role)
        self._append(begin)
        self._role, self._role_begin, self._role_start = role, begin, len(self.text)
        if role == "assistant" and self._spec is not None and \
                self.backend.api_speculation(self._context()) == "chat":
            self._chat_items = []

    def _write_chat_message(self) -> None:
        """Speculation on a chat endpoint: one call writes the collected assistant message,
        and its reply is parsed into the message's gens."""
        items, self._chat_items = self._chat_items or [], None
        gens = [item for item in items if isinstance(item, Gen)]
        args = [gen.sampling.merged(self.defaults) for gen in gens]
        if not gens or items == gens[:1] or any((a.n or 1) > 1 for a in args):
            # No gen, a message that is one gen, or one that draws several samples (one
            # reply cannot hold them): nothing to merge, run it as written.
            for item in items:
                self._execute(item)
            return
        template = [item.text if isinstance(item, Text) else a
                    for item, a in zip(items, _gen_args_in_order(items, args))]
        assert self._spec is not None
        res = self.backend.generate(self._context(),
                                    chat_call_args(args, self._spec.num_tokens))
        values = match_chat_template(res.text, template)
        if values is None:
            raise LangError(
                f"API speculative execution: the assistant's reply does not follow the "
                f"message's template, so its gens ({', '.join(repr(g.name) for g in gens)}) "
                f"cannot be read from it; show the format in an earlier turn, or drop "
                f"num_api_spec_tokens. Template: {_describe(items)}; reply: {res.text!r}")
        values_iter = iter(values)
        for item in items:
            if isinstance(item, Text):
                self._append(item.text)
                continue
            value = next(values_iter)
            meta = {**res.meta_info, "speculative_call": True}
            self._append(value, item.name, meta=meta)
            self._set_result(item.name, value, meta)

    def _role_end(self, role: str) -> None:
        if self._chat_items is not None and role == self._role:
            self._write_chat_message()
        if self._role != role:
            raise LangError(f"{role}_end() without a matching {role}_begin()"
                            + (f" (the open role is {self._role})" if self._role else ""))
        content = self.text[self._role_start:]
        self._append(self._renderer_().end(self.messages, role, self._role_begin, content))
        self.messages.append({"role": role, "content": content})
        self._role = None


def _gen_args_in_order(items: list[Text | Gen], args: list[SamplingArgs]) -> list[Any]:
    """`args` (one per gen) spread over `items`, None at the texts."""
    it = iter(args)
    return [next(it) if isinstance(item, Gen) else None for item in items]


def _describe(items: list[Text | Gen]) -> str:
    return " + ".join(repr(item.text) if isinstance(item, Text) else f"gen({item.name!r})"
                      for item in items)
