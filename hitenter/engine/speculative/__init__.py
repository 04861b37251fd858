"""Speculative decoding with identical output: a proposer guesses k tokens, the target scores them in
one pass, greedy acceptance / modified rejection sampling keeps exactly the target's output.

Engine options: ``SpeculativeConfig`` in hitenter/config.py (``speculative_model``, ``speculative_method``,
``num_speculative_tokens``, the most drafted per step), validated there. The draft length adapts per
request to its acceptance and the measured costs (adaptive.py; HITENTER_SPEC_ADAPTIVE=0: always K); a
draft model scores the first HITENTER_DRAFT_VOCAB ids only (draft_head.py, default 32768; 0: all) and
is skipped where prompt lookup finds the last 4+ tokens earlier (HITENTER_DRAFT_LOOKUP=0: never).
Method "mtp" drafts with the target file's own MTP block (mtp.py, hitenter/models/mtp.py).
"""

from __future__ import annotations

from typing import Any

import torch

from hitenter import envs
from hitenter.config import SpeculativeConfig
from hitenter.engine.speculative.adaptive import AdaptiveK
from hitenter.engine.speculative.draft_head import draft_logits, draft_vocab_size
from hitenter.engine.speculative.mtp import MTPProposer
from hitenter.engine.speculative.proposers import DraftModelProposer, NgramProposer
from hitenter.engine.speculative.rejection import greedy_accept, point_mass, rejection_sample
from hitenter.engine.speculative.spec_step import SpecDecoder, SpecDecodeStats, spec_request_stats

__all__ = ["SpecDecoder", "SpecDecodeStats", "spec_request_stats", "build_spec_decoder", "check_vocab_compatible",
           "NgramProposer", "DraftModelProposer", "MTPProposer", "AdaptiveK", "adaptive_k", "rejection_sample", "greedy_accept", "point_mass"]

def check_vocab_compatible(target_tok: Any, draft_tok: Any, target_vocab: int, draft_vocab: int,
                           draft_name: str) -> None:
    """The draft must produce the target's token ids: same logits width and the same token bytes."""
    if target_vocab != draft_vocab:
        raise ValueError(f"speculative_model: {draft_name!r} has a vocabulary of {draft_vocab} logits, the target "
                         f"has {target_vocab}; the draft must share the target's tokenizer")
    if target_tok.vocab_size != draft_tok.vocab_size:
        raise ValueError(f"speculative_model: {draft_name!r} has {draft_tok.vocab_size} tokens, the target's "
                         f"tokenizer has {target_tok.vocab_size}; the draft must share the target's tokenizer")
    for t in range(target_tok.vocab_size):
        if target_tok.token_bytes(t) != draft_tok.token_bytes(t):
            raise ValueError(f"speculative_model: {draft_name!r} tokenizes differently from the target (token {t}: "
                             f"{draft_tok.token_bytes(t)!r} vs {target_tok.token_bytes(t)!r}); the draft must share "
                             "the target's tokenizer")


def build_spec_decoder(cfg: SpeculativeConfig, tokenizer: Any, vocab_size: int, max_model_len: int,
                       num_blocks: int, block_size: int, dtype: torch.dtype, load_dtype: str = "auto",
                       quantization: str | None = None, kv_dtype: torch.dtype | None = None,
                       target: torch.nn.Module | None = None, target_path: str | None = None,
                       prefix_caching: bool = True) -> SpecDecoder | None:
    """The engine's SpecDecoder from its (validated) speculative options, or None when speculation is off.
    `kv_dtype`: the draft's KV cache elements, the target's (default: `dtype`). `target`, `target_path`:
    the loaded target and its file (method "mtp" reads the file's MTP block and shares the target's
    embedding and head; the engine's runner must then keep its hidden rows: SpecDecoder.wants_hidden).
    `prefix_caching`: an MTP block caches its own K/V under the target's block hashes (its drafts do not
    change the output either way)."""
    method, model, k = cfg.speculative_method, cfg.speculative_model, cfg.num_speculative_tokens
    if method is None:
        return None
    assert k is not None
    if method == "ngram":
        return SpecDecoder(NgramProposer(), k, method, adaptive_k(k))
    if method == "mtp":
        if target is None or target_path is None:
            raise ValueError("speculative_method 'mtp': needs the target model and its file")
        return SpecDecoder(mtp_proposer(target, target_path, num_blocks, block_size, kv_dtype or dtype,
                                        prefix_caching), k, method, adaptive_k(k))
    from hitenter.engine.model_runner import ModelRunner
    from hitenter.kv_cache.manager import KVCacheManager
    from hitenter.models.attention import allocate_kv_caches
    from hitenter.models.gguf import open_gguf, read_gguf_metadata
    from hitenter.models.loader import load_model
    from hitenter.models.plan import apply_plan, build_plan
    from hitenter.models.registry import resolve_model
    from hitenter.tokenizer.bpe import Tokenizer

    path = str(resolve_model(model))
    # the draft takes the target's dtype option ("auto": the GGUF's blocks with fp32 activations, like the
    # target's; int8/int4 targets keep a dense draft in the activation dtype)
    reader = open_gguf(path)   # one header parse for the draft's model and tokenizer
    net, mcfg = load_model(path, dtype=load_dtype if (quantization or "none") in ("none", "gguf") else dtype,
                           reader=reader)
    check_vocab_compatible(tokenizer, Tokenizer.from_gguf(read_gguf_metadata(reader)), vocab_size, mcfg.vocab_size,
                           model)
    del reader
    if mcfg.context_length < max_model_len:
        raise ValueError(f"speculative_model: {model!r} has a context of {mcfg.context_length} tokens, less than "
                         f"max_model_len={max_model_len}")
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False)   # the target's token capacity
    caches = allocate_kv_caches(mcfg, num_blocks, block_size, kv_dtype or dtype)
    # the target's kernel plan for the draft too: its prompts and catch-up rows take the fused C layers
    plan = build_plan(net, caches, dtype, getattr(net, "batch_invariant", True))
    apply_plan(net, plan)
    runner = ModelRunner(net, caches, block_size, draft_logits(net, draft_vocab_size()))
    runner.plan = plan
    lookup = NgramProposer() if envs.HITENTER_DRAFT_LOOKUP.get() else None
    return SpecDecoder(DraftModelProposer(runner, kv, lookup), k, method, adaptive_k(k))


def mtp_proposer(target: torch.nn.Module, path: str, num_blocks: int, block_size: int,
                 kv_dtype: torch.dtype, prefix_caching: bool = False) -> MTPProposer:
    """The file's MTP block on its own one-layer cache of the target's token capacity (`prefix_caching`: its
    full blocks cached under the target's block hashes, so a prompt resuming from the target's cache drafts
    as it does cold)."""
    from hitenter.kv_cache.manager import KVCacheManager
    from hitenter.models.mtp import load_mtp_head

    head = load_mtp_head(path, target)
    trimmed = draft_logits(target, draft_vocab_size()) if head.own_head is None else None   # the shared head
    return MTPProposer(head, KVCacheManager(num_blocks, block_size, enable_prefix_caching=prefix_caching),
                       head.allocate_cache(num_blocks, block_size, kv_dtype), trimmed)


def adaptive_k(k_max: int) -> AdaptiveK | None:
    """The draft-length controller (HITENTER_SPEC_ADAPTIVE=0: always num_speculative_tokens)."""
    return AdaptiveK(k_max) if envs.HITENTER_SPEC_ADAPTIVE.get() else None
