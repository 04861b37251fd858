"""MTPHead: a Qwen3.5 / 3.6 file's own multi-token-prediction block (``nextn_predict_layers`` = 1, the
block ``blk.{n}`` that convert_hf_to_gguf appends after the ``n`` trunk layers), as llama.cpp's
src/models/qwen35.cpp / qwen35moe.cpp ``graph_mtp`` runs it:

    x   = eh_proj([rms(embed(token), enorm) | rms(h, hnorm)])     # concat: the token's half first
    x   = x + attn(rms(x, attn_norm))                              # a full gated-attention block with
    x   = x + ffn(rms(x, post_attention_norm))                     # its own KV (the trunk's attention)
    out = rms(x, shared_head_norm or output_norm)                  # the next row's ``h`` when chaining
    logits = head(out)                                             # shared_head_head or the trunk's head

Row ``p`` takes the token at position ``p`` and ``h``, the trunk's hidden state after its final norm at
position ``p - 1`` (zeros for ``p = 0``): the state that predicted that token. Its logits predict the token
at ``p + 1``. The attention is the trunk's attention layer (models/hybrid.py AttentionMixer: QK-norm,
partial RoPE at ``p``, the sigmoid output gate) over the head's own one-layer paged KV cache; the FFN is
the trunk's (dense SwiGLU for qwen35, experts plus the gated shared expert for qwen35moe). The token
embedding, RoPE table and LM head are the target model's (``nextn.embed_tokens`` /
``nextn.shared_head_head`` replace them where the file has them).

``load_mtp_head(path, target)`` reads only the block's tensors from the file, in the target's weight
format (its GGUF blocks, else fp32 made into the target's dtype).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.kernels.arena import drop_mapped_pages
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.block_linear import BlockLinear, own_block_bytes
from hitenter.models.families.qwen35 import split_gate_up
from hitenter.models.gguf import load_tensors, open_gguf, read_gguf_metadata
from hitenter.models.hybrid import FFN, AttentionMixer
from hitenter.models.layers import RMSNorm, finish_logits, has_dense_gemms, make_linear, pad_rows
from hitenter.models.loader import block_weights

MTP_ARCHS = ("qwen35", "qwen35moe")
_NEXTN = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")


class MTPHead(nn.Module):
    """The MTP block of a loaded target (see the module docstring). `w`: the block's tensors under their
    file names (prefix ``blk.{n}.``)."""

    def __init__(self, target: nn.Module, w: dict[str, Any], prefix: str) -> None:
        super().__init__()
        cfg: ModelConfig = target.config
        dtype = target.dtype
        self.config, self.dtype = cfg, dtype
        # the target's modules, held outside the module tree (not this head's weights: never copied)
        self.shared: dict[str, Any] = {"rope": target.rope, "embed": target.embed, "norm": target.norm,
                                       "head": target.head}
        self.embed_scale = getattr(target, "embed_scale", 1.0)
        own_embed = w.get(prefix + "nextn.embed_tokens.weight")
        self.own_embed = None if own_embed is None else nn.Embedding.from_pretrained(own_embed.float().to(dtype))
        eps = cfg.rms_norm_eps
        self.enorm = RMSNorm(w[prefix + "nextn.enorm.weight"], eps, dtype)
        self.hnorm = RMSNorm(w[prefix + "nextn.hnorm.weight"], eps, dtype)
        self.eh_proj = make_linear(w[prefix + "nextn.eh_proj.weight"], None, dtype)
        self.attn_norm = RMSNorm(w[prefix + "attn_norm.weight"], eps, dtype)
        self.attn = AttentionMixer(cfg, w, prefix, dtype)
        self.ffn_norm = RMSNorm(w[prefix + "ffn_norm.weight"], eps, dtype)
        self.ffn = FFN(cfg, w, prefix, dtype)
        norm = w.get(prefix + "nextn.shared_head_norm.weight")
        self.own_norm = None if norm is None else RMSNorm(norm, eps, dtype)
        head = w.get(prefix + "nextn.shared_head_head.weight")
        self.own_head = None if head is None else make_linear(head, None, dtype)
        # rows padded to a multiple of 8 only where a linear needs it for batch invariance (dense GEMMs), as
        # the target pads: the native block kernels give a row the same bits at any row count, and an MTP
        # step is one row (padding it to 8 multiplies the LM head's work)
        self.padded = getattr(target, "batch_invariant", True) and (
            has_dense_gemms(self) or bool(getattr(target, "dense_gemms", False)))

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def allocate_cache(self, num_blocks: int, block_size: int, kv_dtype: torch.dtype) -> torch.Tensor:
        """The head's one-layer paged KV cache (the trunk's attention layer shape)."""
        first = self.config.layer_types.index("attention")
        return allocate_kv_caches(self.config, num_blocks, block_size, kv_dtype,
                                  layers=[i == first for i in range(self.config.num_layers)])[0]

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return pad_rows(x) if self.padded else x

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.own_embed is not None:
            return self.own_embed(ids)
        x = self.shared["embed"](ids)
        return x * self.embed_scale if self.embed_scale != 1.0 else x

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, cache: torch.Tensor) -> torch.Tensor:
        """Rows ``(token, h)`` at ``positions`` -> the block's output after its final norm, `[T, H]` (each
        row's next ``h`` when chaining; ``compute_logits`` scores it). Writes the rows' K/V into `cache`."""
        n = int(input_ids.shape[0])
        ids, pos = self._pad(input_ids.long()), self._pad(positions.long())
        h = self._pad(hidden_in.to(self.dtype))
        e = self._embed(ids).to(self.dtype)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))
        rope = self.shared["rope"]
        cos_sin = rope.table(pos, x.dtype)
        x = x + self.attn(self.attn_norm(x), attn, cache, rope, cos_sin, n)
        x = x + self.ffn(self.ffn_norm(x), n)
        norm = self.own_norm if self.own_norm is not None else self.shared["norm"]
        return norm(x)[:n]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]` of the head's output rows."""
        n = hidden.shape[0]
        head = self.own_head if self.own_head is not None else self.shared["head"]
        return finish_logits(self.config, head(self._pad(hidden.to(self.dtype)))[:n].float())


def prepare_block(w: dict[str, Any], prefix: str, cfg: ModelConfig) -> dict[str, Any]:
    """The block's tensors under the names hybrid.py's parts read: post_attention_norm -> ffn_norm; a fused
    attn_qkv split into attn_q / k / v; merged experts ffn_gate_up_exps split into gate and up."""
    p = prefix
    if p + "post_attention_norm.weight" in w:
        w[p + "ffn_norm.weight"] = w.pop(p + "post_attention_norm.weight")
    if p + "attn_qkv.weight" in w:
        q, kv = 2 * cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qkv = w.pop(p + "attn_qkv.weight")
        for name, start, size in (("attn_q", 0, q), ("attn_k", q, kv), ("attn_v", q + kv, kv)):
            w[p + name + ".weight"] = qkv.narrow(0, start, size)
    if p + "ffn_gate_up_exps.weight" in w:
        w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = split_gate_up(w.pop(p + "ffn_gate_up_exps.weight"))
    return w


def mtp_block_count(path: str | os.PathLike[str]) -> int:
    """The file's ``nextn_predict_layers`` (0 where it has none)."""
    meta = read_gguf_metadata(open_gguf(path))
    return int(meta.get(f"{meta.get('general.architecture')}.nextn_predict_layers", 0) or 0)


def load_mtp_head(path: str | os.PathLike[str], target: nn.Module) -> MTPHead:
    """The MTP block of the file `target` was loaded from. ModelLoadError where the file has none, its
    family has no MTP support here, or a tensor is missing."""
    cfg: ModelConfig = target.config
    if cfg.architecture not in MTP_ARCHS:
        raise ModelLoadError(f"speculative_method 'mtp': {cfg.architecture} models have no MTP drafter here "
                             f"(supported: {', '.join(MTP_ARCHS)})")
    reader = open_gguf(path)
    meta = read_gguf_metadata(reader)
    nextn = int(meta.get(f"{cfg.architecture}.nextn_predict_layers", 0) or 0)
    if nextn < 1:
        raise ModelLoadError(f"speculative_method 'mtp': {os.fspath(path)} has no MTP block "
                             f"({cfg.architecture}.nextn_predict_layers is 0)")
    prefix = f"blk.{cfg.num_layers}."
    names = {t.name for t in reader.tensors if t.name.startswith(prefix)}
    missing = [n for n in _NEXTN + ("attn_norm.weight", "post_attention_norm.weight") if prefix + n not in names]
    if missing:
        raise ModelLoadError(f"speculative_method 'mtp': {os.fspath(path)} lacks {prefix}{missing[0]}")
    blocks = any(isinstance(m, BlockLinear) for m in target.modules())
    w = block_weights(reader, names) if blocks else load_tensors(reader, names)
    head = MTPHead(target, prepare_block(dict(w), prefix, cfg), prefix)
    own_block_bytes(head)
    drop_mapped_pages(reader.data.ctypes.data, reader.data.nbytes)
    return head.eval()
