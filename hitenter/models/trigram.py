"""The toy trigram model: a language model small enough to read, served by the real engine.

It is "trained" at load time by counting, over ``hitenter/data/trigram_corpus.txt`` (45 sentences
from an infrastructure team's chat) tokenized with the SmolLM2 tokenizer, how often each token ``t``
follows each pair of tokens ``(t-2, t-1)``. Each sentence is counted as ``[END] + tokens + [END]``
(``END`` = the tokenizer's end-of-sequence token), so a prompt's first token is looked up after END.

It predicts from the last two tokens only, and it runs through the same engine loop as a real model:

* Its "KV cache" stores token ids. Its ModelConfig has 1 layer, 1 KV head and head_dim 2, so the
  engine allocates a tiny paged cache ``[2, num_blocks, block_size, 1, 2]``; a token id is written
  as ``(id // 256, id % 256)`` (both exact in fp32, bf16 or fp16) into its slot (``slot_mapping``).
* ``forward`` writes each new token into its slot, then reads the current token and the one before
  it back **through the block table**, and returns them as the hidden state ``[T, 2] = (t-2, t-1)``.
* ``compute_logits`` turns each pair into log-probabilities: add-k smoothed counts
  ``log((c(t) + k) / (n + k * |corpus vocab|))`` over the tokens the corpus contains. When the pair
  was never seen it **backs off** to the bigram counts of ``t-1`` alone, then to unigram counts.
  Tokens that never occur in the corpus get a logit of -10000 (probability exactly 0): the model
  can only ever say words it has read.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.models.attention import AttentionMetadata, write_kv

CORPUS_PATH = Path(__file__).resolve().parent.parent / "data" / "trigram_corpus.txt"
ADD_K = 1e-3            # add-k smoothing: every corpus token keeps a sliver of probability
NEVER = -1.0e4          # logit of a token that never occurs in the corpus (softmax -> exactly 0)
CONTEXT_LENGTH = 2048


class TrigramLM(torch.nn.Module):
    """Counts of (t-2, t-1) -> t, with the engine's model interface (see the module docstring)."""

    def __init__(self, lines: list[list[int]], vocab_size: int, end_id: int, add_k: float = ADD_K) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.end_id = end_id
        self.add_k = add_k
        self.trigrams: dict[tuple[int, int], Counter[int]] = {}
        self.bigrams: dict[int, Counter[int]] = {}
        self.unigrams: Counter[int] = Counter()
        for ids in lines:
            seq = [end_id, *ids, end_id]
            self.unigrams.update(seq[1:])
            for a, b in zip(seq, seq[1:], strict=False):
                self.bigrams.setdefault(a, Counter())[b] += 1
            for a, b, c in zip(seq, seq[1:], seq[2:], strict=False):
                self.trigrams.setdefault((a, b), Counter())[c] += 1
        self.corpus_vocab = torch.tensor(sorted(set(self.unigrams) | {end_id}), dtype=torch.long)

    # ---- what the page shows --------------------------------------------------------------------
    def counts_for(self, t2: int, t1: int) -> tuple[str, Counter[int]]:
        """The counts the model uses after (t2, t1): ("trigram" | "bigram" | "unigram", counts)."""
        if (t2, t1) in self.trigrams:
            return "trigram", self.trigrams[(t2, t1)]
        if t1 in self.bigrams:
            return "bigram", self.bigrams[t1]
        return "unigram", self.unigrams

    def lookup(self, t2: int, t1: int) -> dict[str, Any]:
        """The trigram table's row for the pair: counts best first; an empty row when never seen.

        ``backoff`` names the table the model really used and ``backoff_counts`` holds its row.
        """
        row = self.trigrams.get((t2, t1), Counter())
        level, used = self.counts_for(t2, t1)
        return {
            "pair": [t2, t1],
            "counts": sorted(row.items(), key=lambda kv: (-kv[1], kv[0])),
            "total": sum(row.values()),
            "seen": bool(row),
            "backoff": level,
            "backoff_counts": sorted(used.items(), key=lambda kv: (-kv[1], kv[0]))[:20],
            "backoff_total": sum(used.values()),
        }

    # ---- the engine's interface --------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        cache = kv_caches[0]                                       # [2, 1, num_blocks, block_size, 2]
        ids = input_ids.to(torch.long)
        kv = torch.stack([ids // 256, ids % 256], dim=-1).unsqueeze(1).to(cache.dtype)   # [T, 1, 2]
        write_kv(cache, kv, kv, attn.slot_mapping)                 # each new token into its own slot
        keys = cache[0].reshape(-1, 2)                             # [slots, 2]
        bs = attn.block_size
        hidden = torch.empty(len(ids), 2, dtype=torch.float32)
        pos = positions.tolist()
        qsl = attn.query_start_loc
        for s, table in enumerate(attn.block_tables):
            for row in range(qsl[s], qsl[s + 1]):
                p = pos[row]
                t1 = self._read(keys, table, p, bs)                # the current token, from the cache
                t2 = self._read(keys, table, p - 1, bs) if p > 0 else self.end_id
                hidden[row, 0], hidden[row, 1] = t2, t1
        return hidden

    @staticmethod
    def _read(keys: torch.Tensor, table: list[int], p: int, bs: int) -> int:
        hi, lo = keys[table[p // bs] * bs + p % bs].tolist()
        return int(hi) * 256 + int(lo)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = torch.full((hidden.shape[0], self.vocab_size), NEVER, dtype=torch.float32)
        nv = len(self.corpus_vocab)
        for r, (t2, t1) in enumerate(hidden.to(torch.long).tolist()):
            _, counts = self.counts_for(t2, t1)
            denom = sum(counts.values()) + self.add_k * nv
            out[r, self.corpus_vocab] = math.log(self.add_k / denom)
            if counts:
                toks = torch.tensor(list(counts.keys()), dtype=torch.long)
                c = torch.tensor(list(counts.values()), dtype=torch.float64)
                out[r, toks] = torch.log((c + self.add_k) / denom).to(torch.float32)
        return out


def read_corpus(path: Path = CORPUS_PATH) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@lru_cache(maxsize=2)
def _load(corpus: str) -> tuple[TrigramLM, ModelConfig, Any]:
    from hitenter.models.registry import resolve_model
    from hitenter.tokenizer.shared import shared_tokenizer

    tok = shared_tokenizer(resolve_model("smollm2-135m-instruct"))   # the default model's, when it is loaded
    end = tok.eos_token_id
    lines = [tok.encode(s) for s in read_corpus(Path(corpus))]
    model = TrigramLM(lines, tok.vocab_size, end).eval()
    cfg = ModelConfig(architecture="trigram", vocab_size=tok.vocab_size, hidden_size=2, intermediate_size=1,
                      num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2, rope_theta=1.0,
                      rms_norm_eps=1e-6, context_length=CONTEXT_LENGTH, tie_word_embeddings=False,
                      name="trigram")
    return model, cfg, tok


def load_trigram(ref: str = "trigram") -> tuple[TrigramLM, ModelConfig, Any]:
    """``"trigram"`` (the bundled corpus) or ``"trigram:/path/to/corpus.txt"`` -> (module, config, tokenizer)."""
    _, _, rest = ref.partition(":")
    return _load(str(Path(rest).resolve() if rest else CORPUS_PATH))
