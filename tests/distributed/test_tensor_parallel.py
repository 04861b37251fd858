"""Tensor parallelism (hitenter/distributed): TP=2 (rank 0 here + one gloo worker) gives TP=1's tokens.

In the default format (the file's GGUF blocks) the shards keep the blocks and the row-parallel layers
gather instead of all-reducing partial sums (models/shard.py), so TP=2 must give TP=1's bits: the same
tokens and the same logprobs, compared with ==, for greedy and seeded sampling, through the fused C layer
(short prompts: every row) and the torch layers (a prompt longer than the fused-prompt limit). Experts
are replicated. Dense fp32 shards (dtype="float32") all-reduce, so there only float rounding is allowed.
Also: KV heads split or replicated, the weight bytes per rank, clean shutdown, a dead worker's error."""

from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from hitenter.distributed import TensorParallelError, validate_tp
from hitenter.llm import LLM
from hitenter.models.gguf import model_config_from_metadata, open_gguf, read_gguf_metadata
from hitenter.sampling_params import SamplingParams

OPTS = dict(kv_cache_memory=1 << 22, max_model_len=256, num_threads=1)
PROMPTS = ["Hello world", "the cat is on the mat and the dog", "in the end"]
LONG = list(range(3, 83))   # 80 prompt tokens: past a tiny model's fused-prompt limit (~57), so torch layers
K_MIX = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q5_K",
         "ffn_up": "Q5_K", "ffn_down": "Q6_K", "token_embd": "Q6_K", "output": "Q8_0"}


def _params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=10, temperature=0.0, logprobs=3),
            SamplingParams(max_tokens=10, temperature=1.0, seed=7, logprobs=3),
            SamplingParams(max_tokens=10, temperature=0.8, top_k=20, seed=123, logprobs=3),
            SamplingParams(max_tokens=10, temperature=0.0, logprobs=3)]


def _run(llm: LLM, prompts: list) -> tuple[list[list[int]], list[list[float]]]:
    outs = llm.generate(prompts, _params()[:len(prompts)])
    toks = [list(o.outputs[0].token_ids) for o in outs]
    lps = [[p.chosen.logprob for p in o.outputs[0].logprobs] for o in outs]
    return toks, lps


def _worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.engine.runner.workers.procs]


def _gone(pids: list[int]) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


def _compare(path: Path, prompts: list = PROMPTS, atol: float | None = None, **opts: object) -> tuple[int, int]:
    """TP=2 against TP=1 on `prompts`: the same tokens, and the same logprobs (exactly, or within atol
    where given). Returns (TP=1's weight bytes, rank 0's)."""
    opts = {**OPTS, **opts}
    with LLM(str(path), **opts) as one:
        ref_toks, ref_lps = _run(one, prompts)
        one_bytes = one.engine.parts.model.weight_bytes()
    with LLM(str(path), tensor_parallel_size=2, **opts) as two:
        pids = _worker_pids(two)
        assert len(pids) == 1 and not _gone(pids)
        toks, lps = _run(two, prompts)
        assert two.engine.runner.comm_seconds > 0
        two_bytes = two.engine.runner.model.inner.weight_bytes()
    assert _gone(pids), "worker left running after close()"
    assert toks == ref_toks
    if atol is None:
        assert lps == ref_lps
    else:
        for a, b in zip(lps, ref_lps, strict=True):
            assert a == pytest.approx(b, abs=atol)
    return one_bytes, two_bytes


def test_native_kernel_rows_do_not_depend_on_the_other_rows() -> None:
    """What the row-parallel scheme rests on: a row of W gets the same bits in a call over any row range
    (a shard) as in the call over all of W, at decode and prefill row counts."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    from hitenter.kernels import BlockWeight, native_available, qmatmul
    from hitenter.testing.tiny_model import random_kquant

    if not native_available():
        pytest.skip("no native kernels")
    rng = np.random.default_rng(0)
    for qt in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K):
        n, k = 200, 512
        raw = (random_kquant(qt, n, k, rng) if qt in (Q.Q4_K, Q.Q6_K)
               else quantize(rng.standard_normal((n, k)).astype(np.float32), qt))
        w = BlockWeight(torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)), int(qt), (n, k))
        for m in (1, 5, 70):
            x = torch.randn(m, k)
            full = qmatmul(x, w)
            for a, b in ((0, 96), (96, 200), (7, 150)):
                assert torch.equal(qmatmul(x, w.narrow(0, a, b - a)), full[:, a:b]), (qt.name, m, a, b)


def test_tp2_matches_tp1_llama(tmp_path: Path) -> None:   # 4 heads / 2 KV heads: one KV head each
    from hitenter.testing.tiny_model import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "q8.gguf", arch="llama", seed=0, quant="Q8_0")
    one, two = _compare(path, PROMPTS + [LONG])
    assert 0.4 < two / one < 0.65, (one, two)   # the tied table and every projection sharded


@pytest.fixture(scope="module")
def tiny_llama_kv1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_model import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tp") / "kv1.gguf", arch="llama", seed=3, heads=4, kv_heads=1,
                           quant="Q8_0")


@pytest.mark.slow
def test_tp2_matches_tp1_qwen2_kquants(tmp_path: Path) -> None:
    """QKV biases, an untied vocab-parallel head, a Q4_K_M-like mix of K types (256-element blocks)."""
    from hitenter.testing.tiny_model import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "kq.gguf", arch="qwen2", seed=1, quant=K_MIX, hidden=256, ffn=512)
    _compare(path, PROMPTS + [LONG])


@pytest.mark.slow
def test_tp2_dense_fp32_all_reduces(tiny_qwen2_path: Path) -> None:   # dense shards: rounding only
    _compare(tiny_qwen2_path, atol=1e-4, dtype="float32")


@pytest.mark.slow
def test_tp2_replicates_single_kv_head(tiny_llama_kv1: Path) -> None:  # 1 KV head < 2 ranks: replicated
    _compare(tiny_llama_kv1)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_tp2_mixture_of_experts(family: str, tmp_path: Path) -> None:
    """Experts replicated on every rank (attention sharded): TP=1's bits, fused and torch rows."""
    from hitenter.testing.tiny_families import write_tiny_family

    path = write_tiny_family(tmp_path / f"{family}.gguf", family, seed=3, quant="Q8_0")
    _compare(path, PROMPTS + [LONG])


@pytest.mark.slow
def test_tp2_smollm2_uneven_heads(smollm2_path: Path) -> None:
    """SmolLM2 Q4_1 (repacked blocks): 9 heads / 3 KV heads over 2 ranks -> GQA groups split 2 + 1 (6 + 3
    query heads); TP=1's bits, about half its weight bytes on rank 0."""
    one, two = _compare(smollm2_path, ["The capital of France is", "def add(a, b):"], kv_cache_memory=64 << 20)
    assert 0.45 < two / one < 0.56, (one, two)


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
