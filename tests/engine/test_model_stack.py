"""The model stack's one builder (hitenter/engine/engine_setup.py): the GGUF's header is parsed once for the
model and its tokenizer, and runners past one process come from the registry (hitenter/engine/runner_registry.py)
that hitenter/distributed fills at import, which the entry points import only when the options ask for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hitenter.config import EngineConfig
from hitenter.engine import runner_registry
from hitenter.engine.llm_engine import LLMEngine
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.runner_registry import ParallelRunner, RunnerBuild
from hitenter.models import gguf
from hitenter.tokenizer import gguf_meta

OPTS = dict(max_model_len=64, kv_cache_memory=1 << 20, num_threads=1)


def test_the_header_is_parsed_once_for_model_and_tokenizer(tiny_qwen2_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    walks: list[int] = []
    init, walk = gguf.FastGGUFReader.__init__, gguf.FastGGUFReader._build_fields

    def counting_init(self: gguf.FastGGUFReader, path: str, *args: object, **kw: object) -> None:
        opened.append(str(path))
        init(self, path, *args, **kw)

    def counting_walk(self: gguf.FastGGUFReader, *args: object) -> int:
        walks.append(1)
        return walk(self, *args)

    def no_second_parse(path: object) -> dict:
        raise AssertionError(f"the tokenizer parsed {path} again")

    monkeypatch.setattr(gguf.FastGGUFReader, "__init__", counting_init)
    monkeypatch.setattr(gguf.FastGGUFReader, "_build_fields", counting_walk)
    monkeypatch.setattr(gguf_meta, "read_tokenizer_metadata", no_second_parse)
    import hitenter.tokenizer.bpe as bpe
    monkeypatch.setattr(bpe, "read_tokenizer_metadata", no_second_parse)
    eng = LLMEngine(str(tiny_qwen2_path), **OPTS)
    assert opened == [str(tiny_qwen2_path)] and walks == [1]
    assert eng.tokenizer.encode("hello world") and eng.model_config.vocab_size == eng.tokenizer.vocab_size


def test_metadata_is_converted_once_per_reader(tiny_qwen2_path: Path) -> None:
    reader = gguf.open_gguf(tiny_qwen2_path)
    first = gguf.read_gguf_metadata(reader)
    assert gguf.read_gguf_metadata(reader) is first
    assert first == gguf_meta.read_tokenizer_metadata(tiny_qwen2_path)   # the tokenizer's own parser agrees


def test_an_option_without_a_registered_runner_is_refused(tiny_qwen2_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_registry, "_REGISTERED", {})
    with pytest.raises(ValueError, match="tensor_parallel_size: no runner is registered.*import hitenter.distributed"):
        LLMEngine(str(tiny_qwen2_path), tensor_parallel_size=2, **OPTS)
    with pytest.raises(ValueError, match="no engine option 'pipeline'"):
        runner_registry.register(ParallelRunner("pipeline", lambda b: b.runner))


def test_a_registered_runner_is_checked_then_wraps_the_one_process_runner(tiny_qwen2_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_registry, "_REGISTERED", {})
    seen: list[object] = []

    class Wrapped(ModelRunner):
        pass

    def wrap(b: RunnerBuild) -> ModelRunner:
        seen.append(b)
        return Wrapped(b.runner.model, b.runner.kv_caches, b.cfg.cache.block_size)

    def check(cfg: EngineConfig) -> None:
        if cfg.parallel.disaggregate == "refuse":
            raise ValueError("disaggregate: refused")

    runner_registry.register(ParallelRunner("disaggregate", wrap, check=check))
    with pytest.raises(ValueError, match="disaggregate: refused"):
        LLMEngine(str(tiny_qwen2_path), disaggregate="refuse", **OPTS)
    assert not seen   # checked before anything loads
    eng = LLMEngine(str(tiny_qwen2_path), disaggregate="fake", **OPTS)
    assert type(eng.runner) is Wrapped and len(seen) == 1
    b = seen[0]
    assert isinstance(b, RunnerBuild) and b.path == str(tiny_qwen2_path) and b.num_blocks == eng.parts.num_blocks
    assert type(b.runner) is ModelRunner and b.runner.kv_caches and b.scheduler.max_model_len == 64


@pytest.mark.slow   # a fresh interpreter importing torch
def test_the_entry_point_imports_distributed_only_when_asked() -> None:
    code = (
        "import sys\n"
        "from hitenter.engine_options import engine_config\n"
        "from hitenter.engine import runner_registry as r\n"
        "cfg = engine_config('m.gguf', None, {'max_num_seqs': 2})\n"
        "assert not any(m.startswith('hitenter.distributed') for m in sys.modules), 'imported for one process'\n"
        "assert r.runners_for(cfg) == []\n"
        "for opts in ({'tensor_parallel_size': 2}, {'disaggregate': 'prefill=1,decode=1'}):\n"
        "    cfg = engine_config('m.gguf', None, opts)\n"
        "    assert [p.option for p in r.runners_for(cfg)] == list(opts), opts\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
