"""Error bodies in OpenAI's shape, used by every HTTP endpoint (native and OpenAI)."""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse


def error_body(message: str, status: int = 400, err_type: str | None = None,
               param: str | None = None) -> dict:
    if err_type is None:
        err_type = {400: "invalid_request_error", 401: "authentication_error",
                    404: "not_found_error", 422: "invalid_request_error",
                    429: "rate_limit_exceeded"}.get(
            status, "internal_server_error" if status >= 500 else "invalid_request_error")
    return {"object": "error", "message": message, "type": err_type, "param": param,
            "code": status,
            "error": {"message": message, "type": err_type, "param": param, "code": status}}


# Headers HTTP asks of some statuses (RFC 9110): how to authenticate, when to come back
STATUS_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"}}


def error_response(message: str, status: int = HTTPStatus.BAD_REQUEST,
                   err_type: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    status = int(status)
    return JSONResponse(error_body(message, status, err_type, param), status_code=status,
                        headers={**STATUS_HEADERS.get(status, {}), **(headers or {})})


def bad_request(e: ValueError) -> JSONResponse:
    """A ValueError from reading or validating a request -> its HTTP error: the status it
    carries (413 for a body over the size limit), else 400."""
    return error_response(str(e), getattr(e, "status", HTTPStatus.BAD_REQUEST),
                          param=getattr(e, "param", None))


def validation_error_response(errors: list[dict]) -> JSONResponse:
    """pydantic's errors for a request body -> one OpenAI-shaped 400 naming the fields."""
    if errors and errors[0].get("type") == "json_invalid":
        return error_response(f"malformed JSON body: {errors[0].get('msg')}", 400)
    parts: list[str] = []
    for e in errors:
        loc = field_loc(e.get("loc", ()))
        part = f"{loc}: {e.get('msg')}" if loc else str(e.get("msg"))
        if part not in parts:
            parts.append(part)
    param = field_loc(errors[0].get("loc", ())) if errors else ""
    return error_response("; ".join(parts) or "invalid request", 400, param=param or None)


# The names pydantic gives the members of a union in an error's location (`stop.str`,
# `tool_choice.literal['none','auto']`, `rid.constrained-str`, `json_schema.dict[str,any]`):
# not fields of the request.
_TYPE_TAGS = {"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "none",
              "any", "nullable"}


def field_loc(loc: tuple) -> str:
    """pydantic's error location -> the request field as OpenAI names it (`messages.0.content`),
    without the body / query / path marker or union member tags. (Request fields are
    snake_case; pydantic's tags are type names, CamelCase model names, or hold brackets,
    quotes or dashes.)"""
    keep = []
    for i, x in enumerate(loc):
        if i == 0 and x in ("body", "query", "path"):
            continue
        if isinstance(x, int) or (x not in _TYPE_TAGS and x[:1].islower()
                                  and not any(c in x for c in "[]'-,= ")):
            keep.append(str(x))
    return ".".join(keep)
