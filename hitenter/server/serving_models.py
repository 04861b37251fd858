"""GET /v1/models and /v1/models/{id}: the models this server can serve, as OpenAI lists them: the
resident ones (with their window), then those it would load on a request naming them (model_catalog.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from hitenter.server.api_error import APIError, error_responses
from hitenter.server.generation import ServedModel, ServerState, State, now

router = APIRouter(responses=error_responses(404))


def model_card(m: ServedModel) -> dict[str, Any]:
    """One resident model as /v1/models lists it (and /v1/models/{id} returns it)."""
    return {"id": m.name, "object": "model", "created": m.created, "owned_by": "hitenter", "root": m.name,
            "max_model_len": m.max_model_len}


def _card(state: ServerState, name: str) -> dict[str, Any]:
    m = state.models.get(name)
    if m is not None:
        return model_card(m)
    return {"id": name, "object": "model", "created": now(), "owned_by": "hitenter", "root": name}


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, Any]:
    return {"object": "list", "data": [_card(state, n) for n in state.servable()]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: State) -> dict[str, Any]:
    if model_id not in state.servable():
        raise APIError(404, f"the model `{model_id}` does not exist; served: {state.servable()}", "model")
    return _card(state, model_id)
