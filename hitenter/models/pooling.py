"""Pooling a sequence's final hidden states into one vector, as llama.cpp's embedding mode does
(llama-graph.cpp build_pooling, then build_dense_out), for encoders (models/encoder.py) and decoders alike.

The kind is the file's `{arch}.pooling_type` (ModelConfig.pooling; `effective_pooling` gives the default
where the file says nothing: "mean" for a decoder, as hitenter always pooled them, "none" for an encoder,
as llama.cpp):

    none  every token's row (no single vector: the server refuses to embed with it)
    mean  the mean of the sequence's rows
    cls   the first row;  last: the last row (Qwen3-Embedding)
    rank  a relevance score: the first row (the last for a causal model: Qwen3-Reranker), then the classifier
          head where the file has one: tanh(cls . x + cls.bias) (`cls.weight`), then `cls.output` (+ bias),
          and for qwen3 a softmax over its outputs (yes / no: the score is P(yes))

then, where the file has them (sentence-transformers Dense modules, EmbeddingGemma), `dense_2` (+ bias) and
`dense_3`. `Pooler(cfg, w)(hidden, lengths)` gives `[sequences, out_features]` in fp32, not normalized (the
API normalizes: `l2_normalize`). `head_shapes` names the optional head tensors a file may hold, with their
shapes, for the loader.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hitenter.config import ModelConfig

SOFTMAX_RANK_ARCHS = ("qwen3", "qwen3vl")      # llama.cpp: a softmax over cls.output's outputs


def effective_pooling(cfg: ModelConfig) -> str:
    """The pooling a model runs: the file's, else "mean" for a decoder and "none" for an encoder."""
    return cfg.pooling or ("mean" if cfg.causal else "none")


def head_shapes(cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
    """Torch-order shapes of the pooling head tensors present in `names` (the rows of `cls.output` and
    `dense_*` are the file's own: -1 means any)."""
    h = cfg.hidden_size
    known = {"cls.weight": (h, h), "cls.bias": (h,), "cls.output.weight": (-1, h), "cls.output.bias": (-1,),
             "dense_2.weight": (-1, h), "dense_2.bias": (-1,), "dense_3.weight": (h, -1)}
    return {n: s for n, s in known.items() if n in names}


def _dense(w: dict[str, Any], name: str) -> torch.Tensor | None:
    t = w.get(name)
    if t is None:
        return None
    return (t if isinstance(t, torch.Tensor) else t.dequantize()).float().contiguous()


class Pooler(nn.Module):
    """The model's pooling and heads (see the module docstring); fp32 whatever the weights' dtype."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any]) -> None:
        super().__init__()
        self.kind = effective_pooling(cfg)
        self.causal = cfg.causal
        self.softmax = cfg.architecture in SOFTMAX_RANK_ARCHS
        self.cls, self.cls_b = _dense(w, "cls.weight"), _dense(w, "cls.bias")
        self.out, self.out_b = _dense(w, "cls.output.weight"), _dense(w, "cls.output.bias")
        self.dense2, self.dense2_b = _dense(w, "dense_2.weight"), _dense(w, "dense_2.bias")
        self.dense3 = _dense(w, "dense_3.weight")
        self.hidden_size = cfg.hidden_size

    @property
    def out_features(self) -> int:
        """The size of one pooled vector (rank: the classifier's outputs, 1 without cls.output)."""
        if self.kind == "rank":
            return 1 if self.out is None else int(self.out.shape[0])
        if self.dense3 is not None:
            return int(self.dense3.shape[0])
        return int(self.dense2.shape[0]) if self.dense2 is not None else self.hidden_size

    def forward(self, hidden: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """`[len(lengths), out_features]` from the packed rows `hidden` `[sum(lengths), H]` (kind "none":
        the rows themselves, `[sum(lengths), H]`)."""
        x = hidden.float()
        if self.kind == "none":
            return x
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        if self.kind == "mean":
            pooled = torch.stack([x[a:b].mean(dim=0) for a, b in zip(starts, starts[1:], strict=False)])
        else:
            last = self.kind == "last" or (self.kind == "rank" and self.causal)
            rows = [b - 1 if last else a for a, b in zip(starts, starts[1:], strict=False)]
            pooled = x[torch.tensor(rows, dtype=torch.long)]
        if self.kind == "rank":
            pooled = self._classify(pooled)
        return self._dense_out(pooled)

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        if self.cls is not None:
            x = torch.tanh(nn.functional.linear(x, self.cls, self.cls_b))
        if self.out is not None:
            x = nn.functional.linear(x, self.out, self.out_b)
        return torch.softmax(x, dim=-1) if self.softmax else x

    def _dense_out(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense2 is not None:
            x = nn.functional.linear(x, self.dense2, self.dense2_b)
        if self.dense3 is not None:
            x = nn.functional.linear(x, self.dense3)
        return x


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm (llama.cpp's common_embd_normalize with norm 2; a zero row stays zero)."""
    return torch.nn.functional.normalize(x.float(), dim=-1)
