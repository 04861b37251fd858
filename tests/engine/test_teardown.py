"""Loading and closing an engine many times leaves the process's memory where it was: the weights (the
weight cache's map, hitenter/models/weight_cache.py), the KV cache, the runner and the tokenizer all go
with the engine."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from hitenter import LLM, SamplingParams
from hitenter.kernels.arena import trim_heap
from hitenter.models import weight_cache
from hitenter.testing.tiny_model import write_tiny_gguf

ROUNDS, WARM = 50, 5
MAX_GROWTH_MB = 24


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow   # 50 engine loads
def test_fifty_loads_and_closes_leave_rss_where_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(weight_cache, "MIN_GGUF_BYTES", 0)   # the mapped weight cache too
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", quant="Q8_0", hidden=256, ffn=512, layers=4,
                           context_length=1024)
    marks = []
    for i in range(ROUNDS):
        with LLM(str(path), max_model_len=1024, kv_cache_memory=32 << 20) as llm:
            llm.generate("hello there", SamplingParams(max_tokens=4, temperature=0))
        del llm
        gc.collect()
        trim_heap()
        if i in (WARM - 1, ROUNDS - 1):
            marks.append(_rss_mb())
    assert marks[1] - marks[0] < MAX_GROWTH_MB, marks
