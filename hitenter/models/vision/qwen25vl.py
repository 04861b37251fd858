"""The Qwen2-VL and Qwen2.5-VL vision transformer and patch merger, from an mmproj file's tensors, as
llama.cpp's clip_graph_qwen2vl builds them (tools/mtmd/models/qwen2vl.cpp; positions and windows from
clip.cpp's set_input for PROJECTOR_TYPE_QWEN2VL / QWEN25VL):

    x = conv(pixels, v.patch_embd.weight) + conv(pixels, v.patch_embd.weight.1)    (qwen_vit.py)
    x in merge order (2 x 2 units), optionally v.pre_ln
    qwen2.5vl_merger with clip.vision.n_wa_pattern = n > 0: the merge units regrouped window by window
        (windows of 112 / patch / 2 units per side, the last ones cut by the grid), rows and positions alike
    per layer i:  x = x + attn_out(attention(rope(q), rope(k), v))   over norm(x, ln1); Q/K/V with biases;
                      2D vision RoPE by each patch's (row, column); layers with (i + 1) % n != 0 attend
                      within their window only, the others (and every Qwen2-VL layer) to all patches
                  x = x + ffn_down(act(ffn_gate(h)) * ffn_up(h))   h = norm(x, ln2) (Qwen2-VL: no gate)
    x = norm(x, v.post_ln)      (Qwen2.5-VL's merger.ln_q)
    y = mm.2(GELU(mm.0(4 consecutive rows concatenated)))                          -> [tokens, projection_dim]
    rows put back from window order into merge-unit order (row-major over the token grid)

norm is RMSNorm for qwen2.5vl_merger, LayerNorm for qwen2vl_merger; act from clip.use_silu / use_gelu
(Qwen2.5-VL: SiLU, Qwen2-VL: quick GELU).

Contract: QwenVLVision(cfg, tensors)(pixels [3, H, W] float32, H and W multiples of 2 x patch) ->
[(H / 2p) x (W / 2p), projection_dim] float32, the token grid row-major. Pure function of the pixels.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from hitenter.errors import ModelLoadError
from hitenter.models.vision import qwen_vit as vit
from hitenter.models.vision.mmproj import MmprojConfig

PROJECTORS = ("qwen2vl_merger", "qwen2.5vl_merger")
WINDOW_PIXELS = 112   # clip.cpp: attn_window_size when the file does not set it (Qwen2.5-VL never does)


class _Layer:
    """One block's weights by llama.cpp's names (ffn_up / ffn_down swapped where stored the old way)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor], i: int) -> None:
        d, p = cfg.hidden, f"v.blk.{i}."
        self.ln1 = (vit.take(tensors, p + "ln1.weight", (d,)), vit.take(tensors, p + "ln1.bias", (d,), False))
        self.ln2 = (vit.take(tensors, p + "ln2.weight", (d,)), vit.take(tensors, p + "ln2.bias", (d,), False))
        self.q, self.k, self.v = (vit.take_linear(tensors, p + f"attn_{n}", (d, d)) for n in "qkv")
        self.out = vit.take_linear(tensors, p + "attn_out", (d, d))
        up, down = vit.take_linear(tensors, p + "ffn_up", None), vit.take_linear(tensors, p + "ffn_down", None)
        if down[0].shape[-1] == d and up[0].shape[-1] != d:   # clip.cpp is_ffn_swapped
            up, down = down, up
        self.up, self.down = up, down
        gate_w = tensors.get(p + "ffn_gate.weight")
        self.gate = None if gate_w is None else (gate_w, tensors.get(p + "ffn_gate.bias"))
        for name, (w, _) in (("ffn_up", up), ("ffn_down", down)) + ((("ffn_gate", self.gate),) if self.gate else ()):
            want = (d, cfg.ffn) if name == "ffn_down" else (cfg.ffn, d)
            if tuple(w.shape) != want:
                raise ModelLoadError(f"mmproj layer {i}: {name} has shape {tuple(w.shape)}, expected {want}")


def windows(uh: int, uw: int, grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Window grouping of a uh x uw merge-unit grid (clip.cpp, QWEN25VL): (order [units]: the unit at each
    window-order slot, window id [units] of each slot)."""
    order, wid = [], []
    for y in range(0, uh, grid):
        for x in range(0, uw, grid):
            w = len(set(wid))
            for dy in range(min(grid, uh - y)):
                for dx in range(min(grid, uw - x)):
                    order.append((y + dy) * uw + x + dx)
                    wid.append(w)
    return torch.tensor(order), torch.tensor(wid)


class QwenVLVision(nn.Module):
    """The Qwen2-VL / Qwen2.5-VL tower and merger (see the module docstring)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if cfg.projector not in PROJECTORS:
            raise ModelLoadError(f"QwenVLVision cannot run the projector {cfg.projector!r}")
        d, ps = cfg.hidden, cfg.patch_size
        self.cfg, self.rms = cfg, cfg.projector == "qwen2.5vl_merger"
        self.patch_w = (vit.take(tensors, "v.patch_embd.weight", (d, 3, ps, ps)),
                        vit.take(tensors, "v.patch_embd.weight.1", (d, 3, ps, ps)))
        if "v.patch_embd.bias" in tensors:
            raise ModelLoadError("a Qwen2-VL mmproj has no patch bias (v.patch_embd.bias)")
        self.pre_ln = self._opt_norm(tensors, "v.pre_ln", d)
        self.layers = [_Layer(cfg, tensors, i) for i in range(cfg.layers)]
        self.post_ln = self._opt_norm(tensors, "v.post_ln", d)
        fc1 = vit.take(tensors, "mm.0.weight")
        if fc1.ndim != 2 or fc1.shape[1] != 4 * d:
            raise ModelLoadError(f"mmproj tensor 'mm.0.weight' has shape {tuple(fc1.shape)}, expected (*, {4 * d})")
        self.fc1 = vit.take_linear(tensors, "mm.0", (fc1.shape[0], 4 * d))
        self.fc2 = vit.take_linear(tensors, "mm.2", (cfg.projection_dim, fc1.shape[0]))
        self.act = vit.ACTIVATIONS[cfg.activation]
        self.merger_act = vit.ACTIVATIONS["gelu"]
        self.window_units = WINDOW_PIXELS // ps // 2

    @staticmethod
    def _opt_norm(tensors: dict[str, torch.Tensor], name: str, d: int) -> tuple | None:
        w = vit.take(tensors, name + ".weight", (d,), required=False)
        return None if w is None else (w, vit.take(tensors, name + ".bias", (d,), required=False))

    def _norm(self, x: torch.Tensor, wb: tuple) -> torch.Tensor:
        return vit.norm(x, wb[0], wb[1], self.cfg.eps, self.rms)

    def _block(self, x: torch.Tensor, layer: _Layer, cos_sin: tuple[torch.Tensor, torch.Tensor],
               windows: list[tuple[int, int]] | None) -> torch.Tensor:
        n, heads = x.shape[0], self.cfg.heads
        h = self._norm(x, layer.ln1)
        q, k, v = (vit.linear(h, *lin).view(n, heads, -1) for lin in (layer.q, layer.k, layer.v))
        q, k = vit.apply_rope(q, *cos_sin), vit.apply_rope(k, *cos_sin)
        x = x + vit.linear(vit.attention(q, k, v, windows), *layer.out)
        return x + vit.mlp(self._norm(x, layer.ln2), layer.up, layer.gate, layer.down, self.act)

    def _layout(self, ph: int, pw: int) -> tuple[torch.Tensor, list[tuple[int, int]] | None, torch.Tensor]:
        """(patch order: row-major patch index at each slot, the windows' slot ranges or None, unit order of
        the tower's output rows)."""
        uh, uw = ph // 2, pw // 2
        per_unit = vit.merge_order(ph, pw).view(uh * uw, 4)
        if self.cfg.projector != "qwen2.5vl_merger" or self.cfg.n_wa_pattern <= 0:
            return per_unit.reshape(-1), None, torch.arange(uh * uw)
        order, wid = windows(uh, uw, self.window_units)
        counts = torch.bincount(wid).tolist()
        bounds = [4 * sum(counts[:i]) for i in range(len(counts) + 1)]
        return per_unit[order].reshape(-1), list(itertools.pairwise(bounds)), order

    def encode(self, pixels: torch.Tensor, layout: tuple | None = None) -> torch.Tensor:
        """The tower's last rows after post_ln, in the tower's slot order: [patches, hidden]."""
        ph, pw = vit.patch_grid(self.cfg, pixels)
        patch_order, windows, _ = layout or self._layout(ph, pw)
        x = vit.patch_embed(pixels, *self.patch_w, self.cfg.patch_size)[patch_order]
        if self.pre_ln is not None:
            x = self._norm(x, self.pre_ln)
        cos_sin = vit.rope_tables(patch_order // pw, patch_order % pw, self.cfg.hidden // self.cfg.heads)
        wa = self.cfg.n_wa_pattern
        for i, layer in enumerate(self.layers):
            full = windows is None or (i + 1) % wa == 0
            x = self._block(x, layer, cos_sin, None if full else windows)
        return x if self.post_ln is None else self._norm(x, self.post_ln)

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        layout = self._layout(*vit.patch_grid(self.cfg, pixels))
        y = vit.merger(self.encode(pixels, layout), self.fc1, self.fc2, self.merger_act)
        unit_order = layout[2]
        return torch.empty_like(y).index_copy_(0, unit_order, y)
