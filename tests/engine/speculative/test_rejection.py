"""Speculative sampling keeps the target's distribution exactly (Leviathan et al. 2023, Theorem 1):
40,000 seeded rows of the rejection sampler with fixed draft/target probabilities match the target
(chi-square and total variation), while two classic mistakes fail the same check. End to end, the
engine's second output token has the same distribution with and without a draft model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from hitenter import LLM, SamplingParams
from hitenter.engine.speculative.rejection import greedy_accept, point_mass, rejection_sample
from hitenter.testing.tiny_model import write_tiny_gguf

N, K = 40_000, 3
P = torch.tensor([[0.50, 0.20, 0.10, 0.10, 0.05, 0.05],
                  [0.05, 0.05, 0.40, 0.30, 0.10, 0.10],
                  [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
                  [0.10, 0.10, 0.10, 0.10, 0.10, 0.50]])
Q = torch.tensor([[0.05, 0.10, 0.10, 0.15, 0.30, 0.30],
                  [0.30, 0.05, 0.05, 0.30, 0.20, 0.10],
                  [0.10, 0.40, 0.10, 0.10, 0.20, 0.10]])
V = P.shape[1]
CHI2_LIMIT = 30.0     # 5 degrees of freedom: P(chi2 > 30) ~ 1.5e-5


def tv_limit(n: int) -> float:
    """Total variation allowed for n samples (~3x its typical value sqrt(V / (2 pi n)))."""
    return 1.5 * (V / n) ** 0.5

Rule = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def _wrong_accept_q_over_p(p: Tensor, q: Tensor, draft: Tensor, u: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """Accepts with min(1, q/p) instead of min(1, p/q)."""
    return _generic(p, q, draft, u, e, "q/p")


def _wrong_resample_from_p(p: Tensor, q: Tensor, draft: Tensor, u: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """Resamples from p instead of norm(max(p - q, 0)) after a rejection."""
    return _generic(p, q, draft, u, e, "resample_p")


def _generic(p: Tensor, q: Tensor, draft: Tensor, u: Tensor, e: Tensor, mistake: str) -> tuple[Tensor, Tensor]:
    rows = torch.arange(p.shape[0])
    px = p[:, :K].gather(2, draft[..., None])[..., 0]
    qx = q.gather(2, draft[..., None])[..., 0]
    accept = u * px < qx if mistake == "q/p" else u * qx < px
    num_acc = accept.long().cumprod(1).sum(1)
    p_at = p[rows, num_acc]
    q_at = torch.cat([q, torch.zeros(p.shape[0], 1, V)], 1)[rows, num_acc]
    w = p_at if mistake == "resample_p" else (p_at - q_at).clamp_min(0)
    return num_acc, (w / e).argmax(-1)


def _draws(rule: Rule, q: Tensor | None = None, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(draft [N,K], num_accepted [N], next_token [N]) for N rows drawn from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    if q is None:
        q = Q
        draft = torch.stack([torch.multinomial(Q[j], N, replacement=True, generator=g) for j in range(K)], 1)
    else:
        draft = q.argmax(-1).expand(N, K).clone()          # a point mass: the same guess in every row
    u = torch.rand(N, K, generator=g)
    e = torch.empty(N, V).exponential_(generator=g)
    num_acc, tok = rule(P.expand(N, K + 1, V), q.expand(N, K, V), draft, u, e)
    return draft, num_acc, tok


def _emitted(draft: Tensor, num_acc: Tensor, tok: Tensor, pos: int) -> tuple[Tensor, Tensor]:
    """Token emitted at position `pos` in the rows that reach it within this pass (all rows for pos 0)."""
    reach = num_acc >= pos
    tokens = torch.where(num_acc > pos, draft[:, min(pos, K - 1)], tok)
    return tokens[reach], reach


def _chi2_tv(samples: Tensor, p: Tensor) -> tuple[float, float]:
    n = samples.numel()
    obs = torch.bincount(samples, minlength=V).double()
    exp = p.double() * n
    return float(((obs - exp) ** 2 / exp).sum()), float((obs / n - p.double()).abs().sum() / 2)


@pytest.mark.parametrize("pos", range(K + 1))
def test_rejection_sampler_matches_target_at_every_position(pos):
    draft, num_acc, tok = _draws(rejection_sample)
    samples, _ = _emitted(draft, num_acc, tok, pos)
    assert samples.numel() > 1000
    chi2, tv = _chi2_tv(samples, P[pos])
    assert chi2 < CHI2_LIMIT and tv < tv_limit(samples.numel()), (pos, chi2, tv)


def test_prompt_lookup_point_mass_matches_target():
    q = point_mass(torch.tensor([[0, 2, 5]]), V)[0]            # guesses: the likely, a fair and a likely one
    draft, num_acc, tok = _draws(rejection_sample, q=q, seed=1)
    for pos in range(K + 1):
        samples, _ = _emitted(draft, num_acc, tok, pos)
        chi2, tv = _chi2_tv(samples, P[pos])
        assert chi2 < CHI2_LIMIT and tv < tv_limit(samples.numel()), (pos, chi2, tv)
    # acceptance of a point-mass guess x is p(x): position 0 accepts token 0 half the time
    assert abs(float((num_acc >= 1).double().mean()) - 0.5) < 0.01


@pytest.mark.parametrize("rule", [_wrong_accept_q_over_p, _wrong_resample_from_p])
def test_wrong_acceptance_rules_fail_the_same_check(rule):
    draft, num_acc, tok = _draws(rule)
    samples, _ = _emitted(draft, num_acc, tok, 0)
    chi2, tv = _chi2_tv(samples, P[0])
    assert chi2 > 10 * CHI2_LIMIT and tv > 2 * tv_limit(samples.numel()), (chi2, tv)


def test_identical_draft_is_always_accepted():
    p = P.expand(N, K + 1, V)
    g = torch.Generator().manual_seed(3)
    draft = torch.stack([torch.multinomial(P[j], N, replacement=True, generator=g) for j in range(K)], 1)
    num_acc, _ = rejection_sample(p, p[:, :K], draft, torch.rand(N, K, generator=g),
                                  torch.empty(N, V).exponential_(generator=g))
    assert bool((num_acc == K).all())


def test_greedy_accept():
    assert greedy_accept([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]
    assert greedy_accept([5, 9, 7, 8], [5, 6, 7]) == [5, 9]
    assert greedy_accept([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert greedy_accept([3], []) == [3]


@pytest.mark.slow
def test_engine_sampling_distribution_unchanged_by_draft_model(tmp_path, tiny_qwen2_path):
    """Two-sample chi-square on the 2nd and 3rd output tokens (the first speculated ones): 1,500 seeded
    requests with a partly agreeing draft vs plain decoding."""
    draft = write_tiny_gguf(tmp_path / "draft.gguf", arch="qwen2", seed=1, layers=1)
    n = 1500
    params = [SamplingParams(temperature=1.0, top_k=6, seed=s, max_tokens=3, ignore_eos=True) for s in range(n)]
    prompt = [11, 40, 7, 99, 123]
    opts = dict(max_num_seqs=256, max_num_batched_tokens=4096)
    plain = LLM(str(tiny_qwen2_path), **opts).generate([prompt] * n, params)
    spec_llm = LLM(str(tiny_qwen2_path), speculative_model=str(draft), num_speculative_tokens=2, **opts)
    spec = spec_llm.generate([prompt] * n, [SamplingParams(temperature=1.0, top_k=6, seed=10_000 + s, max_tokens=3,
                                                           ignore_eos=True) for s in range(n)])
    stats = spec_llm.engine.spec_decode
    assert stats is not None and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    for pos in (1, 2):
        a = Counter(o.outputs[0].token_ids[pos] for o in plain)
        b = Counter(o.outputs[0].token_ids[pos] for o in spec)
        keys = [k for k in a.keys() | b.keys() if a[k] + b[k] >= 10]
        rest_a = n - sum(a[k] for k in keys)
        rest_b = n - sum(b[k] for k in keys)
        cells = [(a[k], b[k]) for k in keys] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
        chi2 = sum((x - y) ** 2 / (x + y) for x, y in cells)     # equal sample sizes
        dof = len(cells) - 1
        assert chi2 < dof + 5 * (2 * dof) ** 0.5, (pos, chi2, dof)
