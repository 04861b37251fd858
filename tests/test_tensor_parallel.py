"""Tensor parallelism (hitenter/distributed): TP=2 (rank 0 here + one gloo worker) gives the same tokens
as TP=1, KV heads are split or replicated, workers shut down cleanly and a dead worker is a clear error."""

from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from hitenter.distributed import TensorParallelError, validate_tp
from hitenter.llm import LLM
from hitenter.models.gguf import model_config_from_metadata, open_gguf, read_gguf_metadata
from hitenter.sampling_params import SamplingParams

# tensor-parallel shards are dense fp32 (GGUF blocks cannot be split along their input dimension), so
# the single-process reference is the dense fp32 model too
OPTS = dict(kv_cache_memory=1 << 22, max_model_len=256, num_threads=1, dtype="float32")
PROMPTS = ["Hello world", "the cat is on the mat and the dog", "in the end"]


def _params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=10, temperature=0.0, logprobs=3),
            SamplingParams(max_tokens=10, temperature=1.0, seed=7, logprobs=3),
            SamplingParams(max_tokens=10, temperature=0.8, top_k=20, seed=123, logprobs=3)]


def _run(llm: LLM, prompts: list[str]) -> tuple[list[list[int]], list[list[float]]]:
    outs = llm.generate(prompts, _params()[:len(prompts)])
    toks = [list(o.outputs[0].token_ids) for o in outs]
    lps = [[p.chosen.logprob for p in o.outputs[0].logprobs] for o in outs]
    return toks, lps


def _worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.engine.runner.workers.procs]


def _gone(pids: list[int]) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


def _compare(path: Path, prompts: list[str] = PROMPTS, atol: float = 1e-4, **opts: object) -> None:
    opts = {**OPTS, **opts}
    with LLM(str(path), **opts) as one:
        ref_toks, ref_lps = _run(one, prompts)
    with LLM(str(path), tensor_parallel_size=2, **opts) as two:
        pids = _worker_pids(two)
        assert len(pids) == 1 and not _gone(pids)
        toks, lps = _run(two, prompts)
        assert two.engine.runner.comm_seconds > 0
    assert _gone(pids), "worker left running after close()"
    assert toks == ref_toks
    for a, b in zip(lps, ref_lps, strict=True):
        assert a == pytest.approx(b, abs=atol)


@pytest.fixture(scope="module")
def tiny_llama_kv1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_model import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tp") / "kv1.gguf", arch="llama", seed=3, heads=4, kv_heads=1)


def test_tp2_matches_tp1_llama(tiny_llama_path: Path) -> None:       # 4 heads / 2 KV heads: one KV head each
    _compare(tiny_llama_path)


@pytest.mark.slow
def test_tp2_matches_tp1_qwen2(tiny_qwen2_path: Path) -> None:       # QKV biases, untied vocab-parallel head
    _compare(tiny_qwen2_path)


@pytest.mark.slow
def test_tp2_replicates_single_kv_head(tiny_llama_kv1: Path) -> None:  # 1 KV head < 2 ranks: replicated
    _compare(tiny_llama_kv1)


@pytest.mark.slow
def test_tp2_smollm2_uneven_heads(smollm2_path: Path) -> None:
    """SmolLM2: 9 heads / 3 KV heads over 2 ranks -> GQA groups split 2 + 1 (6 + 3 query heads)."""
    _compare(smollm2_path, ["The capital of France is", "def add(a, b):"], atol=2e-3,
             kv_cache_memory=64 << 20)


@pytest.mark.slow
def test_unshardable_sizes_are_a_clear_error(smollm2_path: Path, tiny_llama_path: Path) -> None:
    reader = open_gguf(smollm2_path)
    cfg = model_config_from_metadata(read_gguf_metadata(reader), {t.name for t in reader.tensors})
    validate_tp(cfg, 2)
    validate_tp(cfg, 3)
    validate_tp(cfg, 9)          # 3 KV heads each replicated on 3 ranks, 1 query head per rank
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 4 ranks cannot shard .*9 attention heads / 3 KV"):
        validate_tp(cfg, 4)
    before = psutil.Process().children(recursive=True)
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 ranks"):
        LLM(str(tiny_llama_path), tensor_parallel_size=3, **OPTS)
    assert psutil.Process().children(recursive=True) == before    # nothing spawned


@pytest.mark.slow
def test_killed_worker_is_a_clear_error(tiny_llama_path: Path) -> None:
    llm = LLM(str(tiny_llama_path), tensor_parallel_size=2, **OPTS)
    pids = _worker_pids(llm)
    os.kill(pids[0], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match="worker"):
        llm.generate("Hello world", SamplingParams(max_tokens=5))
    assert time.monotonic() - t0 < 10
    with pytest.raises(TensorParallelError):     # the engine stays failed, it does not hang either
        llm.generate("Hello", SamplingParams(max_tokens=5))
    llm.close()
    assert _gone(pids)


@pytest.mark.slow
def test_worker_killed_mid_generation_is_a_clear_error(tiny_llama_path: Path) -> None:
    llm = LLM(str(tiny_llama_path), tensor_parallel_size=2, **OPTS)
    pids = _worker_pids(llm)
    seen = [0]

    def kill_after_3(_out: object) -> None:
        seen[0] += 1
        if seen[0] == 3:
            os.kill(pids[0], signal.SIGKILL)   # no wait: the next step may already be in a collective

    t0 = time.monotonic()
    with pytest.raises(TensorParallelError):
        llm.generate("Hello world", SamplingParams(max_tokens=200, ignore_eos=True), on_output=kill_after_3)
    assert time.monotonic() - t0 < 20
    kv = llm.engine.kv_manager
    assert kv.num_free_blocks == kv.num_blocks      # the failed request was aborted, its blocks freed
    llm.close()
    assert _gone(pids)


@pytest.mark.slow
def test_garbage_collected_engine_stops_its_workers(tiny_llama_path: Path) -> None:
    llm = LLM(str(tiny_llama_path), tensor_parallel_size=2, **OPTS)
    pids = _worker_pids(llm)
    assert llm.generate("Hello", SamplingParams(max_tokens=3))[0].outputs[0].token_ids
    del llm
    gc.collect()
    deadline = time.monotonic() + 10
    while not _gone(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pids)
