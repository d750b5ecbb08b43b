"""`@function` programs and how they run: `run` (one, optionally streaming) and `run_batch`."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import inspect
import logging
from typing import Any, Callable, Iterator

from radixlm.lang.backends.base import Backend
from radixlm.lang.default_backend import resolve_backend
from radixlm.lang.errors import BackendError
from radixlm.lang.executor import StreamExecutor
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import SamplingArgs
from radixlm.lang.prefix import _Reached, common_prefix, prompt_before_first_call
from radixlm.lang.state import ProgramState

logger = logging.getLogger(__name__)

# Programs traced to find a batch's shared prefix: enough to see what is common, cheap to run.
_TRACE_SAMPLE = 16


def _defaults(max_new_tokens: int = 128, stop: str | list[str] | None = None,
              stop_token_ids: list[int] | None = None, temperature: float = 1.0,
              top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
              frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
              ignore_eos: bool = False, return_logprob: bool = False,
              logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
              return_text_in_logprobs: bool | None = None) -> SamplingArgs:
    """The program-wide generation settings (SGLang's defaults); each gen may override them."""
    return SamplingArgs(max_new_tokens=max_new_tokens, stop=stop, stop_token_ids=stop_token_ids,
                        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                        ignore_eos=ignore_eos, return_logprob=return_logprob or None,
                        logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                        return_text_in_logprobs=return_text_in_logprobs)


_DEFAULT_NAMES = tuple(inspect.signature(_defaults).parameters)


class Program:
    """A function `f(s, *args)` turned into a program by `@function`."""

    def __init__(self, func: Callable[..., Any], num_api_spec_tokens: int | None = None,
                 bind_arguments: dict[str, Any] | None = None):
        self.func = func
        if num_api_spec_tokens is not None and (not isinstance(num_api_spec_tokens, int)
                                                or num_api_spec_tokens < 1):
            raise ValueError(f"num_api_spec_tokens must be a positive integer, got "
                             f"{num_api_spec_tokens!r}")
        self.num_api_spec_tokens = num_api_spec_tokens  # API speculation (speculative.py)
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = list(inspect.signature(func).parameters)[1:]
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> "Program":
        return Program(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Called with a state: a sub-program appending to the caller's state.
        if args and isinstance(args[0], ProgramState):
            return self.func(*args, **{**self.bind_arguments, **kwargs})
        return self.run(*args, **kwargs)

    # ------------------------------------------------------------------ one program

    def run(self, *args: Any, stream: bool = False, backend: Any = None,
            use_thread: bool = True, **kwargs: Any) -> ProgramState:
        """Run the program. Without stream, returns when it has finished and raises its first
        error; with stream=True, returns at once (read with `state.text_iter()`).
        Keyword arguments named like `_defaults`' parameters set generation defaults."""
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in _DEFAULT_NAMES}
        state = self._start(resolve_backend(backend), _defaults(**sampling), stream)
        if stream:
            import threading
            thread = threading.Thread(target=self._execute, args=(state, args, kwargs, False),
                                      name="radixlm-lang-program", daemon=True)
            state._ex.program_thread = thread
            thread.start()
            return state
        self._execute(state, args, kwargs, True)
        return state

    def _start(self, backend: Backend, defaults: SamplingArgs, stream: bool) -> ProgramState:
        return ProgramState(StreamExecutor(backend, defaults, stream, self.num_api_spec_tokens))

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any],
                 raise_errors: bool, raise_program_errors: bool = False) -> None:
        """Run the program function on `state`. raise_errors: raise any error (run());
        raise_program_errors: raise only those of the program's own code, not the backend
        errors the state records (run_batch, as SGLang)."""
        ex = state._ex
        try:
            state.ret_value = self.func(state, *args, **{**self.bind_arguments, **kwargs})
        except BaseException as e:
            backend_error = _is_backend_error(ex, e)
            ex.fail(e)
            if not isinstance(e, _Reached) and (
                    raise_errors or (raise_program_errors and not backend_error)):
                raise
        finally:
            ex.close()
        ex.sync(raise_error=raise_errors)

    # ------------------------------------------------------------------ many programs

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: bool = False, warmup: bool | None = None,
                  **sampling: Any) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per argument dict, `num_threads` at a time. Returns the states
        in input order. A backend error (server down, rejected request, ...) stops only its
        program: its state's `error()` holds it and the batch goes on. An exception of the
        program's own code is raised from run_batch, as in SGLang: once every program has run
        (the first failed one in input order; with generator_style, when its turn comes).
        With warmup (default: `global_config.enable_precache_with_tracing`, True), the prompt
        prefix all programs share is cached once first."""
        unknown = set(sampling) - set(_DEFAULT_NAMES)
        if unknown:
            raise TypeError(f"run_batch() got unexpected keyword arguments {sorted(unknown)}")
        for i, kw in enumerate(batch_kwargs):
            if not isinstance(kw, dict):
                raise TypeError(f"batch_kwargs[{i}] must be a dict of the program's arguments")
        real = resolve_backend(backend)
        defaults = _defaults(**sampling)
        if num_threads == "auto":
            num_threads = max(1, min(len(batch_kwargs), 64))
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be 'auto' or a positive integer, got "
                             f"{num_threads!r}")
        if warmup is None:
            warmup = global_config.enable_precache_with_tracing
        if warmup and len(batch_kwargs) > 1:
            self._warm_shared_prefix(batch_kwargs, real, defaults)
        it = self._run_many(batch_kwargs, real, defaults, num_threads, progress_bar)
        return it if generator_style else list(it)

    def _run_one(self, kwargs: dict[str, Any], backend: Backend,
                 defaults: SamplingArgs) -> ProgramState:
        state = self._start(backend, defaults, stream=False)
        self._execute(state, (), kwargs, raise_errors=False, raise_program_errors=True)
        if state._ex.error is not None:
            logger.warning("a program of the batch failed: %s", state._ex.error)
        return state

    def _run_many(self, batch: list[dict[str, Any]], backend: Backend, defaults: SamplingArgs,
                  num_threads: int, progress_bar: bool) -> Iterator[ProgramState]:
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(batch), desc=getattr(self.func, "__name__", "programs"),
                       unit="prog")
        with cf.ThreadPoolExecutor(num_threads, thread_name_prefix="radixlm-batch") as pool:
            futures = [pool.submit(self._run_one, kw, backend, defaults) for kw in batch]
            if bar is not None:
                for fut in futures:
                    fut.add_done_callback(lambda _: bar.update(1))
            try:
                for fut in futures:
                    yield fut.result()
            finally:
                if bar is not None:
                    bar.close()

    def _warm_shared_prefix(self, batch: list[dict[str, Any]], backend: Backend,
                            defaults: SamplingArgs) -> None:
        def traced(kwargs: dict[str, Any]) -> Callable[[Backend], StreamExecutor]:
            def run_on(tracer: Backend) -> StreamExecutor:
                state = self._start(tracer, defaults, stream=False)
                self._execute(state, (), kwargs, raise_errors=False)
                return state._ex
            return run_on

        try:
            prompts = [prompt_before_first_call(traced(kw), backend)
                       for kw in batch[:_TRACE_SAMPLE]]
        except Exception as e:  # tracing is an optimisation; never fail the batch for it
            logger.debug("could not trace the batch's shared prefix: %s", e)
            return
        prefix = common_prefix(prompts)
        if prefix.strip():
            backend.cache_prefix(prefix)


def _is_backend_error(ex: StreamExecutor, e: BaseException) -> bool:
    """Whether the program function raised a backend's error rather than one of its own code:
    the error the state or one of its forks met running an expression (re-raised by a read
    such as s["x"] or by join()), or one a backend call made from the program's thread raised
    (fork's prefix commit)."""
    if isinstance(e, BackendError):
        return True
    pending = [ex]
    while pending:
        node = pending.pop()
        if node.error is e:   # (set by its worker: fail() has not recorded e yet)
            return True
        pending.extend(node.children)
    return False
