"""WeightArena (hitenter/kernels/arena.py): aligned copies in one mapping, huge pages asked for, and the
loader's use of it (every matmul weight placed, a tied head sharing the embedding's copy)."""

from __future__ import annotations

import mmap

import pytest
import torch

from hitenter.kernels.arena import ALIGN, HUGE, WeightArena, drop_mapped_pages, hugepages_wanted
from hitenter.models.block_linear import BlockEmbedding, BlockLinear
from hitenter.models.loader import load_model
from hitenter.testing.tiny_model import write_tiny_gguf


def test_place_copies_aligned_and_checks_room() -> None:
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in (3, 100, 4097)]
    arena = WeightArena([t.numel() for t in ts])
    assert arena.size % HUGE == 0
    placed = [arena.place(t) for t in ts]
    for t, p in zip(ts, placed, strict=True):
        assert torch.equal(p, t) and p.data_ptr() % ALIGN == 0 and arena.owns(p)
    assert not arena.owns(ts[0])
    with pytest.raises(MemoryError):
        arena.place(torch.zeros(arena.size, dtype=torch.uint8))


def test_hugepages_follow_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_HUGEPAGES", "0")
    assert not hugepages_wanted() and not WeightArena([10]).huge
    monkeypatch.setenv("HITENTER_HUGEPAGES", "1")
    assert hugepages_wanted() == hasattr(mmap, "MADV_HUGEPAGE")


def test_dropped_pages_of_a_file_map_read_back_the_same(tmp_path) -> None:   # type: ignore[no-untyped-def]
    import numpy as np

    f = tmp_path / "blob"
    data = np.random.default_rng(0).integers(0, 256, 3 * mmap.PAGESIZE + 17, dtype=np.uint8)
    f.write_bytes(data.tobytes())
    m = np.memmap(f, mode="r")
    assert int(m.sum()) == int(data.sum())
    drop_mapped_pages(m.ctypes.data, m.nbytes)
    assert np.array_equal(np.asarray(m), data)


@pytest.mark.parametrize("tied", [True, False])
def test_loader_places_every_matmul_weight(tmp_path, tied: bool) -> None:   # type: ignore[no-untyped-def]
    path = write_tiny_gguf(tmp_path / "m.gguf", quant="Q8_0", tied=tied)
    model, _ = load_model(path)
    arena = model.weight_arena
    linears = [m for m in model.modules() if isinstance(m, BlockLinear)]
    assert linears and all(arena.owns(p.data) for m in linears for p in m.parts)
    emb = next(m for m in model.modules() if isinstance(m, BlockEmbedding))
    assert arena.owns(emb.table.data) == tied   # an untied table stays on the map (rows read on demand)
