"""zeros_on_demand (hitenter/models/zero_pages.py): zeros that hold memory only where written, freed with
the tensor; the KV caches allocate_kv_caches returns are such tensors."""

from __future__ import annotations

import gc

import torch

from hitenter.models.zero_pages import zeros_on_demand

MB = 1 << 20


def _mapping_rss(ptr: int) -> int:
    """Resident bytes of the memory mapping holding address ``ptr`` (/proc/self/smaps): the tensor's own pages,
    whatever else the process (other tests' threads) allocates meanwhile; 0 when no mapping holds it."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= ptr < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    return 0


def test_reads_as_zeros_and_takes_memory_as_written() -> None:
    t = zeros_on_demand((4, 64, MB // 4), torch.float16)            # 128 MiB
    ptr = t.data_ptr()
    assert t.shape == (4, 64, MB // 4) and t.dtype == torch.float16 and t.is_contiguous()
    assert _mapping_rss(ptr) < 16 * MB                                # nothing committed yet
    assert not t[0, :2].any() and not t[3, -1].any()                 # zeros where read
    t[1].fill_(1.5)                                                   # 32 MiB written
    grown = _mapping_rss(ptr)
    assert 24 * MB < grown < 56 * MB, grown
    assert float(t[1, 7, 11]) == 1.5 and not t[2].any()
    del t
    gc.collect()
    assert _mapping_rss(ptr) < 16 * MB                                # the mapping went with it


def test_small_and_other_types() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        small = zeros_on_demand((2, 3), dtype)
        big = zeros_on_demand((2, MB), dtype)
        assert small.dtype == big.dtype == dtype and not small.any() and not big.any()
        big[1, -1] = 3
        assert int(big.sum()) == 3
