"""Disaggregated prefill/decode (hitenter/distributed/disagg.py): a prefill worker process computes prompt KV,
this process decodes. Same tokens and logprobs as the single engine (bitwise), clear errors and freed blocks
when the worker dies or hangs, no orphan processes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from hitenter.distributed.disagg import DisaggregationError
from hitenter.engine.async_engine import AsyncLLMEngine, EngineDeadError
from hitenter.llm import LLM
from hitenter.sampling_params import SamplingParams

OPTS = dict(kv_cache_memory=1 << 22, max_model_len=256, num_threads=1, block_size=16)
DISAGG = "prefill=1,decode=1"
PROMPTS = ["Hello world", "the cat is on the mat and the dog " * 6, "in the end", "x",
           list(range(3, 40)) + list(range(5, 60, 3))]


def _params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=10, temperature=0.0, logprobs=3),
            SamplingParams(max_tokens=10, temperature=1.0, seed=7, logprobs=3),
            SamplingParams(max_tokens=10, temperature=0.8, top_k=20, seed=123, logprobs=2, n=2),
            SamplingParams(max_tokens=6, temperature=1.0, seed=5, logprobs=1),
            SamplingParams(max_tokens=12, temperature=0.0, logprobs=3)]


def _run(llm: LLM) -> list[list[tuple[list[int], list[float]]]]:
    outs = llm.generate(PROMPTS, _params())
    return [[(list(c.token_ids), [p.chosen.logprob for p in c.logprobs or []]) for c in o.outputs] for o in outs]


def _gone(pids: list[int]) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


def _all_free(llm: LLM) -> bool:
    kv = llm.engine.kv_manager
    kv.check_invariants()
    return kv.num_free_blocks == kv.num_blocks


@pytest.mark.slow
def test_disaggregated_matches_single_engine(tiny_llama_path: Path) -> None:
    with LLM(str(tiny_llama_path), **OPTS) as one:
        ref = _run(one)
    with LLM(str(tiny_llama_path), disaggregate=DISAGG, **OPTS) as two:
        pids = two.engine.disagg.worker_pids
        assert len(pids) == 1 and not _gone(pids)
        assert _run(two) == ref                     # tokens and logprobs, bitwise
        outs = two.generate(PROMPTS[1], SamplingParams(max_tokens=3))
        m = outs[0].extra["disaggregated"]           # both phases in the request's metrics
        assert m["prefill_tokens"] == len(outs[0].prompt_token_ids) - 1
        assert m["prefill_s"] > 0 and m["transfer_s"] >= 0 and m["kv_bytes"] > 0
        assert m["remote_total_s"] >= m["prefill_s"]
        assert outs[0].metrics.time_to_first_token >= m["remote_total_s"]
        assert _all_free(two)
    assert _gone(pids), "prefill worker left running after close()"


@pytest.mark.slow
def test_abort_while_waiting_for_remote_kv(tiny_llama_path: Path) -> None:
    """An aborted request's KV is dropped on arrival, even when its id is reused for another prompt."""
    sp = SamplingParams(max_tokens=8, temperature=0.0, logprobs=1)
    with LLM(str(tiny_llama_path), **OPTS) as one:
        ref = one.generate(PROMPTS[4], sp)[0].outputs[0]
    with LLM(str(tiny_llama_path), disaggregate=DISAGG, **OPTS) as two:
        eng = two.engine
        eng.add_request("a", PROMPTS[1], sp)
        assert eng.scheduler.num_waiting == 1 and eng.has_unfinished_requests()
        eng.abort("a")
        eng.add_request("a", PROMPTS[4], sp)
        final = None
        while eng.has_unfinished_requests():
            for out in eng.step():
                final = out if out.finished else final
        assert final is not None and final.outputs[0].token_ids == ref.token_ids
        assert [p.chosen.logprob for p in final.outputs[0].logprobs] == [p.chosen.logprob for p in ref.logprobs]
        assert not eng.disagg.staged and not eng.disagg.jobs and _all_free(two)


def test_bad_options_are_clear_errors(tiny_llama_path: Path) -> None:
    before = psutil.Process().children(recursive=True)
    with pytest.raises(ValueError, match="disaggregate: only 'prefill=1,decode=1'"):
        LLM(str(tiny_llama_path), disaggregate="prefill=2,decode=1", **OPTS)
    with pytest.raises(ValueError, match="disaggregate: expected"):
        LLM(str(tiny_llama_path), disaggregate="prefill", **OPTS)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(str(tiny_llama_path), disaggregate=DISAGG, tensor_parallel_size=2, **OPTS)
    with pytest.raises(ValueError, match="quantization"):
        LLM(str(tiny_llama_path), disaggregate=DISAGG, quantization="int8", **OPTS)
    assert psutil.Process().children(recursive=True) == before


@pytest.mark.slow
def test_killed_prefill_worker_is_a_clear_error(tiny_llama_path: Path) -> None:
    llm = LLM(str(tiny_llama_path), disaggregate=DISAGG, **OPTS)
    pids = llm.engine.disagg.worker_pids
    os.kill(pids[0], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(DisaggregationError, match="prefill worker (died|failed)"):
        llm.generate(PROMPTS[1], SamplingParams(max_tokens=5))
    with pytest.raises(DisaggregationError):        # stays failed, never hangs
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=5))
    assert time.monotonic() - t0 < 10
    assert _all_free(llm) and not llm.engine.has_unfinished_requests()
    llm.close()
    assert _gone(pids)


@pytest.mark.slow
def test_prefill_worker_killed_mid_request(tiny_llama_path: Path) -> None:
    """The worker is frozen (SIGSTOP) so the request is surely waiting for its KV, then killed."""
    llm = LLM(str(tiny_llama_path), disaggregate=DISAGG, **OPTS)
    pids = llm.engine.disagg.worker_pids
    llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))
    os.kill(pids[0], signal.SIGSTOP)
    threading.Timer(0.5, os.kill, (pids[0], signal.SIGKILL)).start()
    t0 = time.monotonic()
    seen: list[int] = []                           # "x" (one token) decodes locally, holding blocks, meanwhile
    with pytest.raises(DisaggregationError, match="prefill worker"):
        llm.generate(["x", PROMPTS[1]], SamplingParams(max_tokens=150, ignore_eos=True),
                     on_output=lambda o: seen.append(o.outputs[0].token_ids[-1]))
    assert seen                                    # the local request was running when the worker died
    assert time.monotonic() - t0 < 10
    assert _all_free(llm) and not llm.engine.has_unfinished_requests()
    llm.close()
    assert _gone(pids)


@pytest.mark.slow
def test_hung_prefill_worker_times_out(tiny_llama_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_DISAGG_TIMEOUT_S", "1")
    llm = LLM(str(tiny_llama_path), disaggregate=DISAGG, **OPTS)
    pids = llm.engine.disagg.worker_pids
    os.kill(pids[0], signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(DisaggregationError, match="did not answer within 1 s"):
        llm.generate(PROMPTS[1], SamplingParams(max_tokens=5))
    assert time.monotonic() - t0 < 10
    assert _all_free(llm)
    llm.close()                                    # terminates the stopped worker
    assert _gone(pids)


@pytest.mark.slow
def test_async_stream_gets_the_error(tiny_llama_path: Path) -> None:
    llm = LLM(str(tiny_llama_path), disaggregate=DISAGG, **OPTS)
    pids = llm.engine.disagg.worker_pids
    eng = AsyncLLMEngine(llm.engine)

    async def consume() -> list[int]:
        toks: list[int] = []
        async for out in eng.generate(PROMPTS[1], SamplingParams(max_tokens=4, temperature=0.0)):
            toks = list(out.outputs[0].token_ids)
        return toks

    async def main() -> None:
        assert len(await consume()) == 4           # works while the worker lives
        os.kill(pids[0], signal.SIGSTOP)
        threading.Timer(0.3, os.kill, (pids[0], signal.SIGKILL)).start()
        with pytest.raises(EngineDeadError, match="prefill worker"):
            await asyncio.wait_for(consume(), 10)

    try:
        asyncio.run(main())
        assert eng.run_on_snapshot(_all_free, llm)
    finally:
        eng.shutdown()
    assert _gone(pids)


@pytest.mark.slow
def test_prefill_worker_loads_the_engines_weight_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GGUF blocks (the default format): the prefill worker runs the same blocks, so its KV is the one the
    decoding engine would compute (tokens and logprobs bitwise equal to a single engine)."""
    from hitenter.testing.tiny_model import write_tiny_gguf

    monkeypatch.setenv("HITENTER_GGUF_REFERENCE", "1")   # blocks even without the native kernels
    path = str(write_tiny_gguf(tmp_path / "q8.gguf", arch="llama", quant="Q8_0"))
    with LLM(path, **OPTS) as one:
        assert one.engine.parts.model.weight_format == "gguf"
        ref = _run(one)
    with LLM(path, disaggregate=DISAGG, **OPTS) as two:
        assert _run(two) == ref
