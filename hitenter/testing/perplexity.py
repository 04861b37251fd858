"""Quality checks for weight formats: perplexity on the bundled English text and greedy continuations.

Both drive a decoder.CausalLM directly (one sequence at a time, contiguous KV blocks), so they compare weight
formats without the engine in the way."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.nn import functional as F

from hitenter.models.attention import AttentionMetadata, allocate_kv_caches

TEXT_PATH = Path(__file__).resolve().parent.parent / "data" / "ppl_english.txt"
BLOCK = 16


def english_text() -> str:
    """The bundled ~2,700-word encyclopedia-style English text (written for this project)."""
    return TEXT_PATH.read_text(encoding="utf-8")


class _Seq:
    """One sequence's KV cache; `step(ids)` feeds new tokens and returns their fp32 logits."""

    def __init__(self, model: torch.nn.Module, max_len: int, kv_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.blocks = -(-max_len // BLOCK)
        self.caches = allocate_kv_caches(model.config, self.blocks, BLOCK, kv_dtype or model.dtype)
        self.done = 0

    def step(self, ids: list[int], all_logits: bool = True) -> torch.Tensor:
        n, start = len(ids), self.done
        meta = AttentionMetadata([0, n], [start + n], [list(range(self.blocks))],
                                 torch.arange(start, start + n, dtype=torch.long), BLOCK)
        hidden = self.model(torch.tensor(ids), torch.arange(start, start + n), meta, self.caches)
        self.done += n
        return self.model.compute_logits(hidden if all_logits else hidden[-1:])


@torch.inference_mode()
def perplexity(model: torch.nn.Module, ids: list[int], chunk: int = 512, max_tokens: int | None = None,
               kv_dtype: torch.dtype | None = None) -> float:
    """exp(mean NLL) of `ids` (first max_tokens of them), scored in independent windows of `chunk` tokens
    (each window starts a fresh context; its first token is not predicted); the KV cache of `kv_dtype`
    (default the model's dtype)."""
    ids = ids[:max_tokens] if max_tokens else ids
    nll, count = 0.0, 0
    for s in range(0, len(ids) - 1, chunk):
        win = ids[s:s + chunk]
        if len(win) < 2:
            break
        logits = _Seq(model, len(win), kv_dtype).step(win)
        nll += float(F.cross_entropy(logits[:-1], torch.tensor(win[1:]), reduction="sum"))
        count += len(win) - 1
    return math.exp(nll / count)


@torch.inference_mode()
def greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` (prefill, then one token per step)."""
    seq = _Seq(model, len(prompt) + n)
    out: list[int] = []
    logits = seq.step(prompt, all_logits=False)
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = seq.step(out[-1:])
    return out


PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "The largest planet in the solar system is",
    "def fibonacci(n):\n",
    "Photosynthesis is the process by which",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "A lighthouse is a tower that",
    "To make a cup of tea, first",
)
