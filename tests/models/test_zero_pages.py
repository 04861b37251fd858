"""zeros_on_demand (hitenter/models/zero_pages.py): zeros that hold memory only where written, freed with
the tensor; the KV caches allocate_kv_caches returns are such tensors."""

from __future__ import annotations

import gc

import psutil
import torch

from hitenter.models.zero_pages import zeros_on_demand

MB = 1 << 20


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def test_reads_as_zeros_and_takes_memory_as_written() -> None:
    gc.collect()
    before = _rss()
    t = zeros_on_demand((4, 64, MB // 4), torch.float16)            # 128 MiB
    assert t.shape == (4, 64, MB // 4) and t.dtype == torch.float16 and t.is_contiguous()
    assert _rss() - before < 16 * MB                                  # nothing committed yet
    assert not t[0, :2].any() and not t[3, -1].any()                 # zeros where read
    t[1].fill_(1.5)                                                   # 32 MiB written
    grown = _rss() - before
    assert 24 * MB < grown < 56 * MB, grown
    assert float(t[1, 7, 11]) == 1.5 and not t[2].any()
    del t
    gc.collect()
    assert _rss() - before < 16 * MB                                  # the mapping went with it


def test_small_and_other_types() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        small = zeros_on_demand((2, 3), dtype)
        big = zeros_on_demand((2, MB), dtype)
        assert small.dtype == big.dtype == dtype and not small.any() and not big.any()
        big[1, -1] = 3
        assert int(big.sum()) == 3
