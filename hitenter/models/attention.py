"""Paged KV cache and batch-invariant causal attention over a flat batch of tokens.

Layout: a layer's KV cache is `[2, num_kv_heads, num_blocks, block_size, head_dim]` (index 0 = K,
1 = V); a token's slot is `block_id * block_size + offset`. Heads outermost, so gathering a
sequence's blocks gives each head's keys as one contiguous `[L, head_dim]` matrix (no transposing
copy before the GEMMs). A step processes T new tokens from S sequences, described by
AttentionMetadata (passed explicitly, never a global).

How a step is computed: each sequence's new rows are cut into work items of at most QUERY_BLOCK
tokens; an item needs the key tiles up to its last position only (later tiles would be fully
masked). Items with the same (query rows, key tiles) shape run as one batched GEMM group, so a
decode step of 64 sequences is a handful of GEMMs per layer, not 64.

Batch invariance contract: an output row is bitwise identical whatever else shares the batch, however
the prompt was chunked and whatever work item/group it lands in. It holds because every shape that
varies only varies in ways that do not change a row's bits on torch CPU:
  * an item's query rows (GQA group x tokens) are padded to a multiple of 8 (GEMM rows; a row's bits
    are the same for any M % 8 == 0 and any batch count, but not for M = 1, 2, 3, ...) -- or not
    padded, in a dtype whose GEMMs are probed row-count invariant (bf16 on AVX512-BF16 CPUs);
  * Q.K^T reduces over head_dim only; keys past an item's context are masked to -inf;
  * softmax numerators/denominators are reduced per key tile of fixed size KEY_TILE and the tiles are
    accumulated left to right, so a tile that is fully masked (or skipped) adds exact zeros.

Generation rows (position >= prompt length - 1, given per sequence as `kernel_from`) go instead to a
fused kernel that reads the paged cache in place (decode_kernel.py): a row's path depends on its
position only, so the contract holds for both paths. Without `kernel_from`, or where the kernel is not
built, every row takes the GEMM path; where the queries are fp32 and the prompt kernel is built
(prompt_kernel.py), it replaces the GEMM path for every caller (which then is reference and fallback).

Cache element type (kv_dtype.py): fp32, bf16, f16 or q8_0. write_kv rounds the new K/V to it (q8_0:
quantizes each head row, kv_q8_0.py); the GEMM path widens (q8_0: dequantizes) the gathered blocks to the
query dtype before its GEMMs; the kernels widen as they load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.models import decode_kernel, kv_q8_0, prompt_kernel
from hitenter.models.kv_dtype import Q8_0, row_width
from hitenter.models.zero_pages import zeros_on_demand

KEY_TILE = 128  # keys per softmax/PV tile; fixed so a row's reduction order never depends on context length
ROW_MULTIPLE = 8  # query rows are padded to this multiple (batch-invariant GEMM shapes)
QUERY_BLOCK = 128  # tokens per work item: a long prefill skips the key tiles its early rows cannot see


@dataclass
class AttentionMetadata:
    """Per-step attention description (see docs/design/interfaces.md).

    query_start_loc: S+1 offsets; sequence i's new tokens are rows qsl[i]:qsl[i+1] of the flat batch.
    seq_lens: S context lengths after this step (already computed tokens + new tokens).
    block_tables: S lists of block ids covering at least seq_lens[i] tokens.
    slot_mapping: LongTensor[T], cache slot of each new token.
    block_size: tokens per KV block.
    """

    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: torch.Tensor
    block_size: int
    # scratch buffers by dtype for the K/V gathers; a runner passes one dict for all its steps, so the
    # gather writes into memory that is already mapped (a fresh multi-MB tensor per layer page-faults,
    # which costs more than the copy itself)
    workspace: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    # per sequence, the first position whose row is a generation row for the fused kernel (the prompt
    # length - 1); None: all rows take the GEMM path
    kernel_from: list[int] | None = None
    # per sequence, the first position whose row is a generation row (the prompt length - 1) where kernel_from
    # also sends prompt rows to the fused layers: those take the tiled prompt kernel there, the generation rows
    # the decode kernel (models/plan.py: prompt_paths); None: every kernel row the decode kernel
    decode_from: list[int] | None = None
    # the fused kernel runs: decided at load by the kernel plan (models/plan.py); None: checked per call
    use_kernel: bool | None = None
    _plans: dict[tuple[int, int, bool, int | None], list[_Group]] = field(default_factory=dict, repr=False,
                                                                          compare=False)
    _kernel_rows: list[decode_kernel.KernelRows | None] = field(default_factory=list, repr=False, compare=False)
    # per-step state of the fused decode layer (models/fused_decode.py), built by the first layer
    fused_steps: dict[int, object] = field(default_factory=dict, repr=False, compare=False)
    # the sliding-window layers' own block tables and slots (hitenter/kv_cache/window_group.py: same table
    # lengths, released entries hold a placeholder id that no row reads); None: every layer uses the above
    local_block_tables: list[list[int]] | None = None
    local_slot_mapping: torch.Tensor | None = None
    _local: list[AttentionMetadata] = field(default_factory=list, repr=False, compare=False)
    # hybrid models' recurrent layers (models/recurrent/base.py): each sequence's live state slot, and the
    # saves to take, (sequence index, rows of it done, destination slot); None without recurrent layers
    state_slots: list[int] | None = None
    state_saves: list[tuple[int, int, int]] | None = None
    # per sequence, position ranges [start, end) attended bidirectionally (an image's tokens, Gemma 3): a row
    # in one also sees the later keys of its range (the sliding window still counts back from the row's own
    # position, as llama.cpp's non-causal batches do); each range lies wholly in this step or the cache, and
    # before the sequence's kernel rows (kernel_from). A sequence with a range in this step takes the GEMM
    # path; the others keep theirs. None: causal everywhere
    bidirectional: list[list[tuple[int, int]]] | None = None

    def for_window(self, window: int | None) -> AttentionMetadata:
        """The metadata a layer with this sliding `window` (None: a global layer) reads and writes through:
        a view with the local tables and slots where the step has them (built once), else self."""
        if window is None or self.local_block_tables is None:
            return self
        if not self._local:
            self._local.append(AttentionMetadata(
                self.query_start_loc, self.seq_lens, self.local_block_tables, self.local_slot_mapping,
                self.block_size, self.workspace, self.kernel_from, self.decode_from, self.use_kernel,
                bidirectional=self.bidirectional))
        return self._local[0]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    def plan(self, group_size: int, row_multiple: int = ROW_MULTIPLE, use_kernel: bool = False,
             window: int | None = None, only_ranges: bool = False) -> list[_Group]:
        """The step's work groups for `group_size` query heads per KV head, each item's query rows padded
        to `row_multiple` (built once, shared by all layers with this `window`); `use_kernel`: generation
        rows left out; `window`: a row sees only its last `window` keys (sliding-window layers);
        `only_ranges`: only the sequences with a bidirectional range in this step."""
        key = (group_size, row_multiple, use_kernel, window, only_ranges)
        if key not in self._plans:
            self._plans[key] = _build_plan(self, group_size, row_multiple, use_kernel, window, only_ranges)
        return self._plans[key]

    def in_step_ranges(self, i: int) -> list[tuple[int, int]]:
        """Sequence i's bidirectional ranges among this step's new rows; ValueError for a range cut by the
        step's edges (its rows must be attended together)."""
        if not self.bidirectional or not self.bidirectional[i]:
            return []
        first = self.seq_lens[i] - (self.query_start_loc[i + 1] - self.query_start_loc[i])
        out = [(s, e) for s, e in self.bidirectional[i] if e > first and s < self.seq_lens[i]]
        for s, e in out:
            if s < first or e > self.seq_lens[i]:
                raise ValueError(f"sequence {i}: the bidirectional range [{s}, {e}) is cut by the step's rows "
                                 f"[{first}, {self.seq_lens[i]})")
        return out

    def range_free_pieces(self, i: int, use_kernel: bool) -> list[tuple[int, int]]:
        """Sequence i's GEMM rows (offsets from its first new row) outside its bidirectional ranges, as
        [lo, hi) pieces in order."""
        n_gemm = self.gemm_rows(i, use_kernel)
        first = self.seq_lens[i] - (self.query_start_loc[i + 1] - self.query_start_loc[i])
        pieces, lo = [], 0
        for s, e in sorted(self.in_step_ranges(i)):
            if s - first > lo:
                pieces.append((lo, s - first))
            lo = max(lo, e - first)
        if n_gemm > lo:
            pieces.append((lo, n_gemm))
        return pieces

    def table(self, i: int) -> list[int]:
        """Sequence i's block table; ValueError if it does not cover seq_lens[i] tokens."""
        table, need = self.block_tables[i], -(-self.seq_lens[i] // self.block_size)
        if len(table) < need:
            raise ValueError(f"block table has {len(table)} blocks, {need} needed for {self.seq_lens[i]} tokens")
        return table

    def gemm_rows(self, i: int, use_kernel: bool) -> int:
        """How many of sequence i's new rows (the first ones) take the GEMM path."""
        n = self.query_start_loc[i + 1] - self.query_start_loc[i]
        if not use_kernel or self.kernel_from is None:
            return n
        return min(n, max(0, self.kernel_from[i] - (self.seq_lens[i] - n)))

    def kernel_rows(self, num_blocks: int) -> decode_kernel.KernelRows | None:
        """The step's generation rows and their key ranges / block tables (built and checked once against
        a cache of `num_blocks` blocks; None if none)."""
        if not self._kernel_rows:
            self._kernel_rows.append(decode_kernel.build_kernel_rows(self, num_blocks))
        return self._kernel_rows[0]


@dataclass
class _Group:
    """Work items of one shape: B items, M query rows each, nt key tiles each.

    rows: `[B*M]` index of each query row in the step's `[T*G + 1]` per-KV-head row list (row t*G + g
    is token t, query head g of the group; T*G is a zero row used for padding).
    blocks: `[B*nb]` KV block ids (nb blocks cover nt tiles; padded with a valid id, masked).
    mask: `[B, M, nt*KEY_TILE]` True where a key is after the row's position (or, with a sliding window
    W, at or before position - W).
    """

    rows: torch.Tensor
    blocks: torch.Tensor
    mask: torch.Tensor
    num_items: int
    num_rows: int
    num_tiles: int
    _flat: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)

    def flat_index(self, planes: int, num_blocks: int) -> torch.Tensor:
        """Rows of the cache viewed as `[planes * num_blocks, block_size * head_dim]` (plane = K/V x head)."""
        key = (planes, num_blocks)
        if key not in self._flat:
            self._flat[key] = (torch.arange(planes)[:, None] * num_blocks + self.blocks[None, :]).reshape(-1)
        return self._flat[key]


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _build_plan(meta: AttentionMetadata, g: int, row_multiple: int, use_kernel: bool,
                window: int | None = None, only_ranges: bool = False) -> list[_Group]:
    bs = meta.block_size
    qsl = meta.query_start_loc
    dummy = qsl[-1] * g
    items: dict[tuple[int, int], list[tuple[list[int], list[int], list[int]]]] = {}
    for i, seq_len in enumerate(meta.seq_lens):
        a, b = qsl[i], qsl[i + 1]
        n = b - a
        if n <= 0:
            continue
        if n > seq_len:
            raise ValueError(f"sequence {i} has {n} new tokens but seq_len {seq_len}")
        table = meta.table(i)
        start = seq_len - n
        n_gemm = meta.gemm_rows(i, use_kernel)
        spans = meta.in_step_ranges(i)
        if spans and max(e for _, e in spans) > start + n_gemm:
            raise ValueError(f"sequence {i}: a bidirectional range runs into the kernel rows (kernel_from)")
        pieces = [(s - start, e - start) for s, e in spans] if only_ranges else [(0, n_gemm)]
        for lo, hi in pieces:
            for j0 in range(lo, hi, QUERY_BLOCK):
                j1 = min(hi, j0 + QUERY_BLOCK)
                m = j1 - j0
                rows_m = _round_up(g * m, row_multiple)
                rows = [(a + j0 + j) * g + h for h in range(g) for j in range(m)]
                pos = [start + j0 + j for _h in range(g) for j in range(m)]
                lim = [_key_limit(p, spans) for p in pos]
                nt = -(-(max(lim) + 1) // KEY_TILE)
                pad = rows_m - len(rows)
                rows += [dummy] * pad
                pos += [start + j1 - 1] * pad
                lim += [start + j1 - 1] * pad
                nb = -(-nt * KEY_TILE // bs)
                used = table[:nb]
                items.setdefault((rows_m, nt), []).append((rows, pos, lim, used + [used[0]] * (nb - len(used))))
    return [_group(its, rows_m, nt, window) for (rows_m, nt), its in items.items()]


def _key_limit(pos: int, spans: list[tuple[int, int]]) -> int:
    """The last key position a row at `pos` sees: the end of its bidirectional range, else itself."""
    for s, e in spans:
        if s <= pos < e:
            return e - 1
    return pos


def _group(its: list[tuple[list[int], list[int], list[int], list[int]]], rows_m: int, nt: int,
           window: int | None = None) -> _Group:
    """One work group from items (query rows, their positions, their last visible keys, block ids) of one
    shape.

    A sliding window only masks (keys older than the window stay in the tiles): a fully masked tile
    adds exact zeros, so a row's bits still depend on its position and keys only."""
    pos_t = torch.tensor([p for _, pos, _, _ in its for p in pos]).view(len(its), rows_m, 1)
    lim_t = torch.tensor([k for _, _, lim, _ in its for k in lim]).view(len(its), rows_m, 1)
    keys = torch.arange(nt * KEY_TILE).view(1, 1, -1)
    mask = keys > lim_t
    if window is not None:
        mask |= keys <= pos_t - window
    return _Group(
        rows=torch.tensor([r for rows, _, _, _ in its for r in rows], dtype=torch.long),
        blocks=torch.tensor([blk for _, _, _, blks in its for blk in blks], dtype=torch.long),
        mask=mask,
        num_items=len(its), num_rows=rows_m, num_tiles=nt)


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int,
                       dtype: torch.dtype = torch.float32, num_kv_heads: int | None = None,
                       num_local_blocks: int | None = None, layers: list[bool] | None = None) -> list[torch.Tensor]:
    """One zeroed tensor `[2, num_kv_heads, num_blocks, block_size, head_dim]` per layer, of `dtype` (the
    cache's element type: float32, bfloat16 or float16, hitenter/models/kv_dtype.py); for q8_0 (kv_dtype.Q8_0)
    bytes `[2, num_kv_heads, num_blocks, block_size, head_dim / 32 * 34]` (ValueError unless head_dim % 32 == 0).

    num_kv_heads: the KV heads this process holds (a tensor-parallel rank's shard); default all.
    num_local_blocks: the sliding-window layers' block count where they have their own block tables
    (hitenter/kv_cache/window_group.py); default num_blocks. layers: which layers get a cache (a hybrid
    model's attention layers, models/hybrid.py); default all; the list holds only those. Each layer's KV heads
    and head size are its own (config.layer_kv_heads / layer_head_dim: Gemma 4's local and global layers
    differ); a layer that reads another's KV (config.layer_kv_source) holds that layer's tensor. The zeros are
    committed as blocks are written (models/zero_pages.py): an idle cache holds next to no memory."""
    nl = num_blocks if num_local_blocks is None else num_local_blocks
    if num_blocks <= 0 or block_size <= 0 or nl <= 0:
        raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}, {nl}")
    own: dict[int, torch.Tensor] = {}
    out = []
    for i in range(config.num_layers):
        if layers is not None and not layers[i]:
            continue
        src = config.layer_kv_source(i)   # a KV-shared layer (Gemma 4) holds its source layer's tensor
        if src not in own:
            kvh = config.layer_kv_heads(src) if num_kv_heads is None else num_kv_heads
            width = row_width(dtype, config.layer_head_dim(src))
            own[src] = zeros_on_demand((2, kvh, num_blocks if config.layer_window(src) is None else nl, block_size,
                                        width), dtype)
        out.append(own[src])
    return out


def kv_tensors(caches: list[Any]) -> list[torch.Tensor]:
    """The attention layers' KV tensors among a runner's caches (a hybrid model's list also holds its recurrent
    layers' state caches and empty placeholders for FFN-only layers, models/hybrid.py)."""
    return [c for c in caches if isinstance(c, torch.Tensor) and c.dim() == 5]


def write_kv(kv_cache_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store k, v (`[T, num_kv_heads, head_dim]`) at the given cache slots (in place), rounded to the cache's
    type (a q8_0 cache: each head row quantized after its rotation, H k and H_64 v, kv_q8_0.py)."""
    _, kvh, nb, bs, w = kv_cache_layer.shape
    flat = kv_cache_layer.view(2, kvh, nb * bs, w)
    if kv_cache_layer.dtype == Q8_0:   # rotated first (kv_q8_0.py): paged_attention meets H k with H q, undoes H_64 v
        k, v = kv_q8_0.quantize(kv_q8_0.rotate(k)), kv_q8_0.quantize(kv_q8_0.rotate_v(v))
    flat[0].index_copy_(1, slot_mapping, k.to(kv_cache_layer.dtype).transpose(0, 1))
    flat[1].index_copy_(1, slot_mapping, v.to(kv_cache_layer.dtype).transpose(0, 1))


def widen_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows (`[..., row]`: elements, or q8_0 bytes) as values of `dtype` (`[..., head_dim]`)."""
    return kv_q8_0.dequantize(rows, dtype) if rows.dtype == Q8_0 else rows.to(dtype)


def _scratch(workspace: dict[torch.dtype, torch.Tensor], dtype: torch.dtype, numel: int) -> torch.Tensor:
    buf = workspace.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, 0 if buf is None else 2 * buf.numel()), dtype=dtype)
        workspace[dtype] = buf
    return buf[:numel]


def _attend_group(qz: torch.Tensor, kv_cache_layer: torch.Tensor, grp: _Group,
                  workspace: dict[torch.dtype, torch.Tensor], softcap: float = 0.0) -> torch.Tensor:
    """Output rows `[KVH, B*M, D]` of one work group (queries already scaled; scores soft-capped
    cap * tanh(s / cap) when `softcap`, Gemma 2's)."""
    _, kvh, num_blocks, bs, w = kv_cache_layer.shape
    d = qz.shape[-1]
    b, m, nt = grp.num_items, grp.num_rows, grp.num_tiles
    length = nt * KEY_TILE
    q = qz.index_select(1, grp.rows).view(kvh, b, m, d)
    idx = grp.flat_index(2 * kvh, num_blocks)
    buf = _scratch(workspace, kv_cache_layer.dtype, idx.numel() * bs * w).view(-1, bs * w)
    torch.index_select(kv_cache_layer.view(-1, bs * w), 0, idx, out=buf)
    if buf.dtype == Q8_0:              # a q8_0 cache: its rows dequantized (d * q, exact in fp32)
        buf = widen_rows(buf.view(-1, w), qz.dtype)
    elif buf.dtype != qz.dtype:        # a half-precision cache: widened (exactly) to the query dtype
        buf = _scratch(workspace, qz.dtype, buf.numel()).view_as(buf).copy_(buf)
    kv = buf.view(2, kvh, b, -1, d)
    if kv.shape[3] != length:          # block size not dividing KEY_TILE: cut the extra keys
        kv = kv[:, :, :, :length]
    k, v = kv[0], kv[1]
    scores = torch.matmul(q, k.transpose(-1, -2))
    if softcap:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    scores = scores.masked_fill_(grp.mask, float("-inf"))  # [KVH, B, M, L]
    e = scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_().view(kvh * b, m, nt, KEY_TILE)
    den_t = e.sum(dim=-1)  # [KVH*B, M, nt]
    num_t = torch.matmul(e.permute(0, 2, 1, 3), v.reshape(kvh * b, nt, KEY_TILE, d))  # [KVH*B, nt, M, D]
    num, den = num_t[:, 0], den_t[:, :, 0]
    for t in range(1, nt):
        num = num + num_t[:, t]
        den = den + den_t[:, :, t]
    return (num / den.unsqueeze(-1)).view(kvh, b * m, d)


def paged_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, meta: AttentionMetadata,
                    scale: float, row_multiple: int = ROW_MULTIPLE, window: int | None = None,
                    softcap: float = 0.0) -> torch.Tensor:
    """Causal attention of the flat batch q `[T, H, D]` against each sequence's paged K/V.

    The new tokens' K/V must already be written (write_kv). Query row j of sequence i sits at position
    seq_lens[i] - n_i + j and sees keys 0..that position; with `window` (a sliding-window layer) only
    keys position - window + 1 .. position (HF / llama.cpp: masked when q - k >= window). Returns
    `[T, H, D]` (contiguous). A q8_0 cache holds rotated rows H k and H_64 v (kv_q8_0.py): the queries are
    rotated to H q first, and the output, H_64 o, back to o.
    Batch invariant, see the module docstring; `row_multiple` 1 only where GEMMs in this dtype are
    row-count invariant (hitenter/models/row_invariance.py). `softcap` (Gemma 2's attention logit
    soft-cap): every row takes the GEMM path, which the native kernels do not cover yet.
    """
    if kv_cache_layer.dtype == Q8_0:   # (H q) . (H k) = q . k; sum p H_64 v = H_64 o (kv_q8_0.py)
        o = _attention(kv_q8_0.rotate(q), kv_cache_layer, meta, scale, row_multiple, window, softcap)
        return kv_q8_0.rotate_v(o)
    return _attention(q, kv_cache_layer, meta, scale, row_multiple, window, softcap)


def _attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, meta: AttentionMetadata, scale: float,
               row_multiple: int, window: int | None, softcap: float) -> torch.Tensor:
    """paged_attention on the values the cache holds (a q8_0 cache's rows as they are stored)."""
    nh = q.shape[1]
    ranges = any(meta.in_step_ranges(i) for i in range(meta.num_seqs))
    use_kernel = not softcap and meta.kernel_from is not None and (
        meta.use_kernel if meta.use_kernel is not None else decode_kernel.supports(kv_cache_layer, nh, q.dtype))
    kr = meta.kernel_rows(kv_cache_layer.shape[2]) if use_kernel else None
    if kr is not None and kr.all_rows:   # a pure decode step: the kernel only
        return decode_kernel.decode_attention(q, kv_cache_layer, kr.ctx, kr.starts, kr.tables, scale, window)
    if not softcap and prompt_kernel.supports(kv_cache_layer, nh, q.dtype):   # the other rows: their own kernel
        out = torch.empty_like(q)
        prompt_kernel.prompt_attention(q, out, kv_cache_layer, meta, scale, window, use_kernel)
        if ranges:   # the sequences with a bidirectional range: the GEMM path (the kernel is causal)
            rows = _range_rows(meta)
            part = _gemm_attention(q, kv_cache_layer, meta, scale, row_multiple, use_kernel, window, softcap, True)
            out.index_copy_(0, rows, part.index_select(0, rows))
    else:
        out = _gemm_attention(q, kv_cache_layer, meta, scale, row_multiple, use_kernel, window, softcap)
    if kr is not None:
        rows = decode_kernel.decode_attention(q.index_select(0, kr.rows), kv_cache_layer, kr.ctx, kr.starts,
                                              kr.tables, scale, window)
        out.index_copy_(0, kr.rows, rows)
    return out


def _gemm_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, meta: AttentionMetadata, scale: float,
                    row_multiple: int, use_kernel: bool, window: int | None, softcap: float,
                    only_ranges: bool = False) -> torch.Tensor:
    """The GEMM path: per KV head, rows t*G + h of the step's queries, plus one zero row for padding. Returns
    `[T, H, D]`; only the planned rows (see AttentionMetadata.plan) hold results."""
    t, nh, d = q.shape
    kvh = kv_cache_layer.shape[1]
    g = nh // kvh
    qz = q.new_zeros(kvh, t * g + 1, d)
    qz[:, :t * g] = (q * scale).view(t, kvh, g, d).transpose(0, 1).reshape(kvh, t * g, d)
    oz = torch.empty_like(qz)
    for grp in meta.plan(g, row_multiple, use_kernel, window, only_ranges):
        oz.index_copy_(1, grp.rows, _attend_group(qz, kv_cache_layer, grp, meta.workspace, softcap))
    return oz[:, :t * g].view(kvh, t, g, d).transpose(0, 1).reshape(t, nh, d)


def _range_rows(meta: AttentionMetadata) -> torch.Tensor:
    """The rows of this step inside a bidirectional range."""
    qsl, rows = meta.query_start_loc, []
    for i, seq_len in enumerate(meta.seq_lens):
        first = seq_len - (qsl[i + 1] - qsl[i])
        for s, e in meta.in_step_ranges(i):
            rows.extend(range(qsl[i] + s - first, qsl[i] + e - first))
    return torch.tensor(rows, dtype=torch.long)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int,
                        scale: float | None = None, window: int | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Plain contiguous causal GQA attention in float64 (tests only).

    q `[n, H, D]` at positions start_pos.., k/v `[L, KVH, D]` with L = start_pos + n. Returns fp32 `[n, H, D]`.
    """
    n, nh, d = q.shape
    kvh = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kk = k.double().repeat_interleave(nh // kvh, dim=1)
    vv = v.double().repeat_interleave(nh // kvh, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q.double() * scale, kk)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    pos = torch.arange(start_pos, start_pos + n)
    keys = torch.arange(k.shape[0])[None, :]
    s = s.masked_fill(keys > pos[:, None], float("-inf"))
    if window is not None:
        s = s.masked_fill(keys <= pos[:, None] - window, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, dim=-1), vv).float()
