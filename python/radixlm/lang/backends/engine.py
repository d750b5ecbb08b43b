"""EngineBackend: an in-process `radixlm.Engine`, no server needed."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from radixlm.lang.backends.native import NativeBackend
from radixlm.lang.chat import ChatRenderer, PlainRenderer, TemplateRenderer
from radixlm.lang.errors import BackendUnavailableError, RequestRejectedError


class EngineBackend(NativeBackend):
    """`EngineBackend(engine)` wraps a running Engine; `EngineBackend(model_path=..., **kw)`
    starts one (and `shutdown()` stops it). Passing an Engine anywhere a backend is expected
    (`set_default_backend(engine)`, `run(backend=engine)`) wraps it automatically."""

    def __init__(self, engine: Any = None, **engine_kwargs: Any):
        super().__init__()
        self._owns_engine = engine is None
        if engine is None:
            from radixlm.entrypoints.engine import Engine
            engine = Engine(**engine_kwargs)
        elif engine_kwargs:
            raise TypeError("pass either a running engine or Engine(...) keyword arguments")
        self.engine = engine
        self._renderer: ChatRenderer | None = None

    def __repr__(self) -> str:
        return f"EngineBackend({self.engine.server_args.model_path!r})"

    def _call(self, payload: dict[str, Any], stream: bool) -> Any:
        from radixlm.managers.tokenizer_manager import EngineDeadError

        if getattr(self.engine, "_closed", False):
            # Engine.generate on a shut-down engine would wait forever on its stopped loop.
            raise BackendUnavailableError("the engine has been shut down")
        payload = dict(payload)
        payload.pop("stream", None)
        try:
            return self.engine.generate(payload.pop("text", None), payload.pop("sampling_params"),
                                        payload.pop("input_ids", None), stream=stream, **payload)
        except EngineDeadError as e:
            raise BackendUnavailableError(f"the engine is not running: {e}") from e
        except ValueError as e:
            raise RequestRejectedError(f"the engine rejected the request: {e}") from e

    def _generate(self, payload: dict[str, Any]) -> Any:
        return self._call(payload, stream=False)

    def _generate_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        from radixlm.managers.tokenizer_manager import EngineDeadError

        try:
            yield from self._call(payload, stream=True)
        except EngineDeadError as e:  # raised while iterating, after the call returned
            raise BackendUnavailableError(f"the engine is not running: {e}") from e
        except ValueError as e:
            raise RequestRejectedError(f"the engine rejected the request: {e}") from e

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        return [self.engine.tokenizer(t).input_ids for t in texts]

    def chat_renderer(self) -> ChatRenderer:
        if self._renderer is None:
            tok = self.engine.tokenizer
            self._renderer = TemplateRenderer(tok) if getattr(tok, "chat_template", None) \
                else PlainRenderer()
        return self._renderer

    def flush_cache(self, empty_cache: bool = True) -> None:
        self.engine.flush_cache()       # (the engine frees no allocator memory: flag unused)

    def get_model_name(self) -> str:
        return self.engine.ready.model_path

    def get_server_info(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.engine.server_args),
                **dataclasses.asdict(self.engine.get_stats())}

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
