"""Inside one attention head and one layer, for the playground's hover views: the query's scaled dot products
with every earlier key (Q·K/√d, before softmax), each key's share of the value mix, and a token's residual
stream split into what attention added and what the MLP added, layer by layer.

All from a kept trace (playground_trace.py) and the layer's own modules (its ``qkv_heads``: norms, QK-norm,
RoPE; its ``o_proj``, ``ffn_norm``, ``ffn`` and residual rule), on the trace's hidden states, outside the engine.
"""

from __future__ import annotations

from typing import Any

import torch

from hitenter.models.trace import Trace


def _qkv(model: Any, tr: Trace, layer_index: int, upto: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, H, d], k and v [T, Hkv, d] of the first ``upto`` tokens at the input of a layer, in fp32."""
    layer = model.layers[layer_index]
    x = tr.hidden[layer_index, :upto].to(model.dtype)
    rope = model.layer_rope(layer)
    cos_sin = None if rope is None else rope.table(torch.arange(upto), x.dtype)
    with torch.inference_mode():
        q, k, v = layer.qkv_heads(x, rope, cos_sin)
    return q.float(), k.float(), v.float()


def head_row(model: Any, tr: Trace, layer_index: int, head: int, i: int) -> dict[str, Any]:
    """Query ``i`` in one head: its scores q·k/√d (after the layer's soft-cap) over keys 0..i, their softmax,
    and each key's contribution ``p_k v_k`` to the head's output (its L2 norm, and its share of the sum of norms)."""
    layer = model.layers[layer_index]
    q, k, v = _qkv(model, tr, layer_index, i + 1)
    g = layer.num_heads // layer.num_kv_heads                       # grouped-query attention: a K/V head per group
    kh, vh = k[:, head // g], v[:, head // g]
    scores = kh @ q[i, head] * layer.scale
    if layer.softcap:
        scores = torch.tanh(scores / layer.softcap) * layer.softcap
    window = getattr(layer, "window", None)
    if window is not None:
        scores[: max(0, i - window + 1)] = float("-inf")
    p = torch.softmax(scores, -1)
    contrib = (p[:, None] * vh).norm(dim=-1)
    out = (p[:, None] * vh).sum(0)
    return {"layer": layer_index, "head": head, "index": i, "kv_head": head // g, "scale": float(layer.scale),
            "scores": [float(s) if torch.isfinite(s) else None for s in scores], "probs": p.tolist(),
            "value_norms": contrib.tolist(), "value_share": (contrib / contrib.sum().clamp_min(1e-12)).tolist(),
            "out_norm": float(out.norm())}


def layer_parts(model: Any, tr: Trace, i: int) -> dict[str, Any]:
    """Token ``i``'s residual stream through every layer: x + attention(x) = mid, mid + mlp(mid) = out. The
    attention part is the layer's o_proj of the traced probabilities times its values; the MLP part is the
    layer's own ffn of mid; ``error`` is |in + attention + mlp − the traced out| (their agreement)."""
    rows = []
    for li, layer in enumerate(model.layers):
        q, k, v = _qkv(model, tr, li, i + 1)
        g = layer.num_heads // layer.num_kv_heads
        probs = tr.attentions[li, :, i, : i + 1].float()                       # [H, i + 1]
        o = torch.einsum("hk,khd->hd", probs, v.repeat_interleave(g, 1)).reshape(1, -1)
        x = tr.hidden[li, i : i + 1].to(model.dtype)
        with torch.inference_mode():
            mid = layer._residual(x, layer.o_proj(o.to(model.dtype)), layer.post_attn_norm)
            h = layer.ffn_norm(mid) if layer.ffn_norm is not None else mid
            out = layer._residual(mid, layer.ffn(h, 1), layer.post_ffw_norm)
        attn, mlp = (mid - x).float()[0], (out - mid).float()[0]
        rows.append({"layer": li, "attention": float(attn.norm()), "mlp": float(mlp.norm()),
                     "error": float((out.float()[0] - tr.hidden[li + 1, i]).abs().max()),
                     "scale": float(tr.hidden[li + 1, i].abs().max())})
    return {"index": i, "layers": rows}


HEAD_KINDS = ("previous-token", "first-token sink", "self", "content")


def head_kinds(attentions: torch.Tensor) -> dict[str, Any]:
    """What each head does, measured on one trace's probabilities ``attentions`` [L, H, T, T]: for every query
    q >= 2, the weight it puts on the token just before it, on the first token (the sink that soaks up
    spare attention), on itself, and on the rest (earlier content); a head's kind is the largest of the four
    means over the queries. Returns the kinds [L][H] and the four shares [L][H][4] in HEAD_KINDS order."""
    a = attentions.float()
    t = a.shape[-1]
    if t < 3:
        return {"kinds": [["content"] * a.shape[1] for _ in range(a.shape[0])], "shares": None, "queries": 0}
    q = torch.arange(2, t)
    prev, sink, self_ = a[:, :, q, q - 1], a[:, :, q, 0], a[:, :, q, q]
    rest = (1 - prev - sink - self_).clamp_min(0)
    shares = torch.stack([prev, sink, self_, rest], -1).mean(2)                 # [L, H, 4]
    kinds = [[HEAD_KINDS[int(k)] for k in row] for row in shares.argmax(-1)]
    return {"kinds": kinds, "shares": (shares * 1e3).round().div(1e3).tolist(), "queries": t - 2}


def strongest_content_head(attentions: torch.Tensor, kinds: list[list[str]], i: int) -> dict[str, Any] | None:
    """Query ``i``'s strongest look at one earlier token (not the first token, not itself) among the content
    heads (all heads if there are none), so the view opens on a head that reads meaning, not on a
    previous-token or sink head: layer, head, key, weight and the head's kind."""
    rows = attentions[:, :, i, : i + 1].float()
    if i < 2:
        return None
    inner = rows[:, :, 1:i].clone()                                             # keys 1 .. i-1
    content = torch.tensor([[k == "content" for k in row] for row in kinds])
    if content.any():
        inner[~content] = -1
    flat = int(inner.reshape(-1).argmax())
    layer, rest = divmod(flat, inner.shape[1] * inner.shape[2])
    head, k = divmod(rest, inner.shape[2])
    return {"layer": layer, "head": head, "k": k + 1, "p": float(rows[layer, head, k + 1]),
            "kind": kinds[layer][head]}
