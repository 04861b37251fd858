"""Side prefill (hitenter/engine/side_prefill.py): a long prompt arriving while streams decode is prefilled
in a thread of its own on half of the cores. The tokens and logprobs of every request are bitwise those
of the engine without it; only long, uncached prompts beside decoding streams go aside; an abort or a
failure in the side thread loses nothing and leaks nothing; the thread count comes back."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hitenter.engine import side_prefill
from hitenter.llm import LLM
from hitenter.request import RequestStatus
from hitenter.sampling_params import SamplingParams

# max_num_batched_tokens 48: the long prompts (120 tokens) run in 3 chunks, in the side job and the engine alike
OPTS = dict(kv_cache_memory=1 << 22, max_model_len=256, num_threads=2, block_size=16, side_prefill_tokens=32,
            max_num_batched_tokens=48)
STREAM = SamplingParams(max_tokens=40, temperature=0.9, seed=3, ignore_eos=True, logprobs=2)


def _long(salt: int, n: int = 120) -> list[int]:
    return [3 + salt] + [5 + (i * 37) % 200 for i in range(n - 1)]


def _result(o: object) -> list[tuple[list[int], list[float]]]:
    return [(list(c.token_ids), [p.chosen.logprob for p in c.logprobs or []]) for c in o.outputs]


def _scenario(llm: LLM, long_params: SamplingParams, steps_before: int = 4,
              abort_long: bool = False) -> tuple[dict[str, object], RequestStatus]:
    """Two streams decode; after `steps_before` steps a long prompt arrives; run to the end."""
    eng = llm.engine
    for i in range(2):
        eng.add_request(f"s{i}", f"stream number {i} says", STREAM)
    done: dict[str, object] = {}
    for _ in range(steps_before):
        for o in eng.step():
            if o.finished:
                done[o.request_id] = _result(o)
    eng.add_request("long", _long(0), long_params)
    status = _status(llm, "long")
    if abort_long:
        eng.abort("long")
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = _result(o)
    return done, status


def _status(llm: LLM, request_id: str) -> RequestStatus:
    return llm.engine.output_processor.groups[request_id].seqs[0].request.status


def _all_free(llm: LLM) -> bool:
    kv = llm.engine.kv_manager
    kv.check_invariants()
    return kv.num_free_blocks == kv.num_blocks


LONG = SamplingParams(max_tokens=8, temperature=0.7, seed=11, logprobs=3, n=2)


def test_side_prefill_gives_the_engines_tokens_and_logprobs(tiny_llama_path: Path) -> None:
    with LLM(str(tiny_llama_path), **{**OPTS, "side_prefill_tokens": 0}) as plain:
        assert plain.engine.prefiller is None
        ref, status = _scenario(plain, LONG)
        assert status is RequestStatus.WAITING
    threads = torch.get_num_threads()
    with LLM(str(tiny_llama_path), **OPTS) as side:
        assert isinstance(side.engine.prefiller, side_prefill.SidePrefill)
        got, status = _scenario(side, LONG)
        assert status is RequestStatus.WAITING_FOR_REMOTE_KV    # it went aside
        assert side.engine.prefiller.num_jobs == 1
        assert got == ref                                       # every request, both sequences of the long one
        assert not side.engine.prefiller.staged and not side.engine.prefiller.jobs and _all_free(side)
        assert torch.get_num_threads() == threads               # halved while the job ran, then restored


def test_only_long_uncached_prompts_beside_decoding_streams_go_aside(tiny_llama_path: Path) -> None:
    with LLM(str(tiny_llama_path), **OPTS) as llm:
        eng, sp = llm.engine, llm.engine.prefiller
        eng.add_request("alone", _long(1), SamplingParams(max_tokens=2))   # nothing decoding: the engine's own
        assert _status(llm, "alone") is RequestStatus.WAITING
        while eng.has_unfinished_requests():
            eng.step()
        eng.add_request("s", "a stream", SamplingParams(max_tokens=30, ignore_eos=True))
        for _ in range(3):
            eng.step()
        eng.add_request("short", _long(2, 20), SamplingParams(max_tokens=2))    # under side_prefill_tokens
        assert _status(llm, "short") is RequestStatus.WAITING
        eng.add_request("cached", _long(1), SamplingParams(max_tokens=2))      # its prefix is in the cache
        assert _status(llm, "cached") is RequestStatus.WAITING
        eng.add_request("new", _long(3), SamplingParams(max_tokens=2))
        assert _status(llm, "new") is RequestStatus.WAITING_FOR_REMOTE_KV
        while eng.has_unfinished_requests():
            eng.step()
        assert sp.num_jobs == 1 and _all_free(llm)


def test_an_abort_stops_the_job_and_frees_everything(tiny_llama_path: Path) -> None:
    with LLM(str(tiny_llama_path), **OPTS) as llm:
        threads = torch.get_num_threads()                       # the engine's (num_threads=2)
        done, status = _scenario(llm, LONG, abort_long=True)
        assert status is RequestStatus.WAITING_FOR_REMOTE_KV
        assert set(done) == {"s0", "s1"} and "long" not in done
        sp = llm.engine.prefiller
        assert not sp.staged and not sp.jobs and _all_free(llm)
        assert torch.get_num_threads() == threads


@pytest.mark.slow
def test_a_failed_job_falls_back_to_the_engines_prefill(tiny_llama_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with LLM(str(tiny_llama_path), **{**OPTS, "side_prefill_tokens": 0}) as plain:
        ref, _ = _scenario(plain, LONG)

    def broken(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("injected")

    monkeypatch.setattr(side_prefill, "prefill_kv", broken)
    with LLM(str(tiny_llama_path), **OPTS) as llm, caplog.at_level(logging.WARNING, "hitenter.engine"):
        got, status = _scenario(llm, LONG)
        assert status is RequestStatus.WAITING_FOR_REMOTE_KV
        assert got == ref                                   # computed by the engine instead, same bits
        assert "side prefill failed (RuntimeError: injected)" in caplog.text
        assert _all_free(llm)


def test_side_prefill_option_is_checked() -> None:
    from hitenter.config import SchedulerConfig

    with pytest.raises(ValueError, match="side_prefill_tokens"):
        SchedulerConfig(side_prefill_tokens=-1)


@pytest.mark.slow
def test_side_prefill_on_the_default_model_gives_the_same_tokens(smollm2_path: Path) -> None:
    """The native kernels' rows (fused decode, prompt attention, packed GEMMs) at 1 and 2 threads."""
    opts = dict(max_model_len=1024, num_threads=2, kv_cache_memory=1 << 26)
    long = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2)
    with LLM(str(smollm2_path), **opts, side_prefill_tokens=0) as plain:
        ref, _ = _scenario(plain, long)
    with LLM(str(smollm2_path), **opts, side_prefill_tokens=64) as side:
        got, status = _scenario(side, long)
        assert status is RequestStatus.WAITING_FOR_REMOTE_KV
        assert got == ref
