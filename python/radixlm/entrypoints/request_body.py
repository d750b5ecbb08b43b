"""Reading a request's JSON body: one reader for every endpoint, native and OpenAI.

It bounds what a client can make the server do before any validation runs: the body's size
(HTTP 413 beyond `--max-request-body-mb`), its nesting depth, and it rejects numbers that are not
finite (NaN, Infinity, or a literal like 1e999 that overflows to infinity), naming the field.
Python's json module accepts all of those, and a NaN temperature would otherwise sample garbage.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Collection

from fastapi import Request

try:
    import orjson
except ImportError:      # (a dependency; json alone gives the same results)
    orjson = None

# Deep enough for any real request (a JSON schema nests two levels per object level), far below
# the interpreter's recursion limit that later code (validation, serialization) would hit.
MAX_JSON_DEPTH = 100

_SCALARS = {int, str, bool, type(None)}
# JSON can spell a lone UTF-16 surrogate ("\ud800"), which Python decodes into a str that no
# tokenizer can encode; only such an escape can produce one, so only then are strings checked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BodyError(ValueError):
    """A body that cannot be accepted; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param      # the field it is about, where one is (OpenAI's `param`)


async def read_json_body(request: Request, id_lists: Collection[str] = ()) -> Any:
    """The parsed JSON body of `request` (an empty body reads as {}); raises BodyError.
    `id_lists`: see `check_json_values`."""
    limit = max_body_bytes(request)
    return parse_json(await read_body(request, limit, "(--max-request-body-mb)"), id_lists)


async def read_body(request: Request, limit: int, why: str = "") -> bytes:
    """The raw body, refused with a 413 BodyError as soon as it passes `limit` bytes (by its
    declared length, or while a body without one streams in)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, why)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a chunked body that did not declare its length
            raise _too_large(limit, why)
        chunks.append(chunk)
    return b"".join(chunks)


def max_body_bytes(request: Request) -> int:
    return int(request.app.state.server_args.max_request_body_mb * 1024 * 1024)


def _too_large(limit: int, why: str) -> BodyError:
    return BodyError(f"the request body is larger than the server's limit of {limit} bytes"
                     + (f" {why}" if why else ""), 413)


def parse_json(raw: bytes, id_lists: Collection[str] = ()) -> Any:
    raw = raw or b"{}"
    if orjson is not None:
        # orjson takes half the time of json on a batch of token ids (1M ids: 50 vs 88 ms on a
        # 2-core dev machine). What it refuses (NaN, 1e999, a lone surrogate, UTF-16, bad
        # JSON) goes to json below, which accepts it or words the error as it always did.
        try:
            obj = orjson.loads(raw)
            check_json_values(obj, id_lists, from_orjson=True)
            return obj
        except (orjson.JSONDecodeError, _ParseAgain):
            pass
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise BodyError(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep") \
            from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BodyError(f"malformed JSON body: {e}") from None
    check_json_values(obj, id_lists)
    if _SURROGATE_ESCAPE.search(raw):
        check_strings_encode(obj)
    return obj


class _ParseAgain(Exception):
    """orjson's result may differ from json's: parse with json."""


def check_json_values(obj: Any, id_lists: Collection[str] = (),
                      from_orjson: bool = False) -> None:
    """Raise BodyError for nesting deeper than MAX_JSON_DEPTH or a non-finite number; the
    message names the field (e.g. `sampling_params.temperature`). `id_lists`: top-level fields
    whose lists of lists the caller checks itself to hold ints only (/generate's `input_ids`:
    1M ids in a batch, a type scan of ~20 ms that the request's own check repeats), so they
    are not looked into here. `from_orjson`: `obj` is orjson's, which turns an integer beyond
    64 bits into a float (json keeps it exact): a float that large raises _ParseAgain."""
    _check = _check_orjson_scalar if from_orjson else _check_scalar
    stack: list[tuple[Any, tuple]] = [(obj, ())]
    _check(obj, ())
    while stack:
        node, path = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if len(path) >= MAX_JSON_DEPTH:
            raise BodyError(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(node, list) and set(map(type, node)) <= _SCALARS:
            continue  # the common case of token ids or strings: nothing to look into
        if len(path) == 1 and path[0] in id_lists and isinstance(node, list) and \
                set(map(type, node)) == {list}:
            continue  # (a batch of prompts' ids: their own check rejects all but ints)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, (dict, list)):
                stack.append((value, path + (key,)))
            else:
                _check(value, path + (key,))


def check_strings_encode(obj: Any) -> None:
    """Raise BodyError for a string (or key) holding an unpaired surrogate, naming the field."""
    stack: list[tuple[Any, tuple]] = [(obj, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise BodyError(f"`{field_path(path) or 'the body'}` contains an unpaired UTF-16 "
                                f"surrogate (an invalid \\u escape)") from None
        elif isinstance(node, dict):
            stack.extend((k, path + (k,)) for k in node)
            stack.extend((v, path + (k,)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(node))


def _check_scalar(value: Any, path: tuple) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        where = field_path(path)
        raise BodyError(f"`{where or 'the body'}` must be a finite number, got {value}",
                        param=where or None)


def _check_orjson_scalar(value: Any, path: tuple) -> None:
    if isinstance(value, float) and abs(value) >= _INT64_LIMIT:
        raise _ParseAgain    # (perhaps an integer literal; orjson has no NaN or infinity)


_INT64_LIMIT = 2.0 ** 63


def field_path(path: tuple) -> str:
    """('sampling_params', 'temperature') -> 'sampling_params.temperature'; list indices as
    [i]."""
    out = ""
    for key in path:
        if not isinstance(key, int):   # a key may itself hold an unencodable surrogate
            key = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out
