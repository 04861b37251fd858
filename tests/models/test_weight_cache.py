"""The weight cache (hitenter/models/weight_cache.py): a GGUF's arena written at its first load, mapped by the
next, with the same logits as a load without the cache; rebuilt when the GGUF, the slots or the file change;
off with HITENTER_WEIGHT_CACHE=0."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from hitenter.kernels.blocks import BlockWeight
from hitenter.models import loader, weight_cache
from hitenter.models.block_linear import BlockEmbedding, BlockLinear
from hitenter.models.loader import load_model
from hitenter.testing.hybrid_goldens import lone_logits
from hitenter.testing.model_runs import sequence_logits
from hitenter.testing.tiny_families import FAMILIES, write_tiny_family
from hitenter.testing.tiny_hybrids import write_tiny_hybrid
from hitenter.testing.tiny_model import write_tiny_gguf

IDS = [5, 9, 17, 3, 40, 41, 2, 7, 11, 60]


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every GGUF cached (no size floor), under this test's own HITENTER_HOME."""
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HITENTER_WEIGHT_CACHE", "1")
    monkeypatch.setattr(weight_cache, "MIN_GGUF_BYTES", 0)
    return tmp_path / "home" / "weights"


def _logits(path: Path) -> tuple[torch.Tensor, torch.nn.Module]:
    model, _ = load_model(path)
    return sequence_logits(model, IDS, kernel_from=len(IDS)), model


def _arena_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.arena")) if folder.exists() else []


@pytest.mark.parametrize(("arch", "quant", "tied"), [("llama", "Q8_0", True), ("qwen2", "Q4_K", False),
                                                      ("qwen2", {"attn_v": "Q6_K", "": "Q4_0"}, False)])
def test_a_second_load_maps_the_cached_arena_with_the_same_logits(tmp_path: Path, cache_home: Path, arch: str,
                                                                  quant: object, tied: bool) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", arch, quant=quant, tied=tied,   # type: ignore[arg-type]
                           hidden=256, ffn=512)   # K-quant rows: multiples of 256
    os.environ["HITENTER_WEIGHT_CACHE"] = "0"
    plain, _ = _logits(path)
    assert _arena_files(cache_home) == []
    os.environ["HITENTER_WEIGHT_CACHE"] = "1"
    first, built = _logits(path)
    assert built.weight_arena.read_only   # built, written, then mapped back from the file
    files = _arena_files(cache_home)
    assert len(files) == 1
    second, mapped = _logits(path)
    assert mapped.weight_arena.read_only
    assert torch.equal(first, plain) and torch.equal(second, plain)
    linears = [m for m in mapped.modules() if isinstance(m, BlockLinear)]
    assert linears and all(mapped.weight_arena.owns(p.data) for m in linears for p in m.parts)
    emb = next(m for m in mapped.modules() if isinstance(m, BlockEmbedding))
    assert mapped.weight_arena.owns(emb.table.data) == tied   # an untied table stays on the GGUF's map
    assert not any(t.is_meta for t in mapped.buffers())


def test_a_changed_gguf_or_stale_slots_rebuild_the_cache(tmp_path: Path, cache_home: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", quant="Q8_0")
    want, _ = _logits(path)
    (cache,) = _arena_files(cache_home)
    stamp = cache.stat().st_mtime_ns
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))   # the GGUF "changed"
    got, model = _logits(path)
    assert torch.equal(got, want) and cache.stat().st_mtime_ns != stamp
    raw = cache.read_bytes()   # a header whose slots do not match what the build makes
    header = weight_cache._read_header(cache)
    header["slots"][0][1] += 1
    body = json.dumps(header).encode()
    head = weight_cache.MAGIC + len(body).to_bytes(8, "little") + body
    cache.write_bytes(head.ljust(weight_cache.HUGE, b"\0") + raw[weight_cache.HUGE:])
    got, _ = _logits(path)
    assert torch.equal(got, want)
    assert weight_cache._read_header(cache)["slots"][0][1] == header["slots"][0][1] - 1   # rewritten


def test_a_cache_file_whose_gguf_is_gone_is_removed(tmp_path: Path, cache_home: Path) -> None:
    gone = write_tiny_gguf(tmp_path / "gone.gguf", "qwen2", quant="Q8_0")
    load_model(gone)
    assert len(_arena_files(cache_home)) == 1
    gone.unlink()
    load_model(write_tiny_gguf(tmp_path / "kept.gguf", "qwen2", quant="Q8_0"))
    assert [p.name.split("-")[0] for p in _arena_files(cache_home)] == ["kept"]


def test_a_placeholder_left_in_the_model_falls_back_to_the_file(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached build that leaves a placeholder (here: the untied embedding's file weight is not kept)
    is built again from the GGUF: the same logits, no meta tensor."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", quant="Q8_0", tied=False)
    want, _ = _logits(path)
    blocks = loader.block_weights

    builds = []

    def without_sources(reader: object, names: set[str], placeholders: bool = False) -> dict[str, object]:
        builds.append(placeholders)
        out = blocks(reader, names, placeholders)
        for w in out.values():
            if isinstance(w, BlockWeight):
                w.source = None
        return out

    monkeypatch.setattr(loader, "block_weights", without_sources)
    got, model = _logits(path)
    assert builds == [True, False]   # over placeholders (the cache was hit), then from the file
    assert torch.equal(got, want)
    emb = next(m for m in model.modules() if isinstance(m, BlockEmbedding))
    assert not emb.table.data.is_meta and not any(t.is_meta for t in model.buffers())


@pytest.mark.slow   # four loads of a mixture / hybrid model each
@pytest.mark.parametrize("family", ["qwen3moe", "lfm2moe"])
def test_mixture_and_hybrid_models_load_from_the_cache(tmp_path: Path, family: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A build that dequantizes a router reads the placeholder's file weight: the cached load is used (no
    fall-back to the file) and its logits are the uncached load's."""
    write = write_tiny_family if family in FAMILIES else write_tiny_hybrid
    path = write(tmp_path / "m.gguf", family, quant="Q8_0")
    os.environ["HITENTER_WEIGHT_CACHE"] = "0"
    want = lone_logits(load_model(path)[0], IDS)
    os.environ["HITENTER_WEIGHT_CACHE"] = "1"
    load_model(path)
    with caplog.at_level(logging.INFO, logger="hitenter.loader"):
        model, _ = load_model(path)
    assert model.weight_arena.read_only and "not used" not in caplog.text
    assert torch.equal(lone_logits(model, IDS), want)
