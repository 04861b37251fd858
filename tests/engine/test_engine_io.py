"""Engine I/O without a shared lock: arrivals and aborts go through the inbox, state reads come from the
published snapshot, so nothing outside the engine thread waits on a step; and the kernel plan is decided
once, at load."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hitenter import SamplingParams
from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.llm_engine import LLMEngine

STEP_S = 0.25     # each model step is made this slow: a caller that waited on one would show it


@pytest.fixture
def slow_engine(tiny_llama_path):
    eng = LLMEngine(str(tiny_llama_path), max_model_len=256)
    real, steps = eng.runner.execute, []

    def execute(sched):
        out = real(sched)
        if sched.scheduled:
            time.sleep(STEP_S)
            steps.append([sr.request.request_id for sr in sched.scheduled])
        return out

    eng.runner.execute = execute
    ae = AsyncLLMEngine(eng)
    yield ae, steps
    ae.shutdown()


def _long():
    return SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


def test_add_abort_and_reads_do_not_wait_on_a_step(slow_engine):
    ae, steps = slow_engine

    async def main():
        rid, q = ae.add_request([5, 6, 7], _long())
        await q.get()                       # it is decoding: a step is (almost) always in flight now
        ae.snapshot(kv_blocks=True)         # the one bounded wait: the first block-map read after a quiet spell
        worst = 0.0
        for i in range(6):
            t0 = time.perf_counter()
            r2, _ = ae.add_request([9, 10], SamplingParams(max_tokens=2), request_id=f"x{i}")
            ae.abort(r2)
            ae.snapshot()
            ae.run_on_snapshot(lambda e: e.kv_manager.snapshot(), ae.engine)
            worst = max(worst, time.perf_counter() - t0)
            await asyncio.sleep(STEP_S / 3)
        ae.abort(rid)
        return worst

    assert asyncio.run(main()) < STEP_S / 2


def test_a_request_added_mid_run_gets_its_first_token_within_a_few_steps(slow_engine):
    ae, steps = slow_engine

    async def main():
        long_id, lq = ae.add_request([5, 6, 7], _long())
        for _ in range(3):
            await lq.get()
        at = len(steps)
        t0 = time.perf_counter()
        _, q = ae.add_request([11, 12, 13], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        out = await q.get()
        ae.abort(long_id)
        return at, out, time.perf_counter() - t0

    at, out, dt = asyncio.run(main())
    first = next(i for i, ids in enumerate(steps) if out.request_id in ids)
    assert first - at <= 2 and out.outputs[0].delta_token_ids and dt < 4 * STEP_S


def test_abort_frees_blocks_within_one_step(slow_engine):
    ae, steps = slow_engine
    eng = ae.engine
    total = eng.parts.num_blocks
    freed_at: list[int] = []
    ready = threading.Event()
    eng.subscribe(lambda ev: freed_at.append(len(steps)) if ev.num_free_blocks == total and ready.is_set() else None)

    async def main():
        rid, q = ae.add_request(list(range(5, 60)), _long())
        await q.get()
        assert eng.snapshot().num_free_blocks < total
        at = len(steps)
        ready.set()
        ae.abort(rid)
        for _ in range(100):
            if eng.snapshot().num_free_blocks == total:
                return at
            await asyncio.sleep(0.02)
        raise AssertionError("blocks never freed")

    at = asyncio.run(main())
    assert len(steps) - at <= 1
    assert eng.snapshot().num_running == 0


def test_the_kernel_plan_is_decided_once(tiny_llama_path, monkeypatch):
    from hitenter.models import decode_kernel, plan

    built = []
    real_build = plan.build_plan
    monkeypatch.setattr("hitenter.engine.engine_setup.build_plan", lambda *a: built.append(1) or real_build(*a))
    eng = LLMEngine(str(tiny_llama_path))
    checks = []
    monkeypatch.setattr(decode_kernel, "supports", lambda *a: checks.append(1) or True)
    eng.add_request(None, [5, 6, 7], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    assert built == [1] and checks == []          # no per-layer, per-step kernel check
    assert eng.plan is eng.runner.plan and eng.plan.attention_kernel == (decode_kernel.load() is not None)
    assert "attention kernel" in eng.plan.describe()


def test_kernel_inputs_are_checked():
    """Block ids and context lengths are checked once per step in Python; the C code refuses ctx < 1 too."""
    import torch

    from hitenter.models import decode_kernel

    with pytest.raises(ValueError, match="block id 9 outside"):
        decode_kernel.check_rows([1, 2], [0, 9], 8)
    with pytest.raises(ValueError, match="sees 0 keys"):
        decode_kernel.check_rows([0], [0], 8)
    if decode_kernel.load() is None:
        return
    cache, q = torch.zeros(2, 2, 4, 4, 16), torch.randn(1, 4, 16)
    one = lambda *v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    assert torch.isfinite(decode_kernel.decode_attention(q, cache, one(3), one(0), one(1), 0.25)).all()
    with pytest.raises(ValueError, match="ctx < 1"):
        decode_kernel.decode_attention(q, cache, one(0), one(0), one(1), 0.25)
