"""Engine: the whole serving engine in-process, for offline jobs and as the core of the server.

It owns the scheduler (today in a background thread; the server issue moves it into its own
process) and an asyncio loop thread running the TokenizerManager. `generate` is synchronous,
`async_generate` is a coroutine (or an async iterator when streaming) usable from any loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import traceback
from typing import Any, AsyncIterator, Iterator

from radixlm.config import ServerArgs
from radixlm.managers.io_struct import GenerateReqInput
from radixlm.managers.messages import SchedulerReady, SchedulerStats, ShutdownReq
from radixlm.managers.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

_STREAM_END = object()


class _SchedulerThread:
    """Runs ModelRunner + Scheduler on a thread, talking through two typed-message channels."""

    def __init__(self, args: ServerArgs, on_output):
        self.args = args
        self.inbox: queue.Queue = queue.Queue()
        self.on_output = on_output
        self.ready: "queue.Queue[SchedulerReady]" = queue.Queue(maxsize=1)
        self.scheduler = None
        self.thread = threading.Thread(target=self._main, name="radixlm-scheduler", daemon=True)
        self.thread.start()

    def send(self, msg: Any) -> None:
        self.inbox.put(msg)

    def _recv(self, timeout: float | None) -> list[Any]:
        msgs = []
        try:
            msgs.append(self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait())
            while True:
                msgs.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return msgs

    def _main(self) -> None:
        from radixlm.model_executor.model_runner import ModelRunner
        from radixlm.model_executor.weight_source import load_tokenizer
        from radixlm.scheduler.scheduler import Scheduler
        try:
            runner = ModelRunner(self.args)
            tokenizer = load_tokenizer(runner.tokenizer_path)
            self.scheduler = Scheduler(self.args, runner, self._recv, self.on_output, tokenizer)
            mc = runner.model_config
            self.ready.put(SchedulerReady(
                max_total_num_tokens=runner.max_total_num_tokens,
                max_running_requests=runner.max_running_requests, context_len=mc.context_len,
                vocab_size=mc.vocab_size, eos_token_ids=list(mc.eos_token_ids),
                device=str(runner.device), dtype=str(runner.dtype).removeprefix("torch."),
                model_path=runner.hf_dir, tokenizer_path=runner.tokenizer_path))
        except Exception as e:  # start-up failed: report it to the waiting constructor
            logger.error("scheduler start-up failed:\n%s", traceback.format_exc())
            self.ready.put(SchedulerReady(0, 0, 0, 0, [], "", "", "", "", error=f"{type(e).__name__}: {e}"))
            return
        try:
            self.scheduler.run_forever()
        except Exception as e:
            logger.error("scheduler crashed:\n%s", traceback.format_exc())
            self.on_output(_SchedulerDied(f"{type(e).__name__}: {e}"))


class _SchedulerDied:
    def __init__(self, reason: str):
        self.reason = reason


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any):
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        logging.basicConfig(level=self.server_args.log_level.upper(),
                            format="[%(asctime)s] %(name)s: %(message)s")
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever,
                                             name="radixlm-tokenizer", daemon=True)
        self._loop_thread.start()
        self._sched = _SchedulerThread(self.server_args, self._on_scheduler_output)
        ready = self._sched.ready.get()
        if ready.error is not None:
            self._stop_loop()
            raise RuntimeError(f"engine failed to start: {ready.error}")
        self.ready = ready
        from radixlm.model_executor.weight_source import load_tokenizer
        self.tokenizer = load_tokenizer(ready.tokenizer_path)
        self.tokenizer_manager = TokenizerManager(self.tokenizer, ready, self._sched.send)
        self._closed = False

    # ------------------------------------------------------------------ plumbing

    def _on_scheduler_output(self, msg: Any) -> None:
        """Called on the scheduler thread: hop onto the tokenizer loop."""
        if isinstance(msg, _SchedulerDied):
            self.loop.call_soon_threadsafe(self.tokenizer_manager.mark_dead, msg.reason)
        else:
            self.loop.call_soon_threadsafe(self.tokenizer_manager.handle_output, msg)

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # ------------------------------------------------------------------ generation

    @staticmethod
    def _request(prompt, sampling_params, input_ids, stream, kwargs) -> GenerateReqInput:
        return GenerateReqInput(text=prompt, input_ids=input_ids, sampling_params=sampling_params,
                                stream=stream, **kwargs)

    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, stream: bool = False,
                 **kwargs: Any) -> dict | list[dict] | Iterator[dict]:
        """SGLang-shaped results: a dict per sequence (`text`, `output_ids`, `meta_info`), a
        list for a batch or n > 1; with stream=True an iterator of incremental dicts."""
        obj = self._request(prompt, sampling_params, input_ids, stream, kwargs)
        if stream:
            return self._sync_stream(obj)
        return self._run(self._collect(obj))

    async def _collect(self, obj: GenerateReqInput):
        result = None
        async for result in self.tokenizer_manager.generate(obj):
            pass
        return result

    def _sync_stream(self, obj: GenerateReqInput) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()

        async def pump():
            try:
                async for item in self.tokenizer_manager.generate(obj):
                    q.put(item)
            except BaseException as e:  # hand errors to the consuming thread
                q.put(e)
            finally:
                q.put(_STREAM_END)

        fut = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        try:
            while (item := q.get()) is not _STREAM_END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            fut.cancel()  # the consumer stopped early: the generator's cleanup aborts the request

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: dict | list[dict] | None = None,
                             input_ids: list[int] | list[list[int]] | None = None,
                             stream: bool = False, **kwargs: Any):
        obj = self._request(prompt, sampling_params, input_ids, stream, kwargs)
        if stream:
            return self._async_stream(obj)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._collect(obj), self.loop))

    async def _async_stream(self, obj: GenerateReqInput) -> AsyncIterator[dict]:
        caller = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        async def pump():
            try:
                async for item in self.tokenizer_manager.generate(obj):
                    caller.call_soon_threadsafe(q.put_nowait, item)
            except BaseException as e:
                caller.call_soon_threadsafe(q.put_nowait, e)
            finally:
                caller.call_soon_threadsafe(q.put_nowait, _STREAM_END)

        fut = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        try:
            while (item := await q.get()) is not _STREAM_END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            fut.cancel()

    # ------------------------------------------------------------------ control

    def abort_request(self, rid: str) -> None:
        self.loop.call_soon_threadsafe(self.tokenizer_manager.abort, rid)

    def flush_cache(self) -> bool:
        return self._run(self.tokenizer_manager.flush_cache()).success

    def get_stats(self) -> SchedulerStats:
        return self._run(self.tokenizer_manager.get_stats())

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    @property
    def scheduler(self):
        """The live Scheduler object (in-process only; tests use it to check invariants)."""
        return self._sched.scheduler

    def shutdown(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._sched.send(ShutdownReq())
        self._sched.thread.join(timeout=30)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # best effort; explicit shutdown() is the contract
        try:
            self.shutdown()
        except Exception:
            pass
