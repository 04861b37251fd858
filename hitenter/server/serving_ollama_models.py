"""Ollama's model and embedding API: GET /api/tags, POST /api/show, GET /api/ps, GET /api/version,
POST /api/embed and the older /api/embeddings.

/api/tags lists the resident models, then the pulled ones a request would load; /api/ps the resident
ones with their size (weights file plus reserved KV cache) and when an idle one unloads. Models are
listed as ``<name>:latest``, their details read from the GGUF header (architecture,
parameter count from the shapes, the file type as the quantization level); ``digest`` is the file's
sha256 when the model cache recorded one (``NAME.gguf.sha256``), else a sha256 of its path, size and
mtime (an identity, not a content hash). Embeddings are the /v1 ones (the model's pooling, L2-normalized,
also for /api/embeddings where Ollama's are not normalized). An input longer than the window is a
400, unless ``truncate: true`` is sent, which cuts it to the window (Ollama cuts by default: never
silently here).
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from hitenter.server.api_error import APIError, error_responses
from hitenter.server.generation import ServedModel, State, check_chars
from hitenter.server.model_manager import FOREVER_AT, expires_at
from hitenter.server.serving_embedding import check_embedding_model, embed, text_ids
from hitenter.server.serving_ollama import (
    NS,
    EmbeddingsRequest,
    EmbedRequest,
    Options,
    ShowRequest,
    fim_tokens,
    model_of,
    tagged,
)

OLLAMA_VERSION = "0.12.0"       # the Ollama API level these routes follow
router = APIRouter(responses=error_responses(400, 404, 413))


def _quantization(meta: dict[str, Any]) -> str:
    import gguf

    ft = meta.get("general.file_type")
    try:
        return gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        return "unknown"


def details(m: ServedModel) -> dict[str, Any]:
    i = m.client.info
    n = i.parameter_count
    size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    return {"parent_model": "", "format": "gguf" if i.path else "builtin", "family": i.architecture,
            "families": [i.architecture], "parameter_size": size, "quantization_level": _quantization(i.metadata)}


def digest(m: ServedModel) -> str:
    path = m.client.info.path
    if path is None:
        return hashlib.sha256(m.name.encode()).hexdigest()
    recorded = Path(path + ".sha256")
    if recorded.is_file():
        return recorded.read_text().split()[0]
    st = Path(path).stat()
    return hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def _modified(m: ServedModel) -> str:
    path = m.client.info.path
    ts = Path(path).stat().st_mtime if path else m.created
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _entry(m: ServedModel) -> dict[str, Any]:
    return {"name": tagged(m.name), "model": tagged(m.name), "modified_at": _modified(m),
            "size": m.client.info.file_size, "digest": digest(m), "details": details(m)}


def capabilities(m: ServedModel) -> list[str]:
    template = m.tokenizer.chat_template or ""
    return ["completion"] + (["tools"] if "tools" in template else []) + (
        ["insert"] if fim_tokens(m.tokenizer) is not None else [])


def _file_entry(name: str) -> dict[str, Any] | None:
    """A pulled model that is not resident, from its file alone (its details are known once loaded)."""
    from hitenter.models.registry import model_path

    path = model_path(name)
    try:
        st = path.stat()
    except OSError:
        return None
    recorded = Path(f"{path}.sha256")
    sha = recorded.read_text().split()[0] if recorded.is_file() else hashlib.sha256(
        f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    modified = datetime.fromtimestamp(st.st_mtime, UTC).isoformat().replace("+00:00", "Z")
    return {"name": tagged(name), "model": tagged(name), "modified_at": modified, "size": st.st_size, "digest": sha,
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [], "parameter_size": "",
                        "quantization_level": ""}}


@router.get("/api/tags")
async def tags(state: State) -> dict[str, Any]:
    """The resident models, then those pulled that a request would load."""
    resident = state.models
    out = [_entry(m) for m in resident.values()]
    for name in state.servable():
        if name not in resident and (e := _file_entry(name)) is not None:
            out.append(e)
    return {"models": out}


def _time(t: float | None) -> str:
    if t is None:
        return FOREVER_AT
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


@router.get("/api/ps")
async def ps(state: State) -> dict[str, Any]:
    """The resident models: ``size`` their weights file and reserved KV cache, ``expires_at`` when an idle
    one unloads (year 9999: it stays)."""
    return {"models": [{**_entry(r.model), "size": r.size, "expires_at": _time(expires_at(r)), "size_vram": 0,
                        "context_length": r.model.max_model_len} for r in state.manager.residents()]}


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


@router.post("/api/show")
async def show(req: ShowRequest, state: State) -> dict[str, Any]:
    name = req.model or req.name
    if not name:
        raise APIError(400, "model: is required", "model")
    m = await model_of(state, name)
    i = m.client.info
    arch = i.architecture
    info = {"general.architecture": arch, "general.parameter_count": i.parameter_count,
            f"{arch}.context_length": i.context_length, f"{arch}.embedding_length": i.hidden_size,
            f"{arch}.block_count": i.num_layers, f"{arch}.attention.head_count": i.num_heads,
            f"{arch}.attention.head_count_kv": i.num_kv_heads, "general.file_type": i.metadata.get("general.file_type")}
    params = "temperature 0.8\ntop_k 40\ntop_p 0.9"
    return {"modelfile": f"# served by hitenter\nFROM {i.path or m.name}\n", "parameters": params,
            "template": m.tokenizer.chat_template or "", "details": details(m), "model_info": info,
            "capabilities": capabilities(m), "modified_at": _modified(m)}


def _window(m: ServedModel, options: Options | None) -> int:
    """The window inputs must fit: ``num_ctx`` (the only option that applies to embeddings) or the server's."""
    given = sorted(k for k, v in (options.model_dump() if options else {}).items() if v is not None)
    if set(given) - {"num_ctx"}:
        raise APIError(400, f"options: {given} do not apply to embeddings (only num_ctx does)", "options")
    n = options.num_ctx if options is not None and options.num_ctx is not None else m.max_model_len
    if n > m.max_model_len:
        raise APIError(400, f"options.num_ctx: {n} is larger than this server's window of {m.max_model_len} "
                       "tokens", "options.num_ctx")
    return n


def _inputs(m: ServedModel, texts: list[str], truncate: bool | None, param: str, window: int) -> list[list[int]]:
    out = []
    for t in texts:
        if not t:
            raise APIError(400, f"{param}: an input is empty", param)
        if not truncate:
            check_chars(m, len(t), param)
        ids = text_ids(m.tokenizer, t)
        if len(ids) > window:
            if not truncate:
                raise APIError(400, f"{param}: {len(ids)} tokens exceed the {window}-token window; "
                               "send truncate: true to cut inputs to it", param)
            ids = ids[:window]
        out.append(ids)
    return out


@router.post("/api/embed")
async def embed_route(req: EmbedRequest, state: State, request: Request) -> dict[str, Any]:
    t0 = time.monotonic()
    m = await model_of(state, req.model, req.keep_alive)
    check_embedding_model(m, req.dimensions)
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    prompts = _inputs(m, texts, req.truncate, "input", _window(m, req.options))
    vecs = await embed(m, prompts, dimensions=req.dimensions, request=request)
    took = int((time.monotonic() - t0) * NS)
    return {"model": req.model, "embeddings": vecs, "total_duration": took, "load_duration": 0,
            "prompt_eval_count": sum(map(len, prompts))}


@router.post("/api/embeddings")
async def embeddings_route(req: EmbeddingsRequest, state: State, request: Request) -> dict[str, Any]:
    m = await model_of(state, req.model, req.keep_alive)
    if not req.prompt:
        return {"embedding": []}               # Ollama's answer to an empty prompt (a load)
    check_embedding_model(m, None)
    prompts = _inputs(m, [req.prompt], False, "prompt", _window(m, req.options))
    return {"embedding": (await embed(m, prompts, "prompt", request=request))[0]}

