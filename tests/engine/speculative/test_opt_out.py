"""A request can opt out of speculative decoding (SamplingParams.speculate=False) on an engine set up for it:
it is never drafted for (no drafted token, no verification pass, no proposer state), emits the tokens it
emits without speculation, and the requests beside it in the same batches still speculate."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hitenter import LLM, SamplingParams


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(3, 250) for _ in range(rng.randint(6, 40))]
        out.append(p + p)                         # repeated, so prompt lookup finds matches
    return out


GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)
SEEDED = SamplingParams(temperature=0.9, seed=11, max_tokens=20, ignore_eos=True)


def _params(n: int) -> list[SamplingParams]:
    """Alternately opted in and out, greedy and seeded."""
    base = [GREEDY, GREEDY, SEEDED, SEEDED]
    return [dataclasses.replace(base[i % 4], speculate=i % 2 == 0) for i in range(n)]


def _sig(o):
    c = o.outputs[0]
    lps = None if c.logprobs is None else [(p.chosen.token_id, p.chosen.logprob) for p in c.logprobs]
    return c.token_ids, lps, c.text, c.finish_reason


@pytest.fixture(autouse=True)
def fixed_draft_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_SPEC_ADAPTIVE", "0")      # always K drafts where a proposer finds them


def test_speculate_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="^speculate: must be true or false"):
        SamplingParams(speculate=1)   # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_opted_out_requests_are_never_drafted_for(tiny_qwen2_path, method: str) -> None:
    prompts, params = _prompts(8, seed=5), _params(8)
    ref = LLM(str(tiny_qwen2_path)).generate(prompts, params)
    opts = {"speculative_method": "ngram"} if method == "ngram" else {"speculative_model": str(tiny_qwen2_path)}
    llm = LLM(str(tiny_qwen2_path), num_speculative_tokens=3, **opts)
    seen: set[str] = set()                  # every request the proposer ever held state for
    proposer = llm.engine.spec.proposer
    propose = proposer.propose

    def spy(reqs, ks, chain, generators):
        seen.update(r.request_id for r in reqs)
        return propose(reqs, ks, chain, generators)

    proposer.propose = spy
    got = llm.generate(prompts, params)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]      # the same tokens either way
    for o, p in zip(got, params, strict=True):
        st = o.extra["spec_decode"]
        if p.speculate:                      # asked for drafts (the draft model always drafts; lookup may find none)
            assert o.request_id in seen
            assert method == "ngram" or (st["num_verify_steps"] > 0 and st["num_draft_tokens"] > 0), st
        else:
            assert st["num_draft_tokens"] == 0 and st["num_verify_steps"] == 0, st
            assert o.request_id not in seen
    assert llm.engine.spec_decode.num_draft_tokens > 0
