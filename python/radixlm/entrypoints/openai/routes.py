"""The OpenAI-compatible endpoints under /v1. The app (http_server.py) includes `router`; its
RequestValidationError handler turns pydantic errors in these bodies into OpenAI-shaped 400s."""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from radixlm.entrypoints.errors import bad_request, error_response
from radixlm.entrypoints.request_body import read_json_body
from radixlm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                 ModelCard, ModelList)
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


Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The body through the server's one JSON reader (size, depth and finite-number checks),
    then the pydantic model; a ValidationError becomes the app's OpenAI-shaped 400."""
    obj = await read_json_body(request)
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


# The `model` field of a request is not checked against the served name: SGLang accepts any
# (clients commonly send "default"), and the response names the model that answered.

async def _handle(request: Request, model: type[BaseModel], serving: type) -> Response:
    try:
        if request.app.state.engine.tokenizer is None:
            raise no_tokenizer_error(request.url.path)
        body = await parse_body(request, model)
    except ValueError as e:
        return bad_request(e)
    return await serving(request, body).handle()


@router.post("/v1/completions")
async def create_completion(request: Request):
    return await _handle(request, CompletionRequest, CompletionServing)


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request):
    return await _handle(request, ChatCompletionRequest, ChatServing)
