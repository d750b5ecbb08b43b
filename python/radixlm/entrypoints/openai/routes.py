"""The OpenAI-compatible endpoints under /v1 (the Files and Batch APIs: files.py, batches.py).
pydantic errors in a body become OpenAI-shaped 400s naming the fields."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ValidationError

from radixlm.entrypoints.errors import bad_request, error_response, validation_error_response
from radixlm.entrypoints.request_body import read_json_body
from radixlm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixlm.entrypoints.openai.response_models import ModelCard, ModelList
from radixlm.entrypoints.openai.serving_base import served_model_name
from radixlm.entrypoints.openai.serving_chat import ChatServing
from radixlm.entrypoints.openai.serving_completions import CompletionServing
from radixlm.managers.no_tokenizer import no_tokenizer_error

router = APIRouter()


def _model_card(request: Request) -> ModelCard:
    engine = request.app.state.engine
    return ModelCard(id=served_model_name(request), root=engine.ready.model_path,
                     max_model_len=engine.ready.context_len)


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[_model_card(request)])


# `:path` so that ids with a slash ("org/name") reach this handler and get a proper 404.
@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request):
    card = _model_card(request)
    if model_id != card.id:
        return error_response(f"the model `{model_id}` does not exist; this server serves "
                              f"`{card.id}`", 404, param="model")
    return card


# The `model` field of a request is not checked against the served name: SGLang accepts any
# (clients commonly send "default"), and the response names the model that answered.

# endpoint -> (request body model, handler)
ENDPOINTS: dict[str, tuple[type[BaseModel], type]] = {
    "/v1/completions": (CompletionRequest, CompletionServing),
    "/v1/chat/completions": (ChatCompletionRequest, ChatServing),
}


async def serve_body(request: Request, endpoint: str, obj: Any) -> Response:
    """One OpenAI request whose JSON body has been read already (an HTTP request's, or a line
    of a batch: batches.py)."""
    model, serving = ENDPOINTS[endpoint]
    try:
        if request.app.state.engine.tokenizer is None:
            raise no_tokenizer_error(endpoint)
        body = model.model_validate(obj)
    except ValidationError as e:
        return validation_error_response(e.errors(include_url=False))
    except ValueError as e:
        return bad_request(e)
    return await serving(request, body).handle()


def answer_json(answer: Any) -> tuple[int, Any]:
    """A non-streamed handler's answer (a Response, or the pydantic model FastAPI would encode)
    as (HTTP status, JSON body), for callers that use it as data (batches, responses)."""
    if isinstance(answer, Response):
        return answer.status_code, json.loads(answer.body)
    return 200, jsonable_encoder(answer)


async def _handle(request: Request, endpoint: str) -> Response:
    # The body through the server's one JSON reader (size, depth and finite-number checks).
    try:
        obj = await read_json_body(request)
    except ValueError as e:
        return bad_request(e)
    return await serve_body(request, endpoint, obj)


@router.post("/v1/completions")
async def create_completion(request: Request):
    return await _handle(request, "/v1/completions")


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request):
    return await _handle(request, "/v1/chat/completions")
