"""Paged attention: equals a contiguous reference, and is bitwise batch/chunk invariant."""

from __future__ import annotations

import random

import pytest
import torch

from hitenter.models import decode_kernel
from hitenter.models.attention import AttentionMetadata, paged_attention, reference_attention, write_kv

H, KVH, D = 6, 2, 16


def make_cache(num_blocks: int, block_size: int) -> torch.Tensor:
    # non-zero garbage in unused slots must not leak into results
    return torch.randn(2, KVH, num_blocks, block_size, D)


class Seqs:
    """Random per-sequence q/k/v for all positions, and a shuffled block allocation."""

    def __init__(self, lens: list[int], block_size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.lens, self.bs = lens, block_size
        self.q = [torch.randn(n, H, D, generator=g) for n in lens]
        self.k = [torch.randn(n, KVH, D, generator=g) for n in lens]
        self.v = [torch.randn(n, KVH, D, generator=g) for n in lens]
        need = [(n + block_size - 1) // block_size for n in lens]
        ids = list(range(sum(need) + 3))
        random.Random(seed).shuffle(ids)
        self.tables, off = [], 0
        for n in need:
            self.tables.append(ids[off:off + n])
            off += n
        self.num_blocks = len(ids)

    def slots(self, i: int, a: int, b: int) -> list[int]:
        t = self.tables[i]
        return [t[p // self.bs] * self.bs + p % self.bs for p in range(a, b)]

    def step(self, cache: torch.Tensor, chunks: dict[int, tuple[int, int]], row_multiple: int = 8,
             kernel_from: dict[int, int] | None = None) -> dict[int, torch.Tensor]:
        """Process tokens a:b of each listed sequence in one flat batch; return its output rows per seq.
        kernel_from: per sequence, the first position whose row is a generation row (fused kernel)."""
        qs, ks, vs, slots, qsl, lens, tables, order = [], [], [], [], [0], [], [], []
        for i, (a, b) in chunks.items():
            qs.append(self.q[i][a:b])
            ks.append(self.k[i][a:b])
            vs.append(self.v[i][a:b])
            slots += self.slots(i, a, b)
            qsl.append(qsl[-1] + b - a)
            lens.append(b)
            tables.append(self.tables[i])
            order.append(i)
        sm = torch.tensor(slots, dtype=torch.long)
        write_kv(cache, torch.cat(ks), torch.cat(vs), sm)
        kf = None if kernel_from is None else [kernel_from[i] for i in order]
        meta = AttentionMetadata(qsl, lens, tables, sm, self.bs, kernel_from=kf)
        out = paged_attention(torch.cat(qs), cache, meta, D ** -0.5, row_multiple)
        return {i: out[qsl[j]:qsl[j + 1]] for j, i in enumerate(order)}


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_paged_matches_reference(block_size: int) -> None:
    s = Seqs([1, 7, 40, 150, 260], block_size, seed=block_size)
    cache = make_cache(s.num_blocks, block_size)
    out = s.step(cache, {i: (0, n) for i, n in enumerate(s.lens)})
    for i, _n in enumerate(s.lens):
        ref = reference_attention(s.q[i], s.k[i], s.v[i], 0)
        torch.testing.assert_close(out[i], ref, atol=2e-5, rtol=1e-5)
    # a decode-like step after a partial prefill also matches the reference
    s2 = Seqs([33], block_size, seed=7)
    c2 = make_cache(s2.num_blocks, block_size)
    s2.step(c2, {0: (0, 30)})
    o = s2.step(c2, {0: (30, 33)})[0]
    ref = reference_attention(s2.q[0][30:], s2.k[0], s2.v[0], 30)
    torch.testing.assert_close(o, ref, atol=2e-5, rtol=1e-5)


def test_batch_invariance_alone_vs_batched() -> None:
    s = Seqs([37, 5, 300, 1, 129], 16, seed=3)
    alone = {}
    for i, n in enumerate(s.lens):
        alone[i] = s.step(make_cache(s.num_blocks, 16), {i: (0, n)})[i]
    batched = s.step(make_cache(s.num_blocks, 16), {i: (0, n) for i, n in enumerate(s.lens)})
    for i in alone:
        assert torch.equal(alone[i], batched[i]), f"sequence {i} differs when batched"
    rev = s.step(make_cache(s.num_blocks, 16), {i: (0, s.lens[i]) for i in reversed(range(len(s.lens)))})
    for i in alone:
        assert torch.equal(alone[i], rev[i])


@pytest.mark.parametrize("splits", [[1], [5, 9], [16, 64, 200], [127, 128, 129, 130], [290, 291, 295]])
def test_chunked_prefill_and_decode_bitwise(splits: list[int]) -> None:
    n = 300
    s = Seqs([n, 50], 16, seed=11)
    full = s.step(make_cache(s.num_blocks, 16), {0: (0, n)})[0]
    cache = make_cache(s.num_blocks, 16)
    bounds = [0] + splits + [n]
    parts = []
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        chunks = {0: (a, b)}
        if j == 1:  # another sequence joins one of the steps
            chunks[1] = (0, 50)
        parts.append(s.step(cache, chunks)[0])
    assert torch.equal(torch.cat(parts), full)


def test_decode_tokens_one_by_one_bitwise() -> None:
    n = 140
    s = Seqs([n], 8, seed=5)
    full = s.step(make_cache(s.num_blocks, 8), {0: (0, n)})[0]
    cache = make_cache(s.num_blocks, 8)
    rows = [s.step(cache, {0: (0, 120)})[0]] + [s.step(cache, {0: (p, p + 1)})[0] for p in range(120, n)]
    assert torch.equal(torch.cat(rows), full)


@pytest.mark.slow
def test_bf16_rows_unpadded_where_probed_invariant() -> None:
    """bf16 attention with the probed row multiple (1 on AVX512-BF16 CPUs: decode items keep G rows, not 8)
    is still bitwise the same alone, batched, chunked and token by token."""
    from hitenter.models.row_invariance import attention_row_multiple

    rm = attention_row_multiple(torch.bfloat16, D, 128)
    s = Seqs([37, 5, 300, 1, 129], 16, seed=4)
    s.q = [x.bfloat16() for x in s.q]
    s.k = [x.bfloat16() for x in s.k]
    s.v = [x.bfloat16() for x in s.v]

    def cache() -> torch.Tensor:
        return make_cache(s.num_blocks, 16).bfloat16()

    batched = s.step(cache(), {i: (0, n) for i, n in enumerate(s.lens)}, rm)
    for i, n in enumerate(s.lens):
        assert torch.equal(s.step(cache(), {i: (0, n)}, rm)[i], batched[i])
    c = cache()
    rows = [s.step(c, {2: (0, 250)}, rm)[2]] + [s.step(c, {2: (p, p + 1), 0: (0, 37)}, rm)[2] for p in range(250, 300)]
    assert torch.equal(torch.cat(rows), batched[2])


# ---------------------------------------------------------------- fused kernel for generation rows

needs_kernel = pytest.mark.skipif(decode_kernel.load() is None, reason="no C compiler: torch path only")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_kernel_rows_match_reference(block_size: int, dtype: torch.dtype) -> None:
    """Generation rows (all rows, and the tail rows of a mixed step) equal the float64 reference."""
    s = Seqs([1, 7, 40, 150, 260], block_size, seed=block_size)
    for name in ("q", "k", "v"):
        setattr(s, name, [x.to(dtype) for x in getattr(s, name)])
    # bf16: the kernel rounds once at the end (fp32 inside); the GEMM path's bf16 rows round more often
    tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    ktol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 8e-3, "rtol": 8e-3}
    cache = make_cache(s.num_blocks, block_size).to(dtype)
    # prompt rows before position n - 3 take the GEMM path, the last 3 rows (or fewer) the kernel
    out = s.step(cache, {i: (0, n) for i, n in enumerate(s.lens)}, kernel_from={i: n - 3 for i, n in enumerate(s.lens)})
    for i, _n in enumerate(s.lens):
        ref = reference_attention(s.q[i].float(), s.k[i].float(), s.v[i].float(), 0)
        torch.testing.assert_close(out[i].float(), ref, **tol)
        torch.testing.assert_close(out[i][-3:].float(), ref[-3:], **ktol)
    # a pure decode step (every row a generation row: the kernel alone)
    dec = s.step(cache, {i: (n - 1, n) for i, n in enumerate(s.lens)}, kernel_from={i: 0 for i in range(5)})
    for i, n in enumerate(s.lens):
        assert torch.equal(dec[i], out[i][n - 1:]), "a generation row differs between a mixed and a decode step"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_rows_batch_and_chunk_invariant(dtype: torch.dtype) -> None:
    """With generation rows from position 250 of sequence 2: alone, batched with others, chunked, and
    token by token give the same bits (the path of a row depends on its position only)."""
    s = Seqs([37, 5, 300, 1, 129], 16, seed=8)
    for name in ("q", "k", "v"):
        setattr(s, name, [x.to(dtype) for x in getattr(s, name)])
    kf = {0: 30, 1: 4, 2: 250, 3: 0, 4: 100}

    def cache() -> torch.Tensor:
        return make_cache(s.num_blocks, 16).to(dtype)

    alone = s.step(cache(), {2: (0, 300)}, kernel_from=kf)[2]
    batched = s.step(cache(), {i: (0, n) for i, n in enumerate(s.lens)}, kernel_from=kf)
    assert torch.equal(batched[2], alone)
    c = cache()
    rows = [s.step(c, {2: (0, 240)}, kernel_from=kf)[2], s.step(c, {2: (240, 260), 4: (0, 129)}, kernel_from=kf)[2]]
    rows += [s.step(c, {2: (p, p + 1), 0: (0, 37)}, kernel_from=kf)[2] for p in range(260, 300)]
    assert torch.equal(torch.cat(rows), alone)


def test_without_kernel_every_row_takes_the_gemm_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel_from is ignored where the kernel is not built: results equal the kernel-less metadata's."""
    monkeypatch.setattr(decode_kernel, "load", lambda: None)
    s = Seqs([37, 130], 4, seed=2)
    a = s.step(make_cache(s.num_blocks, 4), {0: (0, 37), 1: (0, 130)}, kernel_from={0: 0, 1: 100})
    b = s.step(make_cache(s.num_blocks, 4), {0: (0, 37), 1: (0, 130)})
    assert all(torch.equal(a[i], b[i]) for i in a)


def test_kernel_refuses_unsupported_shapes() -> None:
    """head_dim not a multiple of 16, or a query dtype other than the cache's: the torch path is used."""
    cache = torch.zeros(2, 2, 4, 4, 24)
    assert not decode_kernel.supports(cache, 6, torch.float32)
    assert not decode_kernel.supports(torch.zeros(2, 2, 4, 4, 16), 6, torch.bfloat16)


@pytest.mark.parametrize("kernel_from", [None, [0]])
def test_short_block_table_is_refused(kernel_from: list[int] | None) -> None:
    """A block table that does not cover the context is an error on either path, never a silent read."""
    cache = make_cache(8, 4)
    meta = AttentionMetadata([0, 1], [9], [[0, 1]], torch.tensor([8]), 4, kernel_from=kernel_from)
    with pytest.raises(ValueError, match="block table has 2 blocks, 3 needed"):
        paged_attention(torch.randn(1, H, D), cache, meta, D ** -0.5)
