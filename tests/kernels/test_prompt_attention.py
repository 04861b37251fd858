"""The prompt-row attention kernel (hitenter/kernels/csrc/attention/prompt_attention.c) against the fp64-free torch
reference, and its batch invariance: a row's bits do not depend on how the prompt is chunked, on the other
sequences of the step or on the thread count."""

from __future__ import annotations

import math

import pytest
import torch

from hitenter.models import attention as A
from hitenter.models import prompt_kernel as P

pytestmark = pytest.mark.skipif(P.load() is None, reason="no C compiler: prompt rows take the GEMM path")
BS = 16


def setup(h: int, kvh: int, d: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    nb = -(-length // BS) + 5
    kv = torch.randn(2, kvh, nb, BS, d, generator=g)
    table = torch.randperm(nb, generator=g)[: -(-length // BS)].tolist()     # scattered blocks
    return kv, torch.randn(length, h, d, generator=g), table


def run(q: torch.Tensor, kv: torch.Tensor, seqs: list[tuple[int, int, list[int], int]], window: int | None = None,
        kernel: bool = True) -> torch.Tensor:
    """seqs: (first position, rows, table, prompt length) per sequence; q holds their rows in order."""
    qsl = [0]
    for _, n, _, _ in seqs:
        qsl.append(qsl[-1] + n)
    meta = A.AttentionMetadata(qsl, [p + n for p, n, _, _ in seqs], [t for _, _, t, _ in seqs],
                               torch.zeros(qsl[-1], dtype=torch.long), BS,
                               kernel_from=[plen - 1 for _, _, _, plen in seqs], use_kernel=True)
    if not kernel:
        orig = P.supports
        P.supports = lambda *a: False      # type: ignore[assignment]
        try:
            return A.paged_attention(q, kv, meta, 1 / math.sqrt(q.shape[-1]), window=window)
        finally:
            P.supports = orig              # type: ignore[assignment]
    return A.paged_attention(q, kv, meta, 1 / math.sqrt(q.shape[-1]), window=window)


def keys(kv: torch.Tensor, table: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.stack([kv[0, :, table[p // BS], p % BS] for p in range(length)])
    v = torch.stack([kv[1, :, table[p // BS], p % BS] for p in range(length)])
    return k, v


@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (12, 2, 128), (4, 1, 256), (2, 2, 16), (8, 1, 512)])
@pytest.mark.parametrize("window", [None, 37])
def test_matches_reference_and_the_gemm_path(h: int, kvh: int, d: int, window: int | None) -> None:
    n = 203
    kv, q, table = setup(h, kvh, d, n, seed=d)
    out = run(q, kv, [(0, n, table, n + 1)], window)
    k, v = keys(kv, table, n)
    ref = A.reference_attention(q, k, v, 0, 1 / math.sqrt(d), window=window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, run(q, kv, [(0, n, table, n + 1)], window, kernel=False), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_chunking_neighbours_or_threads() -> None:
    h, kvh, d, n = 6, 2, 64, 150
    kv, q, table = setup(h, kvh, d, n, seed=3)
    whole = run(q, kv, [(0, n, table, n + 1)])
    for cut in (1, 7, 16, 65, 149):       # the same prompt in two chunks: the second chunk's rows
        assert torch.equal(run(q[cut:].contiguous(), kv, [(cut, n - cut, table, n + 1)]), whole[cut:])
    kv2, q2, table2 = setup(h, kvh, d, 40, seed=4)
    both = run(torch.cat([q2, q]), torch.cat([kv, kv2], dim=2),   # another sequence first, blocks shifted
               [(0, 40, [b + kv.shape[2] for b in table2], 41), (0, n, table, n + 1)])
    assert torch.equal(both[40:], whole)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(run(q, kv, [(0, n, table, n + 1)]), whole)
    finally:
        torch.set_num_threads(prev)


def test_prompt_rows_next_to_generation_rows() -> None:
    """A step with a prompt chunk and a decoding sequence: prompt rows take this kernel, the generation
    rows the decode kernel, each as in a step of their own."""
    h, kvh, d = 6, 2, 64
    kv, q, table = setup(h, kvh, d, 90, seed=5)
    gen_q = torch.randn(1, h, d)
    mixed = run(torch.cat([q[:50], gen_q]), kv, [(0, 50, table, 80), (89, 1, table, 60)])
    assert torch.equal(mixed[:50], run(q[:50].contiguous(), kv, [(0, 50, table, 80)]))
    assert torch.equal(mixed[50:], run(gen_q, kv, [(89, 1, table, 60)]))
