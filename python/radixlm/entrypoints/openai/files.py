"""OpenAI's Files API, as far as the Batch API needs it: upload (POST /v1/files, multipart), list,
retrieve, download (/content) and delete. Files live in the server's memory: they are inputs and
outputs of batches (batches.py), gone when the server stops, as with SGLang's batch support.

The upload is `multipart/form-data` (what `openai`'s `client.files.create` sends). FastAPI's form
parsing needs the optional python-multipart package, so the body is parsed here with the
standard library's MIME parser instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from email.errors import CloseBoundaryNotFoundDefect
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlm.entrypoints.errors import error_response
from radixlm.entrypoints.request_body import BodyError, read_body

router = APIRouter()

MAX_FILE_BYTES = 200 * 1024 * 1024     # OpenAI's limit for a batch input file
# What an upload may be for; "batch_output" is the purpose of the files a batch writes, never
# of an upload (as in OpenAI's API).
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))

    def card(self) -> dict[str, Any]:
        """The File object of OpenAI's API."""
        return {"id": self.id, "object": "file", "bytes": len(self.data),
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


class FileStore:
    """The server's files, by id."""

    def __init__(self) -> None:
        self.files: dict[str, StoredFile] = {}

    def add(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        f = StoredFile(id=f"file-{uuid.uuid4().hex}", filename=filename, purpose=purpose,
                       data=data)
        self.files[f.id] = f
        return f

    def get(self, file_id: str) -> StoredFile | None:
        return self.files.get(file_id)


def file_store(app: Any) -> FileStore:
    """The app's files (created on first use)."""
    state = app.state
    if getattr(state, "files", None) is None:
        state.files = FileStore()
    return state.files


class UploadError(ValueError):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body -> {field name: (filename or None, bytes)}."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise UploadError(f"the upload must be multipart/form-data, got "
                          f"{content_type or 'no content type'!r}")
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise UploadError("the multipart body could not be parsed (no parts)")
    if any(isinstance(d, CloseBoundaryNotFoundDefect) for d in message.defects):
        # (a cut-off upload: the last part may be missing its end, so nothing in it is trusted)
        raise UploadError("the multipart body has no closing boundary (was the upload cut off?)")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        if str(name) in fields:
            raise UploadError(f"the upload has more than one `{name}` field", param=str(name))
        data = part.get_payload(decode=True)
        fields[str(name)] = (part.get_filename(), data if data is not None else b"")
    return fields


@router.post("/v1/files")
async def upload_file(request: Request):
    try:
        # (the file's limit, and room for the form's other parts and boundaries)
        body = await read_body(request, MAX_FILE_BYTES + 64 * 1024, "for an uploaded file")
        # (parsing a large upload takes seconds: off the event loop, which keeps serving)
        fields = await asyncio.to_thread(
            parse_multipart, request.headers.get("content-type", ""), body)
        if "file" not in fields:
            raise UploadError("the upload has no `file` field", param="file")
        if "purpose" not in fields:
            raise UploadError("the upload has no `purpose` field", param="purpose")
        purpose = fields["purpose"][1].decode("utf-8", "replace").strip()
        if purpose not in UPLOAD_PURPOSES:
            raise UploadError(f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}, got "
                              f"{purpose!r}", param="purpose")
        filename, data = fields["file"]
        if len(data) > MAX_FILE_BYTES:
            raise UploadError(f"the file is {len(data)} bytes; at most {MAX_FILE_BYTES}", 413,
                              param="file")
    except UploadError as e:
        return error_response(str(e), e.status, param=e.param)
    except BodyError as e:
        return error_response(str(e), e.status, param="file")
    stored = file_store(request.app).add(filename or "upload", purpose, data)
    return JSONResponse(stored.card())


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, limit: int = 10000,
                     order: str = "desc", after: str | None = None):
    """OpenAI's listing: newest first by default (`order`), `limit` (1-10,000) per page,
    continuing `after` a file id."""
    problem = list_args_problem(limit, 10000, order)
    if problem is not None:
        return problem
    files = [f for f in file_store(request.app).files.values()
             if purpose is None or f.purpose == purpose]
    if order == "desc":
        files.reverse()
    page, more = paginate(files, limit, after)
    if page is None:
        among = "" if purpose is None else f" with purpose {purpose!r}"
        return error_response(f"no file{among} has the id {after!r}", 404, param="after")
    return list_page([f.card() for f in page], more)


def paginate(items: list, limit: int, after: str | None) -> tuple[list | None, bool]:
    """OpenAI's cursor pages over `items` (objects or dicts with an `id`, in listing order):
    up to `limit` of those after the one with id `after`, and whether more follow; None for an
    `after` that names none of them."""
    if after is not None:
        ids = [x["id"] if isinstance(x, dict) else x.id for x in items]
        if after not in ids:
            return None, False
        items = items[ids.index(after) + 1:]
    return items[:limit], len(items) > limit


def list_args_problem(limit: int, max_limit: int, order: str = "desc") -> JSONResponse | None:
    """The 400 for an OpenAI list's `limit` outside 1..max_limit or an `order` other than
    asc / desc; None when both are fine."""
    if not 1 <= limit <= max_limit:
        return error_response(f"limit must be between 1 and {max_limit}, got {limit}", 400,
                              param="limit")
    if order not in ("asc", "desc"):
        return error_response(f"order must be asc or desc, got {order!r}", 400, param="order")
    return None


def list_page(cards: list[dict[str, Any]], more: bool) -> JSONResponse:
    """One page of an OpenAI list: its objects, the first and last ids, whether more follow."""
    return JSONResponse({"object": "list", "data": cards,
                         "first_id": cards[0]["id"] if cards else None,
                         "last_id": cards[-1]["id"] if cards else None, "has_more": more})


def _missing(file_id: str) -> JSONResponse:
    return error_response(f"no file with id {file_id!r}", 404, param="file_id")


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request):
    f = file_store(request.app).get(file_id)
    return _missing(file_id) if f is None else JSONResponse(f.card())


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request):
    f = file_store(request.app).get(file_id)
    if f is None:
        return _missing(file_id)
    media = "application/jsonl" if f.filename.endswith(".jsonl") else "application/octet-stream"
    return Response(f.data, media_type=media)


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request):
    f = file_store(request.app).files.pop(file_id, None)
    if f is None:
        return _missing(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


# OpenAI's limits on the metadata of batches and responses
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def metadata_problem(metadata: Any) -> str | None:
    """What is wrong with an object's metadata by OpenAI's rules (batches, responses), or
    None."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        return "metadata must be an object of strings"
    if len(metadata) > MAX_METADATA_PAIRS:
        return f"metadata has {len(metadata)} pairs; at most {MAX_METADATA_PAIRS}"
    for k, v in metadata.items():
        if len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE:
            return (f"metadata keys may have {MAX_METADATA_KEY} characters and values "
                    f"{MAX_METADATA_VALUE}")
    return None
