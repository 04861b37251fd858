"""GET /v1/models and /v1/models/{id}: the served models as OpenAI lists them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from hitenter.server.api_error import error_responses
from hitenter.server.generation import ServedModel, State

router = APIRouter(responses=error_responses(404))


def model_card(m: ServedModel) -> dict[str, Any]:
    """One model as /v1/models lists it (and /v1/models/{id} returns it)."""
    return {"id": m.name, "object": "model", "created": m.created, "owned_by": "hitenter", "root": m.name,
            "max_model_len": m.max_model_len}


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(m) for m in state.models.values()]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: State) -> dict[str, Any]:
    return model_card(state.model_for(model_id))
