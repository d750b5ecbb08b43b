"""POST /v1/score, SGLang's decoder-only scoring (the computation: scoring.py): `query`,
`items`, `label_token_ids`, optional `apply_softmax` and `item_first` -> {"scores": one list
per item, one score per label, "object": "scoring", "model", "usage"}."""

from __future__ import annotations

import asyncio
import threading

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from radixlm.entrypoints.disconnect import ClientDisconnected, unless_disconnected
from radixlm.entrypoints.errors import bad_request, error_response
from radixlm.entrypoints.openai.serving_base import engine_error, served_model_name
from radixlm.entrypoints.request_body import read_json_body
from radixlm.entrypoints.request_limits import LimitExceeded, check_request_limits
from radixlm.entrypoints.scoring import ScoringInputError, ScoringRequest, scoring_response

router = APIRouter()

REQUIRED = ("query", "items", "label_token_ids")


@router.post("/v1/score")
async def score(request: Request):
    try:
        obj = await read_json_body(request)
    except ValueError as e:
        return bad_request(e)
    if not isinstance(obj, dict):
        return error_response("the body must be a JSON object", 400)
    missing = [k for k in REQUIRED if obj.get(k) is None]
    if missing:
        return error_response(f"{missing[0]} is required", 400, param=missing[0])
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        return error_response("model must be a string", 400, param="model")
    req = ScoringRequest(obj["query"], obj["items"], obj["label_token_ids"],
                         obj.get("apply_softmax", False), obj.get("item_first", False))
    engine = request.app.state.engine
    stop = threading.Event()    # set when the client leaves: the tokenizing thread stops
    try:
        check_request_limits(request.app.state.server_args, len(req.item_list()), [], [])
        prompts = await unless_disconnected(
            request, asyncio.to_thread(engine.score_prompts, req, stop))
    except LimitExceeded as e:
        return error_response(str(e), 400, param="items")
    except ScoringInputError as e:
        return error_response(str(e), 400, param=e.param)
    except ClientDisconnected:
        stop.set()
        return error_response("the client disconnected", 499)
    try:
        scores = await unless_disconnected(request, engine.score_request_async(req, prompts))
    except ClientDisconnected:
        return error_response("the client disconnected", 499)
    except Exception as e:
        err = engine_error(e)
        return error_response(err.message, err.status,
                              param="items" if err.status == 400 else err.param)
    name = model if isinstance(model, str) and model else served_model_name(request)
    return JSONResponse(scoring_response(scores, prompts, name))
