"""ProgramState (the `s` of a program) and ProgramStateGroup (what `s.fork(n)` returns)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Iterator

from radixlm.lang.executor import StreamExecutor
from radixlm.lang.ir import (Expr, ExprList, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd,
                             to_expr)


class ProgramState:
    """The state of one running program: its text, chat messages and variables.

    `s += x` queues x (returns at once); reads (`s["name"]`, `s.text()`, ...) wait for what they
    need and raise the first error the state met (backend down, rejected request, ...).
    """

    def __init__(self, executor: StreamExecutor):
        self._ex = executor
        self.ret_value: Any = None          # what the program function returned

    # ------------------------------------------------------------------ building

    def __iadd__(self, other: Any) -> "ProgramState":
        self._ex.submit(to_expr(other))
        return self

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> "ProgramStateGroup":
        """`size` copies of this state that continue independently (and in parallel). The
        shared text is committed to the backend's prefix cache first, once."""
        forks = [ProgramState(ex) for ex in self._ex.fork(size)]
        return ProgramStateGroup(forks, self)

    # Roles as methods, as in SGLang: `s.user("hi")` appends a user message; without an
    # argument it is a block: `with s.user(): s += "hi"`.
    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Any) -> Any:
        if expr is not None:
            self += ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)])
            return None
        return self._role_block(role)

    @contextlib.contextmanager
    def _role_block(self, role: str) -> Iterator[None]:
        self += RoleBegin(role)
        yield
        self += RoleEnd(role)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """`with s.var_scope("x"): s += ...`: variable x is the text appended inside the block."""
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    @contextlib.contextmanager
    def copy(self) -> Iterator["ProgramState"]:
        """`with s.copy() as c: ...`: a single fork, joined (variables gathered) at the end."""
        forks = self.fork(1)
        try:
            yield forks[0]
        finally:
            forks.join()

    # ------------------------------------------------------------------ reading

    def __getitem__(self, name: str) -> Any:
        return self._ex.get_var(name)

    def get_var(self, name: str) -> Any:
        return self._ex.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._ex.set_var(name, value)

    def set_var(self, name: str, value: Any) -> None:
        self._ex.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self._ex.sync()
        return name in self._ex.variables

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """The backend's meta_info of gen `name` (token counts, finish reason, logprobs when
        asked); for a select, the per-choice scores too."""
        return self._ex.get_meta_info(name)

    def text(self) -> str:
        self._ex.sync()
        return self._ex.text

    def messages(self) -> list[dict[str, str]]:
        self._ex.sync()
        return [dict(m) for m in self._ex.messages]

    def variables(self) -> dict[str, Any]:
        self._ex.sync()
        return dict(self._ex.variables)

    def sync(self) -> None:
        self._ex.sync()

    def error(self) -> BaseException | None:
        """The error that stopped this state, if any (waits for queued work first)."""
        self._ex.sync(raise_error=False)
        return self._ex.error

    # ------------------------------------------------------------------ streaming

    def text_iter(self, var_name: str | None = None,
                  return_meta_data: bool = False) -> Iterator[Any]:
        """Text pieces as they are produced (run with stream=True to get generations token by
        token); with `var_name`, only that variable's pieces, and with `return_meta_data`
        as (piece, meta_info) pairs: the gen's meta_info as of that piece (token counts,
        logprobs so far when asked; {} until the backend sends any). As in SGLang,
        return_meta_data applies to a streamed run's variable pieces only (otherwise, text)."""
        return self._ex.text_iter(var_name, return_meta_data)

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """text_iter for asyncio (SGLang's `async for x in state.text_async_iter(...)`)."""
        it = self._ex.text_iter(var_name, return_meta_data)
        end = object()
        while (piece := await asyncio.to_thread(next, it, end)) is not end:
            yield piece

    def __repr__(self) -> str:  # never raises: repr is used by debuggers and error messages
        self._ex.sync(raise_error=False)
        error = f", error={self._ex.error!r}" if self._ex.error is not None else ""
        return f"ProgramState({self._ex.text!r}{error})"


class ProgramStateGroup:
    """The forks of a state, as `s.fork(n)` returns them.

    - `forks += x` appends x to every fork (they run in parallel); x may also be a list with one
      item per fork, or a function `i -> item` (SGLang's `forks += lambda i: ...`);
    - `forks[i] += x` appends to fork i (Python calls `__setitem__` after the `+=`, with the same
      state back, which is all `__setitem__` accepts);
    - `forks.join()` waits for every fork and gathers their variables onto the parent.
    """

    def __init__(self, states: list[ProgramState], src: ProgramState):
        self.states = states
        self.src = src

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: Any) -> None:
        # `forks[i] += x` is `tmp = forks[i]; tmp += x; forks[i] = tmp`: the state comes back.
        if value is not self.states[i]:
            raise TypeError("the forks of a state cannot be replaced: `forks[i] += x` appends "
                            "to fork i; assigning anything else to forks[i] is not supported")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        if callable(other) and not isinstance(other, Expr):
            items = [other(i) for i in range(len(self.states))]
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"`forks += [...]` needs one item per fork: got {len(other)} "
                                 f"items for {len(self.states)} forks")
            items = list(other)
        else:
            items = [other] * len(self.states)
        exprs = [to_expr(item) for item in items]  # convert all first: a bad item appends none
        for state, expr in zip(self.states, exprs):
            state += expr
        return self

    def __repr__(self) -> str:
        return f"ProgramStateGroup({len(self.states)} forks)"

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every fork. Then, by mode:
        - "gather_variable" (SGLang's rule): each variable that forks set and the parent does
          not have becomes a list on the parent, of the values of the forks that set it, in
          fork order (`s["judgement"] == [fork0's, fork1's, ...]`; a fork that did not set it
          adds nothing), and `s.get_meta_info("judgement")` the list of their meta_info. A
          variable the parent already has keeps its value, even where forks set it again;
        - "concate_and_append": each fork's new text is appended to the parent, in order.
        The forks stay readable afterwards (`forks[i]["judgement"]`).
        """
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"unknown join mode {mode!r}; use 'gather_variable' or "
                             f"'concate_and_append'")
        for state in self.states:
            state.sync()
        executors = [state._ex for state in self.states]
        if mode == "gather_variable":
            self._gather_variables(executors)
        else:
            for ex in executors:
                self.src += ex.text[ex.fork_point:]

    def _gather_variables(self, executors: list[StreamExecutor]) -> None:
        # The parent's variables as of the join (what it queued before the join has run).
        self.src._ex.sync(raise_error=False)
        base = set(self.src._ex.variables)
        names: list[str] = []
        for ex in executors:
            names += [n for n in ex.variables if n not in base and n not in names]
        for name in names:
            setters = [ex for ex in executors if name in ex.variables]
            # Each fork's meta_info too, so that get_meta_info(name) shows every branch.
            self.src._ex.set_var(name, [ex.variables[name] for ex in setters],
                                 meta=[ex.meta_info.get(name, {}) for ex in setters])
