"""Inside one layer after attention, for the playground: the norm in front of the feed-forward block and the
block itself for one token, from a kept trace (playground_trace.py) and the layer's own modules.

mid = x + attention(x) (as playground_heads.layer_parts), h = ffn_norm(mid) (RMSNorm: mid / rms(mid) * weight),
then gate, up = gate_up(h); a = act(gate) * up (one value per hidden neuron); out = down(a); mid + out is the
traced stream after the layer (``error`` says how close). Mixture-of-experts layers are refused (one FFN here).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hitenter.models.trace import Trace
from hitenter.server.playground_heads import _qkv

TOP_NEURONS = 16
HIST_BINS = 41


def _stats(v: torch.Tensor) -> dict[str, float]:
    v = v.float()
    return {"mean": float(v.mean()), "rms": float(v.pow(2).mean().sqrt()), "max_abs": float(v.abs().max())}


def ffn_view(model: Any, tr: Trace, li: int, i: int) -> dict[str, Any]:
    """Token ``i`` at layer ``li``: the norm's input and output, the neurons' activations, the block's output."""
    layer = model.layers[li]
    if getattr(layer, "moe", None) is not None or not hasattr(layer, "gate_up"):
        raise ValueError(f"layer {li}: a mixture of experts (or no dense gated FFN): not drawn here")
    q, k, v = _qkv(model, tr, li, i + 1)
    g = layer.num_heads // layer.num_kv_heads
    probs = tr.attentions[li, :, i, : i + 1].float()
    o = torch.einsum("hk,khd->hd", probs, v.repeat_interleave(g, 1)).reshape(1, -1)
    x = tr.hidden[li, i : i + 1].to(model.dtype)
    with torch.inference_mode():
        mid = layer._residual(x, layer.o_proj(o.to(model.dtype)), layer.post_attn_norm)
        h = layer.ffn_norm(mid) if layer.ffn_norm is not None else mid
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if layer.cfg.activation == "gelu_tanh" else F.silu(gate)
        a = (act * up).float()[0]
        out = layer._residual(mid, layer.down((act * up).to(model.dtype)), layer.post_ffw_norm)
    mag = a.abs()
    top = mag.topk(min(TOP_NEURONS, a.numel())).indices
    fire = float((mag > 0.1 * mag.max()).float().mean())
    lo, hi = float(a.min()), float(a.max())
    hist = torch.histc(a, HIST_BINS, lo, hi) if hi > lo else torch.zeros(HIST_BINS)
    norm = layer.ffn_norm
    return {"layer": li, "index": i, "ffn_dim": int(a.numel()), "activation": layer.cfg.activation or "silu",
            "norm": None if norm is None else {"kind": type(norm).__name__, "eps": float(getattr(norm, "eps", 0.0)),
                                               "before": _stats(mid[0]), "after": _stats(h[0]),
                                               "weight": _stats(norm.weight.detach()),
                                               "before_head": mid[0, :48].float().tolist(), "after_head": h[0, :48].float().tolist()},
            "top": [{"neuron": int(n), "gate": float(gate[0, n]), "act": float(act[0, n]), "up": float(up[0, n]),
                     "a": float(a[n])} for n in top],
            "fire_share": fire, "hist": hist.tolist(), "hist_range": [lo, hi],
            "out_norm": float((out - mid).float().norm()), "mid_norm": float(mid.float().norm()),
            "error": float((out.float()[0] - tr.hidden[li + 1, i]).abs().max())}
