"""RuntimeEndpoint: a running radixlm (or SGLang) server, through its native HTTP API."""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator

from radixlm.lang._http import httpx
from radixlm.lang.backends.native import NativeBackend
from radixlm.lang.chat import ChatRenderer, load_renderer
from radixlm.lang.errors import BackendError, BackendUnavailableError, RequestRejectedError


class RuntimeEndpoint(NativeBackend):
    """`RuntimeEndpoint("http://127.0.0.1:30000", api_key=None)`.

    Connects at construction (GET /get_model_info) so that a wrong URL fails here, not at the
    first gen. Chat roles are rendered with the server's tokenizer's chat template, loaded
    locally from the `tokenizer_path` the server reports (or the one given here); where that
    path is not readable from this machine, roles fall back to a plain format with a warning.
    `chat_template_name` renders them with another template instead: a built-in name
    ("chatml", "llama-3-instruct", "gemma-it"), a Jinja file or a Jinja template.
    """

    def __init__(self, base_url: str, api_key: str | None = None, verify: Any = None,
                 chat_template_name: str | None = None, *, tokenizer_path: str | None = None,
                 timeout: float | None = None, max_connections: int = 512):
        super().__init__()
        self._chat_template: str | None = None
        if chat_template_name is not None:
            from radixlm.utils.chat_templates import load_chat_template
            try:
                self._chat_template = load_chat_template(chat_template_name)
            except ValueError as e:
                raise ValueError(f"chat_template_name: {e}") from None
        self.base_url = base_url.rstrip("/")
        self._shut_down = False
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Generations on a busy server can take minutes: no read timeout by default, but a
        # dead host must fail fast. Many connections: forks and run_batch call in parallel.
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, verify=True if verify is None else verify,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=min(max_connections, 128)))
        self.model_info: dict[str, Any] = self._request("GET", "/get_model_info")
        self._tokenizer_path = tokenizer_path or self.model_info.get("tokenizer_path")
        self._renderer: ChatRenderer | None = None
        self._renderer_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"

    # ------------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        self._check_open()
        try:
            resp = self._client.request(method, path, json=body)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        self._raise_for_status(resp)
        ctype = resp.headers.get("content-type", "")
        return resp.json() if "json" in ctype else resp.text

    def _unreachable(self, e: Exception) -> BackendError:
        if isinstance(e, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
            # (connected, but no answer in time: the server is there, the request is slow)
            return BackendError(
                f"the radixlm server at {self.base_url} did not answer within the client's "
                f"timeout ({type(e).__name__}); raise RuntimeEndpoint(timeout=...)")
        return BackendUnavailableError(
            f"cannot reach the radixlm server at {self.base_url} ({type(e).__name__}: {e}); "
            f"is it still running?")

    def _raise_for_status(self, resp: Any) -> None:
        if resp.status_code < 400:
            return
        try:
            body = resp.json()
            err = body.get("error", body) if isinstance(body, dict) else body
            message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        except ValueError:
            message = resp.text
        where = f"{resp.request.method} {resp.request.url.path}"
        if resp.status_code in (400, 422):
            raise RequestRejectedError(f"the server rejected {where}: {message}")
        if resp.status_code == 401:
            raise BackendError(f"the server refused {where}: {message} (check api_key)")
        if resp.status_code == 503:
            raise BackendUnavailableError(f"the server cannot serve {where}: {message}")
        raise BackendError(f"{where} failed with HTTP {resp.status_code}: {message}")

    # ------------------------------------------------------------------ NativeBackend

    def _generate(self, payload: dict[str, Any]) -> Any:
        return self._request("POST", "/generate", payload)

    def _generate_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        self._check_open()
        try:
            with self._client.stream("POST", "/generate", json=payload) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._raise_for_status(resp)
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    yield json.loads(data)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        return self._request("POST", "/tokenize", {"prompt": texts})["tokens"]

    # ------------------------------------------------------------------ Backend

    def chat_renderer(self) -> ChatRenderer:
        with self._renderer_lock:  # loading a tokenizer takes a while; do it once
            if self._renderer is None:
                self._renderer = load_renderer(
                    self._tokenizer_path,
                    self._chat_template or self.model_info.get("chat_template"))
            return self._renderer

    def flush_cache(self, empty_cache: bool = True) -> None:
        # (an SGLang server reads the flag; radixlm's /flush_cache ignores the body)
        self._request("POST", "/flush_cache", {"empty_cache": empty_cache})

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")

    def get_model_name(self) -> str:
        return self.model_info.get("model_path", "")

    def shutdown(self) -> None:
        self._shut_down = True
        self._client.close()

    def _check_open(self) -> None:
        # (httpx's own error for a closed client is a bare RuntimeError, outside LangError)
        if self._shut_down:
            raise BackendUnavailableError(f"{self!r} has been shut down")
