"""The adaptive draft length (engine/speculative/adaptive.py), prompt lookup's longest match, the draft's trimmed
head: none of them may change a token; k must follow the acceptance and the measured costs."""

from __future__ import annotations

import random

import pytest
import torch

from hitenter import LLM, SamplingParams
from hitenter.engine.speculative import AdaptiveK, NgramProposer
from hitenter.engine.speculative.adaptive import StepCosts, expected_tokens
from hitenter.engine.speculative.draft_head import TrimmedHead
from hitenter.testing.tiny_model import write_tiny_gguf


def _costs(ctl: AdaptiveK, t1: float = 0.05, per_row: float = 0.002, draft: float = 0.015) -> None:
    for rows in range(1, ctl.k_max + 2):
        ctl.costs.observe_pass(rows, t1 + per_row * (rows - 1))
    ctl.costs.observe_draft(1, draft)


def test_expected_tokens_and_cost_interpolation():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    c = StepCosts()
    assert c.target(3) is None
    c.observe_pass(1, 0.05)
    assert c.target(1) == 0.05 and c.target(3) == pytest.approx(0.05 * (1 + 2 * 0.05))   # the prior slope
    c.observe_pass(5, 0.07)
    assert c.target(3) == pytest.approx(0.06)                                        # interpolated
    assert c.target(7) == pytest.approx(0.08)                                        # the measured slope


def test_k_falls_when_nothing_is_accepted_and_probes():
    ctl = AdaptiveK(6, probe_every=4)
    _costs(ctl, draft=0.005)
    first = ctl.choose("r")
    assert first >= 3                                  # the prior (0.7) with cheap drafts: draft several
    ks = []
    for _ in range(12):
        k = ctl.choose("r")
        ks.append(k)
        ctl.record("r", k, 0)                          # a k of 0 drafts nothing: record ignores it
    assert ks[0] > ks[3] and ks[-8:].count(0) >= 5     # falls, then mostly off
    assert 1 in ks[-8:] and max(ks[-8:]) == 1          # ... probing with one draft every probe_every steps
    assert ctl.alpha("r") < 0.2


def test_k_rises_with_acceptance_and_stays_within_bounds():
    ctl = AdaptiveK(5)
    _costs(ctl)
    for _ in range(20):
        k = ctl.choose("r")
        assert 1 <= k <= 5
        ctl.record("r", k, k)                          # everything accepted
    assert ctl.choose("r") == 5
    off = AdaptiveK(5, allow_off=False)
    _costs(off, draft=0.2)                             # a draft slower than the target: never pays
    for _ in range(10):
        k = off.choose("r")
        off.record("r", k, 0)
        assert k == 1                                  # at least 1 when it may not switch off
    ctl.release("r")
    assert ctl.alpha("r") == pytest.approx(0.7)        # a released request starts again from the prior


def test_expensive_draft_chooses_shorter_runs():
    cheap, dear = AdaptiveK(8), AdaptiveK(8)
    _costs(cheap, draft=0.002)
    _costs(dear, draft=0.03)
    for ctl in (cheap, dear):
        for _ in range(10):
            ctl.record("r", 4, 3)                      # alpha ~ 0.75
    assert cheap.choose("r") > dear.choose("r") >= 1


def test_a_proposal_s_fixed_part_is_not_charged_to_every_step():
    """A draft model's proposal = a fixed catch-up pass + its steps: measured per length, the long runs
    that pay are chosen; spread over the steps of a 1-step proposal, they looked too dear."""
    per_length, per_step = AdaptiveK(4), AdaptiveK(4)
    for ctl in (per_length, per_step):
        for rows in range(1, 6):
            ctl.costs.observe_pass(rows, 0.05 + 0.005 * (rows - 1))
        for _ in range(10):
            ctl.record("r", 4, 4 if _ % 2 else 3)       # alpha ~ 0.87
    for k in range(1, 5):
        per_length.costs.observe_draft(k, 0.025 + 0.005 * k)   # fixed 25 ms + 5 ms a step
    per_step.costs.observe_draft(1, 0.03)                       # the same 1-step proposal, seen alone
    assert per_length.costs.draft(3) == pytest.approx(0.04) and per_step.costs.draft(3) == pytest.approx(0.09)
    assert per_length.choose("r", other_rows=1) == 4
    assert per_step.choose("r", other_rows=1) < 4
    c = StepCosts()
    c.observe_draft(1, 0.03)
    c.observe_draft(3, 0.04)
    assert c.draft(2) == pytest.approx(0.035) and c.draft(5) == pytest.approx(0.05)   # linear, both ways


def test_measures_every_pass_length_once():
    ctl = AdaptiveK(3)
    assert ctl.choose("r") == 3                        # nothing measured: the configured length
    ctl.costs.observe_pass(4, 0.06)
    ctl.costs.observe_draft(3, 0.03)
    seen = []
    for _ in range(3):
        k = ctl.choose("r")
        seen.append(k)
        ctl.costs.observe_pass(k + 1, 0.05 + 0.003 * k)
    assert seen == [0, 1, 2]                           # each unmeasured length once, alone
    assert ctl.choose("r", other_rows=3) >= 0 and sorted(ctl.costs.rows) == [1, 2, 3, 4]


def test_longest_match_first():
    p = NgramProposer(min_n=2, max_n=8)
    #            a  b  c  d  X  ...  b  c  d  Y  ...  a  b  c  d  -> the 4-token match (X follows), not the latest 3
    toks = [1, 2, 3, 4, 50, 51, 9, 2, 3, 4, 60, 61, 7, 1, 2, 3, 4]
    assert p.match(toks) == (4, 4)
    assert p.lookup(toks, 2) == [50, 51]
    assert p.lookup([1, 2, 3, 1, 2, 3, 1, 2], 3) == [3, 1, 2]      # the latest of equally long matches
    assert p.lookup([5, 6, 7, 8], 3) == []                          # no earlier match
    assert p.lookup([5, 6, 9, 6], 3) == []                          # a 1-token match is below min_n
    assert NgramProposer(min_n=1).lookup([5, 6, 9, 6], 3) == [9, 6]


class _RandomK(AdaptiveK):
    """A controller that drafts a random length in [0, k_max] each step (identity must not care)."""

    def __init__(self, k_max: int, seed: int) -> None:
        super().__init__(k_max)
        self.rng = random.Random(seed)

    def choose(self, request_id: str, other_rows: int = 0) -> int:
        return self.rng.randint(0, self.k_max)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(3, 250) for _ in range(rng.randint(5, 40))]
        out.append(p + p[: len(p) // 2])
    return out


def _sig(o):
    c = o.outputs[0]
    lps = None if c.logprobs is None else [(p.chosen.token_id, p.chosen.logprob) for p in c.logprobs]
    return c.token_ids, lps, c.finish_reason


@pytest.fixture(scope="module")
def one_layer_draft(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_gguf(tmp_path_factory.mktemp("adraft") / "one.gguf", arch="qwen2", seed=1, layers=1)


@pytest.mark.parametrize("method", [pytest.param("draft", marks=pytest.mark.slow), "ngram"])
def test_identity_under_varying_k(tiny_qwen2_path, one_layer_draft, method):
    """Greedy and seeded tokens (and logprobs) bitwise those of plain decoding whatever length is drafted
    from step to step; the adaptive controller itself gives the same tokens."""
    prompts = _prompts(6, seed=11)
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)
    seeded = [SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True) for i in range(6)]
    plain = LLM(str(tiny_qwen2_path))
    ref = plain.generate(prompts, greedy)
    opts = {"speculative_method": "ngram"} if method == "ngram" else {"speculative_model": str(one_layer_draft)}
    llm = LLM(str(tiny_qwen2_path), num_speculative_tokens=4, **opts)
    got_adaptive = llm.generate(prompts, greedy)
    llm.engine.spec.adaptive = _RandomK(4, seed=5)
    got = llm.generate(prompts, greedy)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]
    assert [_sig(o) for o in got_adaptive] == [_sig(o) for o in ref]
    seeded_ref = plain.generate(prompts, seeded)
    a = llm.generate(prompts, seeded)
    llm.engine.spec.adaptive = _RandomK(4, seed=6)     # other lengths, same seeds: the same sampled tokens
    b = llm.generate(prompts, seeded)
    # every row drawn with the request's own next seed, as plain decoding draws it: the same tokens
    assert [_sig(o) for o in a] == [_sig(o) for o in seeded_ref]
    assert [_sig(o) for o in b] == [_sig(o) for o in seeded_ref]
    assert llm.engine.spec_decode.num_draft_tokens > 0
    eng = llm.engine
    assert eng.kv_manager.num_free_blocks == eng.parts.num_blocks


@pytest.mark.slow
def test_k_falls_in_the_engine_when_the_draft_never_agrees(tiny_qwen2_path, tmp_path, monkeypatch):
    # The costs a draft model as large as the target has (a draft step = a 1-row target pass), fed to the
    # controller in place of wall-clock seconds, so a loaded machine's noise cannot decide k.
    observe_pass, observe_draft = StepCosts.observe_pass, StepCosts.observe_draft
    monkeypatch.setattr(StepCosts, "observe_pass", lambda self, n, s: observe_pass(self, n, 0.01 * (1 + 0.05 * (n - 1))))
    monkeypatch.setattr(StepCosts, "observe_draft", lambda self, n, s: observe_draft(self, n, 0.01 * n))
    other = write_tiny_gguf(tmp_path / "other.gguf", arch="qwen2", seed=3)   # as large as the target
    llm = LLM(str(tiny_qwen2_path), speculative_model=str(other), num_speculative_tokens=6)
    out = llm.generate([list(range(5, 40))], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))[0]
    st = out.extra["spec_decode"]
    assert st["num_verify_steps"] < 40                 # most steps draft nothing
    assert st["num_draft_tokens"] < 6 * st["num_verify_steps"] / 2


@pytest.mark.slow
def test_trimmed_head_is_the_head_s_first_columns(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "q8.gguf", arch="qwen2", seed=2, quant="Q8_0")
    plain = LLM(str(path))
    model = plain.engine.runner.model
    vocab = model.config.vocab_size
    head = TrimmedHead(model, 96)
    h = torch.randn(5, model.config.hidden_size)
    full, part = model.compute_logits(h), head(h)
    assert part.shape == full.shape
    assert torch.equal(part[:, :96], full[:, :96]) and torch.isinf(part[:, 96:]).all()
    monkeypatch.setenv("HITENTER_DRAFT_VOCAB", "96")
    llm = LLM(str(path), speculative_model=str(path), num_speculative_tokens=3)
    assert isinstance(llm.engine.spec.proposer.runner.logits, TrimmedHead) and vocab > 96
    prompts = _prompts(4, seed=3)
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == \
        [o.outputs[0].token_ids for o in plain.generate(prompts, sp)]
