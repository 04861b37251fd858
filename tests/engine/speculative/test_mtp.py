"""Speculative decoding with the file's own MTP block (hitenter/engine/speculative/mtp.py) on the tiny
Qwen3.5 files with one (hitenter/testing/tiny_qwen35.py MTP_HYBRIDS).

- The drafter's protocol against llama.cpp: fed llama.cpp's own trunk hidden states (h_nextn, the goldens of
  scripts/make_mtp_goldens.py), the block's logits for the newest token are llama.cpp's MTP logits at that
  position (row p pairs the token at p with h at p - 1, common/speculative.cpp's draft-mtp), on the first
  proposal over a whole prompt and after a verification accepted tokens (catch-up rows, the rows computed
  from drafts recomputed).
- Through LLM, qwen35 and qwen35moe, several requests batched (greedy and seeded): the tokens and logprobs
  of decoding without speculation, drafting every step (fixed K); on the *_copy files, whose MTP block
  drafts exactly what the trunk predicts, every greedy draft is accepted (the hidden rows reach the right
  requests and positions).
- Through the server: the same text with and without it; the option's validation.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import torch

from hitenter import LLM, SamplingParams
from hitenter.config import SpeculativeConfig
from hitenter.engine.llm_engine import LLMEngine
from hitenter.engine.scheduler import ScheduledRequest, SchedulerOutput
from hitenter.engine.speculative import mtp_proposer
from hitenter.models.loader import load_model
from hitenter.request import Request, RequestStatus
from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_qwen35 import write_tiny_mtp

pytestmark = pytest.mark.slow   # engine builds on tiny files, ~1-3 s each on 2 cores


def _golden(family: str) -> dict[str, np.ndarray]:
    with np.load(GOLDENS / "families" / f"mtp_{family}.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe_mtp"])
def test_drafter_pairs_tokens_and_hidden_rows_as_llama_cpp(family: str, tmp_path: Path) -> None:
    gold = _golden(family)
    path = write_tiny_mtp(tmp_path / f"{family}.gguf", family, seed=int(gold["seed"]))
    net, _ = load_model(path, dtype="float32")
    prop = mtp_proposer(net, str(path), 8, 16, torch.float32)
    seen: list[torch.Tensor] = []
    score = prop.head.compute_logits
    prop.head.compute_logits = lambda h: seen.append(score(h)) or seen[-1]   # type: ignore[method-assign]
    toks, h = gold["tokens"].tolist(), torch.from_numpy(gold["target_h"])
    req = Request("r", toks[:17], SamplingParams(temperature=0.0, max_tokens=64), 64, frozenset(),
                  status=RequestStatus.RUNNING)

    def target_step(start: int, end: int) -> None:   # the target computed positions start..end-1
        prop.observe_target(SchedulerOutput(0, [ScheduledRequest(req, end - start, start, [])], [], end - start),
                            h[start:end])
        req.output_token_ids[:] = toks[17:end + 1]   # its tokens: the golden's
        req.num_computed_tokens = end

    for start, end, k in ((0, 17, 3), (17, 19, 2), (19, 30, 3)):   # a prompt, then verified runs of 2 and 11
        target_step(start, end)
        seen.clear()
        drafts = prop.propose([req], [k], [], [None])[0].token_ids
        ref = gold["mtp_logits"][end]    # the block's row at `end`: the token there, h at end - 1
        got = seen[0][-1].double().numpy()
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), (end, np.abs(got - ref).max())
        assert drafts[0] == int(np.argmax(got)) and len(drafts) == k
    prop.release("r")
    assert not prop.request_ids and prop.kv.num_free_blocks == 8


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe_mtp"])
def test_a_cached_prefix_gives_the_logits_of_llama_cpp(family: str, tmp_path: Path) -> None:
    """A request whose target resumed at position 16 (its rows before that never observed): the block's K/V of
    positions 0-15 and the target's row at 15 come from the blocks an earlier request with that prefix left
    cached, and the block's logits at the newest position are llama.cpp's. Without the block's own cache the
    cached positions read zeros for the target's rows and the logits miss."""
    gold = _golden(family)
    path = write_tiny_mtp(tmp_path / f"{family}.gguf", family, seed=int(gold["seed"]))
    net, _ = load_model(path, dtype="float32")
    toks, h = gold["tokens"].tolist(), torch.from_numpy(gold["target_h"])
    errors = []
    for caching in (True, False):
        prop = mtp_proposer(net, str(path), 8, 8, torch.float32, prefix_caching=caching)
        seen: list[torch.Tensor] = []
        score = prop.head.compute_logits
        prop.head.compute_logits = lambda x, score=score, seen=seen: seen.append(score(x)) or seen[-1]  # type: ignore[method-assign]
        for rid, start, end in (("a", 0, 21), ("b", 16, 33)):   # b's target computed only positions 16..32
            req = Request(rid, toks[:end], SamplingParams(temperature=0.0, max_tokens=8), 8, frozenset(),
                          status=RequestStatus.RUNNING)
            prop.observe_target(SchedulerOutput(0, [ScheduledRequest(req, end - start, start, [])], [], end - start),
                                h[start:end])
            req.num_computed_tokens = end
            req.output_token_ids[:] = toks[end:end + 1]
            seen.clear()
            prop.propose([req], [1], [], [None])
            prop.release(rid)
        ref = gold["mtp_logits"][33]
        errors.append(np.abs(seen[0][-1].double().numpy() - ref).max() / np.abs(ref).max())
        assert not prop.request_ids and prop.kv.num_free_blocks == 8
    assert errors[0] <= 1e-4 and errors[1] > 1e-3, errors


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(rng.randint(3, 60))] for _ in range(n)]


def _params(n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=14 + i % 5, ignore_eos=True, logprobs=1) if i % 3 else
            SamplingParams(temperature=0.8, seed=7 + i, max_tokens=12, ignore_eos=True, logprobs=1) for i in range(n)]


def _sig(out):  # noqa: ANN001, ANN202 -- tokens and logprobs, bitwise
    c = out.outputs[0]
    return c.token_ids, [(p.chosen.token_id, p.chosen.logprob) for p in c.logprobs]


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe_mtp", "qwen35_copy", "qwen35moe_copy"])
def test_batched_requests_emit_the_tokens_of_decoding_without_it(family: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_SPEC_ADAPTIVE", "0")   # draft K every step, whatever the acceptance
    path = str(write_tiny_mtp(tmp_path / f"{family}.gguf", family, seed=3, quant="Q8_0"))
    prompts, params = _prompts(6), _params(6)
    ref = LLM(path).generate(prompts, params)
    spec = LLM(path, speculative_method="mtp", num_speculative_tokens=3)
    got = spec.generate(prompts, params)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]
    stats = spec.engine.spec.stats
    assert stats.num_draft_tokens > 0
    if family.endswith("_copy"):   # the block drafts the trunk's own next token: every greedy draft accepted
        for o, p in zip(got, params, strict=True):
            if p.temperature == 0:
                assert o.extra["spec_decode"]["acceptance_rate"] == 1.0, o.extra
    proposer = spec.engine.spec.proposer
    assert not proposer.request_ids and proposer.kv.num_free_blocks == proposer.cache.shape[2]


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe_copy"])
def test_server_texts_are_the_same_with_and_without_it(family: str, tmp_path: Path) -> None:
    """Four concurrent completions (batched by the engine) give the same texts with and without MTP drafting."""
    path = str(write_tiny_mtp(tmp_path / f"{family}.gguf", family, seed=3, quant="Q8_0"))
    prompts = ["abc def", "the cat", "x y z w", "hello there"]
    texts = []
    for opts in ({}, {"speculative_method": "mtp", "num_speculative_tokens": 3}):
        eng = LLMEngine(path, **opts)
        with live_server(create_app(eng, "m", playground=False)) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)

            def complete(prompt: str, client: openai.OpenAI = client) -> str:
                r = client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0,
                                              extra_body={"ignore_eos": True})
                return r.choices[0].text

            with ThreadPoolExecutor(len(prompts)) as pool:
                texts.append(list(pool.map(complete, prompts)))
        if opts:
            assert eng.spec.stats.num_draft_tokens > 0
            if family.endswith("_copy"):
                assert eng.spec.stats.num_accepted_tokens == eng.spec.stats.num_draft_tokens
    assert texts[0] == texts[1]


def test_the_option_is_validated(tiny_llama_path: Path) -> None:
    assert SpeculativeConfig(speculative_method="mtp").num_speculative_tokens == 4
    with pytest.raises(ValueError, match="not used with speculative_method='mtp'"):
        SpeculativeConfig(speculative_method="mtp", speculative_model="x.gguf")
    with pytest.raises(Exception, match="no MTP drafter"):
        LLM(str(tiny_llama_path), speculative_method="mtp")


def test_rejections_with_one_sequence_and_no_prefix_cache_fit_the_state_slots(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A verification that rejects holds the slot its accepted run ended in until the next step restores it,
    beside that step's K scratch slots and the live one: the slots are sized for it with no snapshot slack."""
    monkeypatch.setenv("HITENTER_SPEC_ADAPTIVE", "0")
    path = str(write_tiny_mtp(tmp_path / "qwen35.gguf", "qwen35", seed=3, quant="Q8_0"))
    llm = LLM(path, max_num_seqs=1, enable_prefix_caching=False, speculative_method="mtp", num_speculative_tokens=3)
    out = llm.generate(_prompts(2, seed=1), [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * 2)
    assert all(len(o.outputs[0].token_ids) == 24 for o in out)
    assert llm.engine.spec.stats.num_draft_tokens > llm.engine.spec.stats.num_accepted_tokens   # rejections ran
    state = llm.engine.kv_manager.state
    assert state.num_free_slots == state.num_slots


def _drafting_run(llm: LLM, prompt: list[int]) -> tuple[list[list[int]], int, int, tuple]:
    """Generate greedily from `prompt`: every draft proposed, the drafted and accepted counts, the output."""
    drafts: list[list[int]] = []
    prop = llm.engine.spec.proposer
    propose = prop.propose

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = propose(*args, **kwargs)
        drafts.extend(d.token_ids for d in out)
        return out

    prop.propose = spy   # type: ignore[method-assign]
    stats = llm.engine.spec.stats
    d0, a0 = stats.num_draft_tokens, stats.num_accepted_tokens
    out = llm.generate([prompt], [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)])[0]
    prop.propose = propose   # type: ignore[method-assign]
    return drafts, stats.num_draft_tokens - d0, stats.num_accepted_tokens - a0, _sig(out)


@pytest.mark.parametrize("family", ["qwen35", "qwen35_copy"])
def test_drafts_after_a_prefix_cache_hit_are_those_of_a_cold_run(family: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt that resumes from cached blocks and a state snapshot drafts what it drafts with nothing cached:
    the block's K/V of the cached positions and the target's hidden row before the first recomputed one come
    back with the blocks (the acceptance counters agree too)."""
    monkeypatch.setenv("HITENTER_SPEC_ADAPTIVE", "0")
    path = str(write_tiny_mtp(tmp_path / f"{family}.gguf", family, seed=3, quant="Q8_0"))
    rng = random.Random(5)
    first = [rng.randrange(3, 250) for _ in range(70)]
    second = first + [rng.randrange(3, 250) for _ in range(9)]
    opts = {"speculative_method": "mtp", "num_speculative_tokens": 3, "block_size": 16}
    warm = LLM(path, **opts)
    _drafting_run(warm, first)
    hits = warm.engine.kv_manager.prefix_cache_stats.hits
    after_hit = _drafting_run(warm, second)
    assert warm.engine.kv_manager.prefix_cache_stats.hits - hits >= 64   # resumed at a snapshot, 4+ blocks in
    cold = _drafting_run(LLM(path, **opts), second)
    assert cold[1] > 0
    assert after_hit == cold
