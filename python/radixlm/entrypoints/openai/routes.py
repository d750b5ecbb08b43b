"""The OpenAI-compatible endpoints under /v1. The app (http_server.py) includes `router`; its
RequestValidationError handler turns pydantic errors in these bodies into OpenAI-shaped 400s."""

from __future__ import annotations

from fastapi import APIRouter, Request

from radixlm.entrypoints.errors import error_response
from radixlm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                 ModelCard, ModelList)
from radixlm.entrypoints.openai.serving_base import served_model_name
from radixlm.entrypoints.openai.serving_chat import ChatServing
from radixlm.entrypoints.openai.serving_completions import CompletionServing

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

@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request):
    return await CompletionServing(request, body).handle()


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    return await ChatServing(request, body).handle()
