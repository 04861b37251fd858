"""A model driven directly over a paged KV cache, without the engine: the block tables, slots and metadata
the tests of models, kernels and caches build around one forward pass."""

from __future__ import annotations

import torch

from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.decoder import CausalLM

BS = 16   # block size of every cache built here


class Runner:
    """Drives a model with contiguous block tables: sequence i owns blocks [i*per, (i+1)*per)."""

    def __init__(self, model: CausalLM, num_seqs: int, max_len: int) -> None:
        self.model, self.per = model, (max_len + BS - 1) // BS
        if hasattr(model, "allocate_caches"):   # a hybrid model (models/hybrid.py): sequence i's state in slot i
            self.caches = model.allocate_caches(num_seqs * self.per, BS, torch.float32, num_seqs)
            model.restore_states(self.caches, [(-1, i) for i in range(num_seqs)])
        else:
            self.caches = allocate_kv_caches(model.config, num_seqs * self.per, BS)
        self.done = [0] * num_seqs

    def step(self, chunks: dict[int, list[int]], last_only: bool = False) -> dict[int, torch.Tensor]:
        """Feed new tokens per sequence in one flat batch; return fp32 logits rows per sequence
        (only each sequence's last row when last_only)."""
        ids, pos, slots, qsl, lens, tables = [], [], [], [0], [], []
        for i, toks in chunks.items():
            start = self.done[i]
            ids += toks
            pos += range(start, start + len(toks))
            slots += [(i * self.per) * BS + p for p in range(start, start + len(toks))]
            qsl.append(qsl[-1] + len(toks))
            lens.append(start + len(toks))
            tables.append(list(range(i * self.per, (i + 1) * self.per)))
            self.done[i] += len(toks)
        meta = AttentionMetadata(qsl, lens, tables, torch.tensor(slots, dtype=torch.long), BS,
                                 state_slots=list(chunks))
        hidden = self.model(torch.tensor(ids), torch.tensor(pos), meta, self.caches)
        if last_only:
            logits = self.model.compute_logits(hidden[[q - 1 for q in qsl[1:]]])
            return {i: logits[j:j + 1] for j, i in enumerate(chunks)}
        logits = self.model.compute_logits(hidden)
        return {i: logits[qsl[j]:qsl[j + 1]] for j, i in enumerate(chunks)}


def greedy_batch(model: CausalLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Prefill all prompts in one batch, then decode all sequences together for n greedy tokens."""
    r = Runner(model, len(prompts), max(map(len, prompts)) + n)
    last = r.step(dict(enumerate(prompts)), last_only=True)
    outs: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        nxt = {i: int(lg[-1].argmax()) for i, lg in last.items()}
        for i, t in nxt.items():
            outs[i].append(t)
        last = r.step({i: [t] for i, t in nxt.items()})
    return outs


@torch.inference_mode()
def sequence_logits(model: torch.nn.Module, ids: list[int], kernel_from: int, decode_from: int | None = None,
                    chunks: tuple[int, ...] = ()) -> torch.Tensor:
    """Logits of every row of one sequence (in steps cut at `chunks`) over a cache of the model's dtype; rows
    from kernel_from run the fused layers, of those the rows before decode_from with the tiled prompt kernel."""
    n = len(ids)
    blocks = -(-n // BS)
    caches = allocate_kv_caches(model.config, blocks, BS, model.dtype)
    out = []
    for a, b in zip((0, *chunks), (*chunks, n), strict=True):
        meta = AttentionMetadata([0, b - a], [b], [list(range(blocks))], torch.arange(a, b, dtype=torch.long), BS,
                                 kernel_from=[kernel_from], decode_from=None if decode_from is None else [decode_from])
        out.append(model.compute_logits(model(torch.tensor(ids[a:b]), torch.arange(a, b), meta, caches)))
    return torch.cat(out)


@torch.inference_mode()
def logits_and_cache(model: torch.nn.Module, ids: list[int], kernel_from: int,
                     dtype: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One step over a fresh cache of `dtype` (a torch dtype or a cache type such as Q8_0): the logits of
    every row and the caches it wrote."""
    n = len(ids)
    blocks = -(-n // BS)
    caches = allocate_kv_caches(model.config, blocks, BS, dtype)
    meta = AttentionMetadata([0, n], [n], [list(range(blocks))], torch.arange(n, dtype=torch.long), BS,
                             kernel_from=[kernel_from])
    return model.compute_logits(model(torch.tensor(ids), torch.arange(n), meta, caches)), caches
