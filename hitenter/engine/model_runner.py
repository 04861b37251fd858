"""Turns a SchedulerOutput into one model forward over a flat batch and returns the logits of
the rows that need a token.

Every scheduled request contributes the tokens ``[num_computed_tokens, num_computed_tokens +
num_new_tokens)`` of its sequence; their K/V are written into the paged cache through a slot
mapping, attention reads through block tables. Only requests whose computed tokens catch up with
their total tokens this step (the end of a prefill, or a decode) get logits: one row, or ``1 + k``
rows for a request carrying ``k`` drafted tokens (its last verified token and each draft, in order).
A request's image rows (Request.images) take the vision encoder's rows (through ``encoder_cache``) in place
of their token embeddings, attended bidirectionally where the family does, on the GEMM path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hitenter.engine.scheduler import SchedulerOutput
from hitenter.models import mrope
from hitenter.models.attention import AttentionMetadata
from hitenter.models.plan import prompt_paths

if TYPE_CHECKING:
    from hitenter.engine.encoder_cache import EncoderCache
    from hitenter.models.plan import KernelPlan


@dataclass
class ModelRunnerOutput:
    logits: torch.Tensor | None      # [sum(num_rows), V] float32, `num_rows[i]` rows per sampled request
    sample_request_ids: list[str]
    t_model: float                   # seconds spent in the forward pass
    num_rows: list[int] = field(default_factory=list)   # 1 + drafted tokens, per sample_request_ids
    hidden: torch.Tensor | None = None   # [num_batched_tokens, H] every row's final hidden state (keep_hidden)


class ModelRunner:
    """Owns the model and its KV cache tensors; stateless between steps otherwise."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 logits: Callable[[torch.Tensor], torch.Tensor] | None = None, staged: Any = None) -> None:
        """`logits`: hidden rows -> logits rows (default the model's compute_logits; a speculative draft's
        head may score fewer ids: hitenter/engine/speculative/draft_head.py). `staged`: prompt KV computed
        elsewhere (hitenter/engine/side_prefill.py), whose ``load(out, kv_caches)`` copies it into the
        blocks of the requests admitted in a step, before that step's forward."""
        self.model = model
        self.staged = staged
        self.logits = logits or model.compute_logits
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.multi_axis = bool(getattr(getattr(model, "config", None), "rope_sections", ()))   # M-RoPE: [T, 4] positions
        self.workspace: dict[torch.dtype, torch.Tensor] = {}   # attention scratch reused across steps
        self.plan: KernelPlan | None = None   # set by engine_setup; None: attention checks its kernel per call
        self.keep_hidden = False   # return every row's hidden state (an MTP drafter reads the target's rows)
        self.encoder_cache: EncoderCache | None = None   # the vision encoder's rows by image (engine_setup)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        if not out.scheduled:
            return ModelRunnerOutput(None, [], 0.0)
        if self.staged is not None:
            self.staged.load(out, self.kv_caches)
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        multi_axis = self.multi_axis
        axis_positions: list[torch.Tensor] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        local = bool(out.scheduled) and out.scheduled[0].local_block_ids is not None   # kv_cache/window_group.py
        ltables: list[list[int]] = []
        lslots: list[int] = []
        sample_rows: list[int] = []
        sample_ids: list[str] = []
        num_rows: list[int] = []
        state_slots: list[int] = []   # recurrent layers (hybrid models): each sequence's live slot
        state_saves: list[tuple[int, int, int]] = []
        state_restores: list[tuple[int, int]] = []
        embed_rows: list[int] = []    # image rows of the flat batch, and the encoder's rows for them
        embed_values: list[torch.Tensor] = []
        spans: list[list[tuple[int, int]]] = []   # per sequence, its images attended bidirectionally
        kernel_from: list[int] = []   # rows through the fused layers (models/plan.py: prompt_paths)
        decode_from: list[int] = []   # of those, the generation rows (position >= prompt length - 1)
        for sr in out.scheduled:
            req = sr.request
            start, n = sr.num_computed_tokens, sr.num_new_tokens
            input_ids.extend(req.token_slice(start, start + n))
            pos = range(start, start + n)
            positions.extend(pos)
            if multi_axis:
                grids = [(im.start, *im.pixels.grid) for im in req.images]
                axis_positions.append(mrope.sequence_positions(start, start + n, grids))
            table = sr.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            tables.append(table)
            if local:
                lt = sr.local_block_ids
                lslots.extend(lt[p // bs] * bs + p % bs for p in pos)   # type: ignore[index]
                ltables.append(lt)   # type: ignore[arg-type]
            if sr.state is not None:
                state_slots.append(sr.state.slot)
                state_saves.extend((len(seq_lens) - 1, rows, dst) for rows, dst in sr.state.saves)
                if sr.state.restore is not None:
                    state_restores.append((sr.state.restore, sr.state.slot))
            paths = prompt_paths(self.model, req.num_prompt_tokens)
            if req.images:
                spans.append(self._images(req, start, n, qsl[-2], embed_rows, embed_values))
                paths = (max(paths[0], max(im.end for im in req.images)), paths[1])   # image rows: GEMM path
            else:
                spans.append([])
            kernel_from.append(paths[0])
            decode_from.append(paths[1])
            if start + n >= req.num_tokens:   # caught up: the last 1 + k rows score the drafts + next token
                k = len(req.spec_token_ids)
                sample_rows.extend(range(qsl[-1] - 1 - k, qsl[-1]))
                sample_ids.append(req.request_id)
                num_rows.append(k + 1)
        meta = AttentionMetadata(
            query_start_loc=qsl,
            seq_lens=seq_lens,
            block_tables=tables,
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            block_size=bs,
            kernel_from=kernel_from,
            decode_from=decode_from,
            use_kernel=None if self.plan is None else self.plan.attention_kernel,
            workspace=self.workspace,
            local_block_tables=ltables if local else None,
            local_slot_mapping=torch.tensor(lslots, dtype=torch.long) if local else None,
            state_slots=state_slots or None,
            state_saves=state_saves or None,
            bidirectional=spans if any(spans) else None,
        )
        t0 = time.perf_counter()
        if state_restores:   # the recurrent states resumed from a snapshot or started from zero
            self.model.restore_states(self.kv_caches, state_restores)
        extra = {}
        if embed_rows:
            extra["embeds"] = (torch.tensor(embed_rows, dtype=torch.long), torch.cat(embed_values))
        hidden = self.model(
            torch.tensor(input_ids, dtype=torch.long),
            torch.cat(axis_positions) if multi_axis else torch.tensor(positions, dtype=torch.long),
            meta,
            self.kv_caches,
            **extra,
        )
        logits = None
        if sample_rows:
            logits = self.logits(hidden[torch.tensor(sample_rows, dtype=torch.long)])
        return ModelRunnerOutput(logits, sample_ids, time.perf_counter() - t0, num_rows,
                                 hidden if self.keep_hidden else None)

    def _images(self, req: Any, start: int, n: int, row0: int, rows: list[int],
                values: list[torch.Tensor]) -> list[tuple[int, int]]:
        """The encoder's rows of each image with rows in this step's ``[start, start + n)`` (from the encoder
        cache: encoded at most once), appended at their flat-batch rows (``row0``: the sequence's first);
        returns the sequence's bidirectional ranges. An image cut by the step is a scheduler bug."""
        for im in req.images:
            if im.start >= start + n or im.end <= start:
                continue
            if im.start < start or im.end > start + n:
                raise ValueError(f"request {req.request_id!r}: the image at rows [{im.start}, {im.end}) is cut "
                                 f"by the step's rows [{start}, {start + n})")
            if self.encoder_cache is None:
                raise ValueError(f"request {req.request_id!r} holds an image but no vision encoder is loaded")
            values.append(self.encoder_cache.rows(im))
            rows.extend(range(row0 + im.start - start, row0 + im.end - start))
        return [(im.start, im.end) for im in req.images if im.bidirectional]

    def close(self) -> None:
        """Stop what the runner started beside the engine (the side prefill's thread); idempotent."""
        if self.staged is not None:
            self.staged.close()
