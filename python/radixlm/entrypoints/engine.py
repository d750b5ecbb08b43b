"""Engine: the serving engine behind one Python object, for offline jobs and as the core of
the HTTP server.

It owns two child processes (the scheduler with the model, and the detokenizer; managed in
engine_children.py) and, in this process, an asyncio loop thread running the TokenizerManager
plus a receiver thread for the detokenizer's outputs. `generate` is synchronous;
`async_generate` is a coroutine (or an async iterator when streaming) usable from any event
loop. Children exit with the parent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator

from radixlm.config import ServerArgs
from radixlm.managers import ipc
from radixlm.managers.generate_request import SGLANG_ONLY_FIELDS, GenerateReqInput
from radixlm.managers.messages import (AbortReq, ProfileReq, ProfileResult, SchedulerStats,
                                       UpdateWeightsReq)
from radixlm.managers.tokenizer_manager import (EngineDeadError, RequestRefusedError,
                                                TokenizerManager)
from radixlm.model_executor.weight_source import (load_tokenizer, resolve_model_dir,
                                                  resolve_tokenizer_dir, set_trust_remote_code)
from radixlm.entrypoints.engine_children import EngineChildren
from radixlm.entrypoints.scoring import SCORE_SAMPLING, ScoringInputError, ScoringRequest
from radixlm.entrypoints.server_info import server_info
from radixlm.utils.chat_templates import load_chat_template
from radixlm.managers.no_tokenizer import no_tokenizer_error
from radixlm.utils.sampling_defaults import model_sampling_defaults, parse_preferred
from radixlm.utils.phases import PhaseTimer

logger = logging.getLogger(__name__)

_STREAM_END = object()


class Engine:
    def __init__(self, model_path: str | None = None, server_args: ServerArgs | None = None,
                 **kwargs: Any):
        """`Engine(model_path=..., **server_args)` or, as SGLang's, `Engine(server_args=...)`.
        It logs errors only unless log_level says otherwise (as SGLang's Engine; `radixlm
        serve` logs at info)."""
        started = time.perf_counter()
        if server_args is not None:
            if model_path is not None or kwargs:
                raise TypeError("Engine takes server_args or settings as keywords, not both")
            self.server_args = server_args
        else:
            kwargs.setdefault("log_level", "error")
            self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        if self.server_args.dp_size != 1:
            raise ValueError(f"dp_size {self.server_args.dp_size}: the in-process Engine runs "
                             f"one engine; `radixlm serve --dp-size N` serves N behind the "
                             f"cache-aware router")
        logging.basicConfig(level=self.server_args.log_level.upper(),
                            format="[%(asctime)s] %(name)s: %(message)s")
        self._closed = True
        args = self.server_args
        # Resolve (and for a GGUF, convert) the model once here, so that the children start
        # in parallel from the same directory.
        # This process's share of the start-up, beside the scheduler's (/get_server_info):
        # its tokenizer (transformers) loads while the children start.
        phases = PhaseTimer()
        with phases.phase("resolve_model"):
            set_trust_remote_code(args.trust_remote_code)
            hf_dir, load_format = resolve_model_dir(args.model_path, args.load_format,
                                                    args.revision, args.download_dir)
            # (a Hub id is fetched here, so that a bad one fails before anything starts)
            tokenizer_path = hf_dir if args.tokenizer_path is None else \
                resolve_tokenizer_dir(args.tokenizer_path, args.download_dir)
        args = dataclasses.replace(args, model_path=hf_dir, load_format=load_format,
                                   tokenizer_path=args.tokenizer_path and tokenizer_path)
        with phases.phase("start_processes"):
            self._children = EngineChildren(args, tokenizer_path)
        with phases.phase("tokenizer"):
            try:
                self.tokenizer = None if args.skip_tokenizer_init else load_tokenizer(
                    tokenizer_path, args.tokenizer_mode,
                    "tokenizer-path" if args.tokenizer_path else "model-path")
            except BaseException:
                self._children.stop(timeout_s=5)
                raise
            if args.chat_template is not None:   # (checked when the args were made)
                self.tokenizer.chat_template = load_chat_template(args.chat_template)
        with phases.phase("wait_for_scheduler"):
            ready = self._children.wait_ready()
        self.startup_phases = phases.seconds
        if ready.error is not None:
            self._children.stop(timeout_s=5)
            if ready.flag_error:   # a flag the scheduler could only judge once the model loaded
                raise ValueError(ready.error)
            raise RuntimeError(f"engine failed to start: {ready.error}")
        self.ready = ready
        # From here to ready, and where the scheduler's share of it went (/get_server_info).
        self.startup_seconds = time.perf_counter() - started
        logger.info("engine ready in %.1f s (%s); scheduler: %s", self.startup_seconds,
                    ", ".join(f"{k} {v:.2f} s" for k, v in self.startup_phases.items()),
                    ", ".join(f"{k} {v:.2f} s" for k, v in ready.startup_phases.items()))
        # /v1's defaults for the sampling fields a request leaves out (--sampling-defaults)
        self.model_sampling_defaults = model_sampling_defaults(hf_dir, args.sampling_defaults)
        self.tokenizer_manager = TokenizerManager(
            self.tokenizer, ready, self._children.send,
            allow_auto_truncate=args.allow_auto_truncate, stream_interval=args.stream_interval,
            stream_output=args.stream_output,
            preferred_sampling_params=parse_preferred(args.preferred_sampling_params),
            log_requests=args.log_requests,
            weight_version=args.weight_version, max_queued_requests=args.max_queued_requests)
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever,
                                             name="radixlm-tokenizer", daemon=True)
        self._loop_thread.start()
        # Called (from the receiver thread) once a child process has died and the engine has
        # stopped, with why and whether it was stopped on request (SIGTERM): `radixlm serve`
        # then exits, as SGLang's server does.
        self.on_dead: Callable[[str, bool], None] | None = None
        self._receiver = threading.Thread(target=self._receive_outputs, name="radixlm-receiver",
                                          daemon=True)
        self._closed = False
        self._receiver.start()

    # ------------------------------------------------------------------ plumbing

    def _receive_outputs(self) -> None:
        """Receiver thread: detokenizer outputs -> the tokenizer manager's loop; also notices a
        child process that died, so that no caller waits forever."""
        children, tm = self._children, self.tokenizer_manager
        while not self._closed:
            msgs = ipc.recv_all(children.inbox, 0.2)
            if msgs:
                self.loop.call_soon_threadsafe(_deliver, tm, msgs)
            elif (reason := children.dead_child()) is not None:
                if not self._closed:
                    logger.error("engine stopped: %s", reason)
                    self.loop.call_soon_threadsafe(tm.mark_dead, reason)
                    # The others cannot go on without it (a rank would wait in a collective
                    # for ever): stop them too, and reap them.
                    asked = children.stopped_on_request()
                    children.kill()
                    children.reap()
                    if self.on_dead is not None:
                        self.on_dead(reason, asked)
                return

    def _run(self, coro) -> Any:
        self._check_open(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _check_open(self, coro=None) -> None:
        if self._closed:
            if coro is not None:
                coro.close()
            raise EngineDeadError("the engine was shut down")

    # ------------------------------------------------------------------ generation

    @staticmethod
    def _request(prompt, sampling_params, input_ids, stream, kwargs) -> GenerateReqInput:
        if not isinstance(stream, bool):   # (checked now: a stream's errors come when read)
            raise ValueError("`stream` must be true or false")
        known = set(GenerateReqInput.__dataclass_fields__) - {"extra"}
        unknown = sorted(set(kwargs) - known - set(SGLANG_ONLY_FIELDS))
        if unknown:                        # (a typo must not pass as an ignored field)
            raise TypeError(f"generate() got an unexpected keyword argument '{unknown[0]}'")
        # SGLang's other arguments are taken left unset (None / False) and refused when set,
        # as on /generate (GenerateReqInput.from_dict).
        return GenerateReqInput.from_dict({"text": prompt, "input_ids": input_ids,
                                           "sampling_params": sampling_params,
                                           "stream": stream, **kwargs})

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

        self._check_open()
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
        return await self.async_generate_request(
            self._request(prompt, sampling_params, input_ids, stream, kwargs))

    async def async_generate_request(self, obj: GenerateReqInput):
        """async_generate for a request already built (the HTTP server parses the body into
        one): the final result, or with obj.stream an async iterator of snapshots."""
        self._check_open()
        if obj.stream:
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

    # ------------------------------------------------------------------ scoring

    def score(self, query: str | list[int], items: str | list[str] | list[list[int]],
              label_token_ids: list[int], apply_softmax: bool = False,
              item_first: bool = False) -> list[list[float]]:
        """SGLang's Engine.score (scoring.py): per item, the probability of each label token
        coming next after query + item (item + query with item_first); with apply_softmax,
        renormalised over the labels."""
        req = ScoringRequest(query, items, label_token_ids, apply_softmax, item_first)
        return self._run(self._score(req, self.score_prompts(req)))

    def score_prompts(self, req: ScoringRequest,
                      stop: threading.Event | None = None) -> list[list[int]]:
        """The request checked and each item's prompt ids (in the caller's thread: tokenizing
        many items must not hold up the engine's loop); `stop` set: it ends early
        (ScoringCancelled)."""
        req.check(self.ready.vocab_size)
        if req.is_text and self.tokenizer is None:
            raise ScoringInputError("this server runs with --skip-tokenizer-init (no "
                                    "tokenizer): send query and items as token ids", "query")
        max_len = self.ready.context_len - 1
        if self.ready.max_prompt_tokens:
            max_len = min(max_len, self.ready.max_prompt_tokens)
        return req.prompts(self.tokenizer, max_len, stop)

    async def async_score(self, query: str | list[int],
                          items: str | list[str] | list[list[int]], label_token_ids: list[int],
                          apply_softmax: bool = False, item_first: bool = False
                          ) -> list[list[float]]:
        """score() from an event loop (SGLang's Engine.async_score)."""
        req = ScoringRequest(query, items, label_token_ids, apply_softmax, item_first)
        prompts = await asyncio.to_thread(self.score_prompts, req)
        return await self.score_request_async(req, prompts)

    async def score_request_async(self, req: ScoringRequest, prompts: list[list[int]]
                                  ) -> list[list[float]]:
        """Scores prompts from score_prompts(), from another event loop (the HTTP server's);
        cancelling it aborts the requests."""
        self._check_open()
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._score(req, prompts), self.loop))

    async def _score(self, req: ScoringRequest, prompts: list[list[int]]) -> list[list[float]]:
        obj = GenerateReqInput.from_dict({
            "input_ids": prompts, "sampling_params": dict(SCORE_SAMPLING),
            "return_logprob": True, "token_ids_logprob": list(req.label_token_ids)})
        results = await self._collect(obj)
        results = results if isinstance(results, list) else [results]
        for r in results:
            reason = r["meta_info"].get("finish_reason") or {}
            if reason.get("type") == "abort":
                raise RequestRefusedError(reason.get("message") or "the request was aborted",
                                          reason.get("status_code") or 500)
        return req.scores(results)

    # ------------------------------------------------------------------ control

    def abort_request(self, rid: str) -> None:
        self._check_open()
        self.loop.call_soon_threadsafe(self.tokenizer_manager.abort, rid)

    def flush_cache(self) -> bool:
        return self._run(self.tokenizer_manager.flush_cache()).success

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                 flush_cache: bool = True,
                                 weight_version: str | None = None) -> tuple[bool, str]:
        """Serve the weights of another checkpoint of the same architecture, in place, once
        the running requests finish: (success, message). On failure the served weights stay.
        `weight_version`: the new weights' label (/get_model_info)."""
        result = self._run(self.tokenizer_manager.update_weights_from_disk(
            UpdateWeightsReq(model_path, load_format, flush_cache), weight_version))
        return result.success, result.message

    def get_stats(self) -> SchedulerStats:
        return self._run(self.tokenizer_manager.get_stats())

    def get_server_info(self) -> dict[str, Any]:
        """SGLang's Engine.get_server_info: what the HTTP /get_server_info reports (the server
        arguments, the scheduler's figures, what is served)."""
        return server_info(self, self.get_stats())

    def start_profile(self, output_dir: str | None = None, num_steps: int | None = None,
                      activities: list[str] | None = None, with_stack: bool = False,
                      record_shapes: bool = False) -> None:
        """Run the torch profiler in the scheduler over the next steps (until stop_profile, or
        for num_steps steps); raises ValueError if it cannot."""
        self._profile(ProfileReq("start", output_dir, num_steps, activities, with_stack,
                                 record_shapes))

    def stop_profile(self) -> ProfileResult:
        """Stop the profiler; the result names the trace written and the GPU's busy time."""
        return self._profile(ProfileReq("stop"))

    def _profile(self, req: ProfileReq) -> ProfileResult:
        result = self._run(self.tokenizer_manager.profile(req))
        if not result.success:
            raise ValueError(result.message)
        return result

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **template_kwargs: Any) -> str:
        """Render messages with the model's chat template (extra kwargs go to the template,
        e.g. tools=..., continue_final_message=True)."""
        if self.tokenizer is None:
            raise no_tokenizer_error("apply_chat_template")
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **template_kwargs)

    def abort_all(self, shutdown: bool = False) -> None:
        """End every in-flight request with finish_reason abort. `shutdown`: because the
        server stops (their status is then 503, which a router retries elsewhere)."""
        if not self._closed:
            self._children.send(AbortReq(abort_all=True, shutdown=shutdown))

    def shutdown(self) -> None:
        """Abort in-flight requests, stop the child processes, stop the loop."""
        if getattr(self, "_closed", True):
            return
        self._children.request_shutdown()
        # Let the aborted requests' final outputs reach their callers. Wait for them to be
        # finished, not gone: a caller that stopped reading never removes its state.
        deadline = time.monotonic() + 5
        while (self.tokenizer_manager.has_unfinished() and time.monotonic() < deadline
               and self._children.dead_child(grace_s=0) is None):
            time.sleep(0.05)
        self._closed = True
        self._receiver.join(timeout=5)
        self._children.stop()
        self._stop_loop()

    def kill(self) -> None:
        """Stop the child processes at once (SIGKILL): for a second Ctrl-C during shutdown."""
        self._closed = True
        self._children.kill()
        self._children.remove_socket_dir()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        if not self._loop_thread.is_alive():
            self.loop.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # best effort; explicit shutdown() is the contract
        try:
            self.shutdown()
        except Exception:
            pass


def _deliver(tm: TokenizerManager, msgs: list[Any]) -> None:
    for msg in msgs:
        tm.handle_output(msg)
