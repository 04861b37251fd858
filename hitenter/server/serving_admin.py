"""/health (always open) and /metrics (Prometheus; behind --api-key unless --metrics-public)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from hitenter.server.api_error import APIError, error_responses
from hitenter.server.generation import State
from hitenter.server.metrics import CONTENT_TYPE

health_router = APIRouter()
metrics_router = APIRouter()


@health_router.get("/health", response_class=Response,
                   responses={200: {"description": "every engine loop is running (empty body)"}, **error_responses(503)})
async def health(state: State) -> Response:
    if all(m.client.is_alive for m in state.models.values()):
        return Response(status_code=200)
    return APIError(503, "the engine loop is not running").response()


@metrics_router.get("/metrics", response_class=Response,
                    responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {}}, "description": "Prometheus text"}})
async def prom(state: State) -> Response:
    body = state.metrics.render({m.name: m.client for m in state.models.values()})
    return Response(body, media_type=CONTENT_TYPE)
