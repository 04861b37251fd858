"""Decode attention over long rows (csrc/attention/decode_attention.c): a row's keys are cut into chunks of 256 counted from
its first key, the chunks shared by all threads and merged in chunk order. A row's bits are the same with any
thread count, alone or in a batch; it equals the float64 reference for every cache type, on the AVX2 build
and on the portable 16-lane one."""

from __future__ import annotations

import ctypes
import math
import random

import pytest
import torch

from hitenter.kernels.native import DECODE_ATTENTION
from hitenter.models import decode_kernel as DK
from hitenter.models import kv_q8_0
from hitenter.models.attention import reference_attention
from hitenter.models.kv_dtype import type_codes

BS = 16
LENS = [1000, 257, 256, 40, 513]   # four chunks (the last short), one over, exactly one, short, two and a key
SHAPES = [(4, 1, 256), (12, 2, 128), (9, 3, 64), (8, 1, 512)]   # Gemma 3 270M, Qwen2.5-1.5B, SmolLM2-135M, Gemma 4 E2B global

pytestmark = pytest.mark.skipif(DK.load() is None, reason="no C compiler: torch path only")


class Rows:
    """One query row per length of LENS (row i at position LENS[i] - 1), its keys in a shuffled paged cache."""

    def __init__(self, h: int, kvh: int, d: int, dtype: torch.dtype | str, seed: int, q_scale: float = 1.0) -> None:
        g = torch.Generator().manual_seed(seed)
        need = [-(-n // BS) for n in LENS]
        ids = list(range(sum(need) + 3))
        random.Random(seed).shuffle(ids)
        base = torch.randn(2, kvh, len(ids), BS, d, generator=g)
        if dtype == "q8_0":
            self.kv = kv_q8_0.quantize(base)
            self.kv32 = kv_q8_0.dequantize(self.kv)
        else:
            self.kv = base.to(dtype)
            self.kv32 = self.kv.float()
        self.tables, off = [], 0
        for n in need:
            self.tables.append(ids[off:off + n])
            off += n
        self.q = torch.randn(len(LENS), h, d, generator=g) * q_scale
        self.h, self.kvh, self.d = h, kvh, d

    def run(self, rows: list[int], threads: int, window: int | None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
        """Rows `rows` in one call of the kernel (the engine's wrapper, or the library `lib` directly)."""
        t = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        ctx = t([LENS[i] for i in rows])
        starts = t([sum(len(self.tables[j]) for j in rows[:k]) for k in range(len(rows))])
        flat = t([b for i in rows for b in self.tables[i]])
        q, scale = self.q[rows].contiguous(), 1 / math.sqrt(self.d)
        if lib is None:
            torch.set_num_threads(threads)
            return DK.decode_attention(q, self.kv, ctx, starts, flat, scale, window)
        out = torch.empty_like(q)
        assert lib.decode_attention(q.data_ptr(), out.data_ptr(), self.kv.data_ptr(),
                                    type_codes(self.kv.dtype, q.dtype), len(rows), ctx.data_ptr(), starts.data_ptr(),
                                    flat.data_ptr(), self.h, self.kvh, self.kv.shape[2], BS, self.d, scale,
                                    window or 0, threads) == 0
        return out

    def reference(self, i: int, window: int | None) -> torch.Tensor:
        n, pos = LENS[i], torch.arange(LENS[i])
        blocks = torch.tensor(self.tables[i])[pos // BS]
        k, v = (self.kv32[j][:, blocks, pos % BS].transpose(0, 1) for j in (0, 1))   # [n, KVH, D]
        return reference_attention(self.q[i:i + 1], k, v, n - 1, 1 / math.sqrt(self.d), window=window)[0]


def check(rows: Rows, window: int | None, lib: ctypes.CDLL | None = None, q_scale: float = 1.0) -> None:
    every = list(range(len(LENS)))
    batched = rows.run(every, 2, window, lib)
    for threads in (1, 3):
        assert torch.equal(rows.run(every, threads, window, lib), batched), "the bits depend on the thread count"
    assert torch.equal(rows.run(every[::-1], 2, window, lib), batched.flip(0)), "the bits depend on the batch"
    for i in every:
        assert torch.equal(rows.run([i], 2, window, lib)[0], batched[i]), f"row {i} differs alone and batched"
        tol = 3e-5 if q_scale == 1.0 else 1e-4
        torch.testing.assert_close(batched[i], rows.reference(i, window), rtol=tol, atol=tol)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


DTYPES = [torch.float16, torch.bfloat16, torch.float32, "q8_0"]
FAST = {(s, torch.float16, w) for s in SHAPES for w in (None, 512)} | {(SHAPES[i], t, 300) for i, t in enumerate(DTYPES[1:])}
CASES = [pytest.param(s, t, w, marks=[] if (s, t, w) in FAST else [pytest.mark.slow])
         for s in SHAPES for t in DTYPES for w in (None, 300, 512)]


@pytest.mark.parametrize("shape,dtype,window", CASES)
def test_long_rows(shape: tuple[int, int, int], dtype: torch.dtype | str, window: int | None, threads) -> None:
    """Every shape and cache type, whole rows and sliding windows (300: a chunk and a part; 512: two chunks);
    the default f16 cache and one case of each other type in the fast lane, the rest slow."""
    check(Rows(*shape, dtype, seed=shape[2] + len(str(dtype))), window)


def test_peaked_scores_across_chunks(threads) -> None:
    """Scores spread so widely (std 30) that most chunks' weights against the row's maximum vanish: the merge
    still equals the reference."""
    check(Rows(12, 2, 128, torch.float16, seed=3, q_scale=30.0), None, q_scale=30.0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, "q8_0"])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_portable_build_long_rows(shape: tuple[int, int, int], dtype: torch.dtype | str) -> None:
    lib = DECODE_ATTENTION.instance("portable")
    if lib is None:
        pytest.skip("the portable instance is not built here")
    for window in (None, 512):
        check(Rows(*shape, dtype, seed=5), window, lib)
