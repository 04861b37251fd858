"""The playground's image panel: one image's path through the served model, from the engine's own parts.

POST /image {model, image (a data: URL), text, generate} lays out the chat message [image, text] through the
chat APIs' own path (image_chat.image_chat_ids: the --mmproj check, ImageLimits, the engine's encoder
``prepare`` and image_prompt layout), runs the engine's vision encoder on the prepared pixels (``encode``)
and returns:
- ``seen``: the pixels as the encoder takes them (its normalisation undone) as a PNG data URL, and their
  size; ``patch``: the patch side, ``patch_grid`` [rows, columns] and ``patches``;
- ``tokens``: the image's rows in the sequence (the encoder's num_tokens), ``token_grid`` [rows, columns]
  after the family's merge (Gemma 3 and 4 average-pool merge x merge patches, Qwen-VL / Pixtral merge them),
  ``cells``: each row's cell in token_grid (None for a Pixtral [IMG_BREAK] row);
- ``norms``: the L2 norm of each projected row (the vector the text model takes in that row's place);
- ``sequence``: the prompt's pieces (None at the image's rows), ``run`` {start, length} of the image;
- ``attention`` (``generate`` > 0, a traceable model): the prompt traced with the image's rows
  (models/trace.py) and ``generate`` greedy tokens; per answer token, the query row that chose it, and per
  layer the heads' mean attention on each image row and the share of attention the image gets.
A model without a vision encoder is a 400 naming --mmproj; a bad image a 400 naming why.
"""

from __future__ import annotations

import asyncio
import base64
import io
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from fastapi import APIRouter, HTTPException, Request
from PIL import Image

from hitenter.models.trace import trace_with_generation
from hitenter.server.api_error import APIError
from hitenter.server.image_chat import image_chat_ids
from hitenter.server.playground_models import MAX_IMAGE_TRACE_TOKENS, ImageBody, body_doc, parse
from hitenter.server.playground_util import piece


def seen_png(pixels: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> str:
    """[3, H, W] normalised pixels back to 8-bit RGB, as a PNG data URL."""
    m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    rgb = ((pixels.float() * s + m).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def geometry(cfg: Any, height: int, width: int, num_tokens: int) -> dict[str, Any]:
    """Patch grid, token grid after the merge and each row's cell (see the module docstring)."""
    p, m = cfg.patch_size, cfg.merge
    rows, cols = height // (p * m), width // (p * m)
    if num_tokens == rows * cols:
        cells: list[int | None] = list(range(num_tokens))
    elif num_tokens == rows * cols + rows - 1:      # an [IMG_BREAK] row after each token row but the last
        cells = [c for r in range(rows) for c in [*range(r * cols, (r + 1) * cols), *([None] if r < rows - 1 else [])]]
    else:
        raise ValueError(f"image: {num_tokens} rows do not fit a {rows} x {cols} token grid")
    return {"patch": p, "patch_grid": [height // p, width // p], "patches": (height // p) * (width // p),
            "merge": m, "reduce": "average-pooled" if cfg.projector in ("gemma3", "gemma4v") else "merged",
            "token_grid": [rows, cols], "cells": cells}


def attention_on_image(tr: Any, start: int, length: int, tok: Any) -> list[dict[str, Any]]:
    """Per generated token: the query row that chose it, and per layer the heads' mean attention on each of
    the image's rows and the image's share of that row's attention."""
    out = []
    for g, tid in enumerate(tr.generated):
        q = tr.num_prompt - 1 + g
        rows = tr.attentions[:, :, q, :].float().mean(1)                # [layers, keys]
        img = rows[:, start:start + length]
        out.append({"piece": piece(tok, tid), "query": q, "share": img.sum(-1).tolist(),
                    "layers": (img * 1e4).round().div(1e4).tolist()})
    return out


async def image_view(pg: Any, traces: Any, body: ImageBody) -> dict[str, Any]:
    """The module docstring's response for one image."""
    name, c = body.model, pg.engine_of(body.model)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": body.image}},
                                             {"type": "text", "text": body.text}]}]
    try:
        prompt = await image_chat_ids(SimpleNamespace(client=c, name=name), messages, True, False)
    except APIError as e:
        raise HTTPException(e.status, e.message) from None
    enc = c.inspector.vision_encoder()
    run = prompt.runs[0]
    async with traces.one_at_a_time:                 # the encoder and traces share the CPU with the engine
        rows = await asyncio.to_thread(enc.encode, run.pixels)
    cfg, px = enc.config, run.pixels.pixels
    tok = c.tokenizer
    ids = prompt.ids
    out: dict[str, Any] = {
        "model": name, "projector": cfg.projector, "seen": seen_png(px, cfg.image_mean, cfg.image_std),
        "size": [int(px.shape[1]), int(px.shape[2])], "encoder_layers": cfg.layers, "encoder_width": cfg.hidden,
        "tokens": run.length, "bidirectional": run.bidirectional,
        **geometry(cfg, int(px.shape[1]), int(px.shape[2]), run.length),
        "norms": rows[:, :cfg.projection_dim].float().norm(dim=-1).tolist(), "width": int(rows.shape[-1]),
        "run": {"start": run.start, "length": run.length}, "count": len(ids),
        "sequence": [None if run.start <= i < run.start + run.length else piece(tok, t) for i, t in enumerate(ids)],
        "attention": None, "attention_note": None}
    if body.generate:
        out.update(await _attention(traces, name, ids, body.generate, (run.start, rows, run.bidirectional), tok))
    return out


async def _attention(traces: Any, name: str | None, ids: list[int], generate: int, image: tuple[Any, ...],
                     tok: Any) -> dict[str, Any]:
    if len(ids) + generate > MAX_IMAGE_TRACE_TOKENS:
        return {"attention_note": f"{len(ids)} prompt tokens + {generate}: the attention map traces up to "
                                  f"{MAX_IMAGE_TRACE_TOKENS}"}
    model = traces.model_of(name)
    try:
        async with traces.one_at_a_time:
            tr = await asyncio.to_thread(trace_with_generation, model, ids, generate,
                                         frozenset(tok.eog_token_ids), [image])
    except ValueError as e:
        return {"attention_note": str(e)}
    return {"attention": attention_on_image(tr, image[0], len(image[1]), tok),
            "answer_ids": list(tr.generated)}


def vision_routes(router: APIRouter, pg: Any, traces: Any) -> None:
    @router.post("/image", openapi_extra=body_doc(ImageBody))
    async def image(request: Request) -> dict[str, Any]:
        return await image_view(pg, traces, await parse(request, ImageBody))
