"""A mock model runner for the scheduler's tests: it stores fake K/V through the block tables and reads
the whole context back, so a wrong block table, a bad prefix hit or a lost token changes what it samples.

The mock writes (token, position) into a slot per new token and, for each caught-up request, reads
the whole context back through the block table; its "sampled" token is a hash of what it read."""

from __future__ import annotations

import hashlib
import random

from hitenter.config import SchedulerConfig
from hitenter.engine.scheduler import Scheduler, SchedulerOutput
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.request import Request, RequestStatus
from hitenter.sampling_params import SamplingParams

VOCAB = 40


def req(rid: str, prompt: list[int], max_tokens: int = 4) -> Request:
    """A request for `prompt` that stops after `max_tokens`."""
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens), max_tokens)


class MockRunner:
    """Runs a SchedulerOutput: stores (token, position) per new slot and samples a hash of the context it
    reads back through each caught-up request's block table."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.store: dict[int, tuple[int, int]] = {}

    def run(self, out: SchedulerOutput) -> dict[str, list[int]]:
        bs = self.kv.block_size
        for sr in out.scheduled:
            toks = sr.request.all_token_ids
            for p in range(sr.num_computed_tokens, sr.num_computed_tokens + sr.num_new_tokens):
                blk = self.kv.pool.blocks[sr.block_ids[p // bs]]
                assert blk.ref_cnt == 1 and blk.block_hash is None, "write into a shared/cached block"
                self.store[blk.block_id * bs + p % bs] = (toks[p], p)
        sampled: dict[str, list[int]] = {}
        for sr in out.scheduled:
            if not sr.caught_up:
                continue
            r = sr.request
            ctx = [self.store[sr.block_ids[p // bs] * bs + p % bs] for p in range(r.num_tokens)]
            assert ctx == [(t, p) for p, t in enumerate(r.all_token_ids)], f"{r.request_id}: bad K/V"
            digest = hashlib.blake2b(repr([t for t, _ in ctx]).encode(), digest_size=8).digest()
            sampled[r.request_id] = [int.from_bytes(digest, "little") % VOCAB]
        return sampled


def step(s: Scheduler, runner: MockRunner) -> tuple[SchedulerOutput, dict[str, list[int]]]:
    """One schedule / run / update, checking the step's budgets, its stops and the cache's invariants."""
    out = s.schedule()
    cfg = s.config
    assert out.num_batched_tokens == sum(x.num_new_tokens for x in out.scheduled) <= cfg.max_num_batched_tokens
    assert len(out.scheduled) <= cfg.max_num_seqs and s.num_running <= cfg.max_num_seqs
    assert len({x.request.request_id for x in out.scheduled}) == len(out.scheduled)
    sampled = runner.run(out)
    finished = s.update(out, sampled)     # the scheduler decides token stops (here: max_tokens)
    for r in finished:
        assert r.status is RequestStatus.FINISHED_LENGTH and r.num_output_tokens == r.max_tokens
    for rid in sampled:
        r = s.get_request(rid)
        assert r is None or r.num_output_tokens < r.max_tokens
    s.kv.check_invariants()
    return out, sampled


def random_requests(seed: int, n: int = 50) -> list[tuple[int, Request]]:
    """`n` (arrival step, request) pairs, most prompts sharing one of four prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 20))] for _ in range(4)]
    out = []
    for i in range(n):
        prompt = (rng.choice(prefixes) if rng.random() < 0.6 else []) + [
            rng.randrange(VOCAB) for _ in range(rng.randint(1, 24))]
        out.append((rng.randint(0, 40), req(f"q{i}", prompt, max_tokens=rng.randint(1, 12))))
    return out


def lane_scheduler(fresh: int, num_blocks: int = 64, max_batched: int = 64,
                   max_seqs: int = 8) -> tuple[Scheduler, MockRunner]:
    """A scheduler with a fresh lane of `fresh` tokens (block size 4) and its mock runner."""
    kv = KVCacheManager(num_blocks, 4)
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_batched, max_model_len=4096,
                          fresh_tokens=fresh)
    return Scheduler(cfg, kv), MockRunner(kv)


def timed_step(s: Scheduler, run: MockRunner, seconds: float) -> list[str]:
    """One step recorded as taking `seconds`; the ids of the requests it ran."""
    out, _ = step(s, run)
    s.record_step(out, seconds)
    return [x.request.request_id for x in out.scheduled]
