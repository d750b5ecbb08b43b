"""OpenAI's Batch API: a JSONL file of /v1/chat/completions or /v1/completions requests, uploaded
through the Files API (files.py), run by this server, with the answers written to an output file
(and the failed requests to an error file) in OpenAI's line format.

    POST /v1/batches                {input_file_id, endpoint, completion_window, metadata}
    GET  /v1/batches[?limit&after]  newest first
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel    running requests are aborted; finished answers are kept

The input is checked line by line when the batch is created (JSON read by the server's own
reader, as an HTTP body is; a unique custom_id, method POST, the batch's endpoint, a body object);
a bad file fails the batch with every bad line in `errors`, as OpenAI does. Lines are separated by
"\n" only (U+2028 and friends are text inside a JSON string). The requests then run concurrently
through the same handlers as the HTTP endpoints, so the engine batches them; a request that fails
(bad parameters, a prompt too long) becomes a line of the error file with its HTTP status and
error body, and the others go on. A line refused because the engine's queue is full (429,
--max-queued-requests) waits and is sent again: a batch paces itself. Batches live in the
server's memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request as StarletteRequest

from radixlm.entrypoints.errors import error_body, error_response
from radixlm.entrypoints.openai.files import (file_store, list_args_problem, list_page,
                                             metadata_problem, paginate)
from radixlm.entrypoints.openai.routes import ENDPOINTS, answer_json, serve_body
from radixlm.entrypoints.request_body import parse_json, read_json_body

logger = logging.getLogger(__name__)
router = APIRouter()

COMPLETION_WINDOWS = ("24h",)
MAX_LINES = 50_000                 # OpenAI's limit per batch
MAX_CONCURRENT_REQUESTS = 256      # in the engine at once, per batch
MAX_REPORTED_ERRORS = 100          # bad input lines listed in a failed batch's `errors`
TERMINAL = ("completed", "failed", "cancelled", "expired")


class BatchInputError(ValueError):
    def __init__(self, message: str, line: int | None = None, param: str | None = None):
        super().__init__(message)
        self.line, self.param = line, param

    def record(self) -> dict[str, Any]:
        """One entry of a failed batch's `errors`."""
        return {"code": "invalid_input", "message": str(self), "param": self.param,
                "line": self.line}


@dataclass
class BatchLine:
    custom_id: str
    body: dict[str, Any]


@dataclass
class BatchJob:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    lines: list[BatchLine]
    status: str = "validating"
    created_at: int = field(default_factory=lambda: int(time.time()))
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    times: dict[str, int] = field(default_factory=dict)   # status -> when it was entered
    task: asyncio.Task | None = None

    def enter(self, status: str) -> None:
        self.status = status
        self.times[status] = int(time.time())

    def card(self) -> dict[str, Any]:
        """The Batch object of OpenAI's API."""
        at = self.times.get
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": None if not self.errors else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "in_progress_at": at("in_progress"), "expires_at": self.created_at + 24 * 3600,
            "finalizing_at": at("finalizing"), "completed_at": at("completed"),
            "failed_at": at("failed"), "expired_at": None, "cancelling_at": at("cancelling"),
            "cancelled_at": at("cancelled"),
            "request_counts": {"total": len(self.lines), "completed": self.completed,
                               "failed": self.failed},
            "metadata": self.metadata,
        }


def _jobs(request: Request) -> dict[str, BatchJob]:
    state = request.app.state
    if getattr(state, "batches", None) is None:
        state.batches = {}
    return state.batches


def parse_input(data: bytes, endpoint: str) -> tuple[list[BatchLine], list[BatchInputError]]:
    """The input file's requests, and what is wrong with it: each bad line (1-based), or the
    file as a whole. The batch runs only when the second list is empty."""
    if data.startswith(b"\xef\xbb\xbf"):   # a UTF-8 byte order mark
        data = data[3:]
    rows = data.split(b"\n")
    count = sum(1 for raw in rows if raw.strip())
    if count > MAX_LINES:      # (before parsing any: the file fails as a whole)
        return [], [BatchInputError(f"the input file has {count} requests; at most "
                                    f"{MAX_LINES}")]
    lines: list[BatchLine] = []
    errors: list[BatchInputError] = []
    seen: set[str] = set()
    for number, raw in enumerate(rows, 1):
        if not raw.strip():
            continue
        try:
            lines.append(_parse_line(raw, number, endpoint, seen))
        except BatchInputError as e:
            errors.append(e)
    if not lines and not errors:
        errors.append(BatchInputError("the input file has no requests"))
    return lines, errors


def _parse_line(raw: bytes, number: int, endpoint: str, seen: set[str]) -> BatchLine:
    try:
        obj = parse_json(raw.strip())      # (depth, finite numbers, encodable strings)
    except ValueError as e:
        raise BatchInputError(f"line {number} is not a valid request: {e}", number) from None
    if not isinstance(obj, dict):
        raise BatchInputError(f"line {number} is not a JSON object", number)
    custom_id, url, body = obj.get("custom_id"), obj.get("url"), obj.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        raise BatchInputError(f"line {number} has no custom_id (a string)", number, "custom_id")
    if custom_id in seen:
        raise BatchInputError(f"line {number} repeats the custom_id {custom_id!r}", number,
                              "custom_id")
    seen.add(custom_id)
    if str(obj.get("method", "POST")).upper() != "POST":
        raise BatchInputError(f"line {number}: method must be POST", number, "method")
    if url != endpoint:
        raise BatchInputError(f"line {number}: url {url!r} is not the batch's endpoint "
                              f"{endpoint!r}", number, "url")
    if not isinstance(body, dict):
        raise BatchInputError(f"line {number}: body must be a JSON object", number, "body")
    return BatchLine(custom_id, body)


def _internal_request(app: Any, path: str) -> StarletteRequest:
    """What a handler needs of an HTTP request, for a batch's lines: the app (its engine and
    flags) and a client that never goes away (a batch's requests end by cancelling it)."""
    forever = asyncio.Event()

    async def receive() -> dict:
        await forever.wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "app": app, "method": "POST", "path": path, "root_path": "",
             "query_string": b"", "headers": []}
    return StarletteRequest(scope, receive)


async def _answer(app: Any, endpoint: str, line: BatchLine) -> tuple[int, Any]:
    """One line's (HTTP status, JSON body), as the endpoint would have answered it; a line
    the engine's full queue refused (429) is sent again after a pause, until it is taken."""
    if line.body.get("stream") is True:   # (a stream that is not a boolean: the endpoint's 400)
        return 400, error_body("stream is not supported in a batch", 400, param="stream")
    pause = 0.05
    while True:
        status, body = await _answer_once(app, endpoint, line)
        if status != 429:
            return status, body
        await asyncio.sleep(pause)
        pause = min(pause * 2, 2.0)


async def _answer_once(app: Any, endpoint: str, line: BatchLine) -> tuple[int, Any]:
    try:
        response = await serve_body(_internal_request(app, endpoint), endpoint, line.body)
    except asyncio.CancelledError:
        raise
    except Exception as e:   # (the handlers answer errors themselves; this is a bug's net)
        logger.exception("batch request %s failed", line.custom_id)
        return 500, error_body(f"internal error: {type(e).__name__}: {e}", 500)
    if isinstance(response, StreamingResponse):   # (not asked for; never expected)
        return 500, error_body("the handler streamed a batch request", 500)
    return answer_json(response)


async def run_batch(app: Any, job: BatchJob) -> None:
    """Run the batch; whatever goes wrong, it ends in a terminal status."""
    try:
        await _run_lines(app, job)
    except Exception as e:     # (a bug's net: never a batch that stays in progress)
        logger.exception("batch %s failed", job.id)
        job.errors = [{"code": "internal_error", "message": f"{type(e).__name__}: {e}",
                       "param": None, "line": None}]
        job.enter("failed")


async def _run_lines(app: Any, job: BatchJob) -> None:
    """Run every line (at most MAX_CONCURRENT_REQUESTS at once) and write the output and error
    files. Cancelling this task aborts the lines still running; those already answered are
    written all the same."""
    job.enter("in_progress")
    answers: dict[int, tuple[int, Any]] = {}
    gate = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)

    async def one(i: int, line: BatchLine) -> None:
        async with gate:
            status, body = await _answer(app, job.endpoint, line)
        answers[i] = (status, body)
        if status == 200:
            job.completed += 1
        else:
            job.failed += 1

    tasks = [asyncio.ensure_future(one(i, line)) for i, line in enumerate(job.lines)]
    cancelled = False
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        cancelled = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not cancelled:
        job.enter("finalizing")
    out, err = [], []
    for i in sorted(answers):
        status, body = answers[i]
        request_id = body.get("id") if isinstance(body, dict) and status == 200 else None
        record = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": job.lines[i].custom_id,
                  "response": {"status_code": status,
                               "request_id": request_id or f"req_{uuid.uuid4().hex}",
                               "body": body},
                  "error": None}
        # (ASCII: valid JSON whatever the strings hold, and no U+2028 inside a line)
        (out if status == 200 else err).append(json.dumps(record))
    files = file_store(app)
    if out:
        job.output_file_id = files.add(f"{job.id}_output.jsonl", "batch_output",
                                       ("\n".join(out) + "\n").encode()).id
    if err:
        job.error_file_id = files.add(f"{job.id}_error.jsonl", "batch_output",
                                      ("\n".join(err) + "\n").encode()).id
    job.enter("cancelled" if cancelled else "completed")


@router.post("/v1/batches")
async def create_batch(request: Request):
    try:
        obj = await read_json_body(request)
    except ValueError as e:
        return error_response(str(e), getattr(e, "status", 400))
    if not isinstance(obj, dict):
        return error_response("the body must be a JSON object", 400)
    endpoint, window = obj.get("endpoint"), obj.get("completion_window", "24h")
    file_id, metadata = obj.get("input_file_id"), obj.get("metadata")
    if endpoint not in ENDPOINTS:
        return error_response(f"endpoint must be one of {', '.join(ENDPOINTS)}, got "
                              f"{endpoint!r}", 400, param="endpoint")
    if window not in COMPLETION_WINDOWS:
        return error_response(f"completion_window must be 24h, got {window!r}", 400,
                              param="completion_window")
    bad_metadata = metadata_problem(metadata)
    if bad_metadata:
        return error_response(bad_metadata, 400, param="metadata")
    if not isinstance(file_id, str):
        return error_response("input_file_id is required (a file id)", 400,
                              param="input_file_id")
    stored = file_store(request.app).get(file_id)
    if stored is None:
        return error_response(f"no file with id {file_id!r}", 404, param="input_file_id")
    if stored.purpose != "batch":
        return error_response(f"the input file must be uploaded with purpose batch, not "
                              f"{stored.purpose!r}", 400, param="input_file_id")
    job = BatchJob(id=f"batch_{uuid.uuid4().hex}", endpoint=endpoint, input_file_id=file_id,
                   completion_window=window, metadata=metadata, lines=[])
    job.enter("validating")
    # (off the event loop: a 200 MB file takes seconds to parse)
    job.lines, errors = await asyncio.to_thread(parse_input, stored.data, endpoint)
    _jobs(request)[job.id] = job
    if errors:
        # (a batch that fails validation runs none of its requests: it counts none, as OpenAI's)
        job.lines = []
        job.errors = [e.record() for e in errors[:MAX_REPORTED_ERRORS]]
        job.enter("failed")
        return JSONResponse(job.card())
    job.task = asyncio.ensure_future(run_batch(request.app, job))
    return JSONResponse(job.card())


@router.get("/v1/batches")
async def list_batches(request: Request, limit: int = 20, after: str | None = None):
    problem = list_args_problem(limit, 100)
    if problem is not None:
        return problem
    page, more = paginate(list(reversed(_jobs(request).values())), limit, after)
    if page is None:
        return error_response(f"no batch with id {after!r}", 404, param="after")
    return list_page([j.card() for j in page], more)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request):
    job = _jobs(request).get(batch_id)
    if job is None:
        return error_response(f"no batch with id {batch_id!r}", 404, param="batch_id")
    return JSONResponse(job.card())


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request):
    job = _jobs(request).get(batch_id)
    if job is None:
        return error_response(f"no batch with id {batch_id!r}", 404, param="batch_id")
    if job.status in TERMINAL:
        return error_response(f"the batch is {job.status} and cannot be cancelled", 400,
                              param="batch_id")
    if job.status != "cancelling":
        job.enter("cancelling")
        if job.task is not None:
            job.task.cancel()
    return JSONResponse(job.card())
