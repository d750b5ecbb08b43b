"""ProgramState (the `s` of a program) and ProgramStateGroup (what `s.fork(n)` returns)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterator

from radixlm.lang.executor import StreamExecutor
from radixlm.lang.ir import to_expr


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

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text pieces as they are produced (run with stream=True to get generations token by
        token); with `var_name`, only that variable's pieces."""
        return self._ex.text_iter(var_name)

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        it = self._ex.text_iter(var_name)
        end = object()
        while (piece := await asyncio.to_thread(next, it, end)) is not end:
            yield piece

    def __repr__(self) -> str:  # never raises: repr is used by debuggers and error messages
        self._ex.sync(raise_error=False)
        error = f", error={self._ex.error!r}" if self._ex.error is not None else ""
        return f"ProgramState({self._ex.text!r}{error})"


class ProgramStateGroup:
    """The forks of a state. `forks += x` appends x to every fork (they run in parallel)."""

    def __init__(self, states: list[ProgramState], src: ProgramState):
        self.states = states
        self.src = src

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        for state in self.states:
            state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every fork. Then, by mode:
        - "gather_variable": each variable a fork set becomes a list on the parent state
          (`s["judgement"] == [fork0's, fork1's, ...]`, None where a fork did not set it);
        - "concate_and_append": each fork's new text is appended to the parent, in order.
        """
        for state in self.states:
            state.sync()
        executors = [state._ex for state in self.states]
        if mode == "gather_variable":
            base = self.src._ex.variables
            names: list[str] = []
            for ex in executors:
                names += [n for n, v in ex.variables.items()
                          if n not in names and (n not in base or base[n] is not v)]
            for name in names:
                self.src._ex.set_var(name, [ex.variables.get(name) for ex in executors])
        elif mode == "concate_and_append":
            for ex in executors:
                self.src += ex.text[ex.fork_point:]
        else:
            raise ValueError(f"unknown join mode {mode!r}; use 'gather_variable' or "
                             f"'concate_and_append'")
