"""Sampler: distributions after the filters (chi-square on 20,000 seeded draws), seeds, penalties,
logit bias, min_tokens, logprobs and the playground trace."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hitenter.engine.logits_processors import (
    BatchState,
    Penalties,
    TopK,
    TopP,
    _candidates_desc,
    _sorted_desc,
)
from hitenter.engine.sampler import Sampler, SamplingMetadata, make_generator, reshape_distribution
from hitenter.sampling_params import SamplingParams as SP

LOGITS = [2.0, 1.6, 1.2, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0, -2.0]
N_DRAWS = 20_000


# ---------- an independent float64 reference and a chi-square test without scipy ----------

def reference_dist(logits: list[float], temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                   min_p: float = 0.0, top_p_shift: int = 0) -> np.ndarray:
    """Expected sampling distribution; ``top_p_shift`` keeps one token more/less (a deliberate bug)."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    keep = order[:top_k] if top_k > 0 else order
    p = np.exp(x[keep] - x[keep].max())
    p /= p.sum()
    if top_p < 1.0:
        cum = np.cumsum(p)
        n = int(np.searchsorted(cum, top_p) + 1)          # smallest prefix with mass >= top_p
        assert min(abs(cum - top_p)) > 1e-4, "test logits too close to the top_p boundary"
        n = max(1, min(len(keep), n + top_p_shift))
        keep, p = keep[:n], p[:n] / p[:n].sum()
    if min_p > 0.0:
        m = p >= min_p * p.max()
        keep, p = [k for k, mm in zip(keep, m, strict=True) if mm], p[m] / p[m].sum()
    out = np.zeros(len(x))
    out[keep] = p
    return out


def _gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (Numerical Recipes: series / continued fraction)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return 1.0 - total * math.exp(-x + a * math.log(x) - lg)
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Pearson chi-square goodness-of-fit p-value; 0.0 when a token with expected probability 0 was drawn."""
    n = counts.sum()
    if (counts[expected_p == 0] > 0).any():
        return 0.0
    m = expected_p > 0
    if m.sum() == 1:
        return 1.0
    e = n * expected_p[m]
    stat = float(((counts[m] - e) ** 2 / e).sum())
    return _gammaincc((m.sum() - 1) / 2.0, stat / 2.0)


def test_chi2_helper_matches_known_quantiles() -> None:
    assert _gammaincc(0.5, 3.841459 / 2) == pytest.approx(0.05, abs=1e-5)     # df 1
    assert _gammaincc(2.5, 11.0705 / 2) == pytest.approx(0.05, abs=1e-5)      # df 5
    assert _gammaincc(4.5, 21.6660 / 2) == pytest.approx(0.01, abs=1e-5)      # df 9
    assert _gammaincc(4.5, 1.0) == pytest.approx(0.9914676066, abs=1e-9)     # series branch
    assert _gammaincc(3.0, 7.0) == pytest.approx(math.exp(-7) * (1 + 7 + 24.5), rel=1e-10)  # closed form


def draw_counts(params: SP, logits: list[float] = LOGITS, n: int = N_DRAWS, seed0: int = 0) -> np.ndarray:
    """n seeded draws of one token each, batched as n rows of the same logits."""
    x = torch.tensor(logits, dtype=torch.float32).expand(n, len(logits))
    meta = SamplingMetadata([params] * n, [make_generator(seed0 + i) for i in range(n)])
    toks = Sampler()(x, meta).token_ids
    return np.bincount(np.asarray(toks), minlength=len(logits))


SETTINGS = [
    dict(temperature=0.5), dict(temperature=1.0), dict(temperature=1.5),
    dict(top_k=3), dict(top_p=0.8), dict(min_p=0.2),
    dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.1),
    dict(temperature=1.3, top_k=8, top_p=0.7),
]


@pytest.mark.parametrize("kw", SETTINGS, ids=[",".join(f"{k}={v}" for k, v in s.items()) for s in SETTINGS])
def test_draws_match_filtered_distribution(kw: dict) -> None:
    counts = draw_counts(SP(**kw), seed0=1000)
    expected = reference_dist(LOGITS, **kw)
    pval = chi2_pvalue(counts, expected)
    tv = 0.5 * np.abs(counts / counts.sum() - expected).sum()
    assert pval > 1e-3 and tv < 0.02, (kw, counts, expected, pval, tv)


def test_check_rejects_wrong_expected_distributions() -> None:
    """The check has power: off-by-one filters and a wrong temperature are rejected."""
    counts = draw_counts(SP(top_p=0.8), seed0=5000)
    assert chi2_pvalue(counts, reference_dist(LOGITS, top_p=0.8)) > 1e-3
    assert chi2_pvalue(counts, reference_dist(LOGITS, top_p=0.8, top_p_shift=+1)) < 1e-9
    assert chi2_pvalue(counts, reference_dist(LOGITS, top_p=0.8, top_p_shift=-1)) < 1e-9
    counts = draw_counts(SP(top_k=3), seed0=6000)
    assert chi2_pvalue(counts, reference_dist(LOGITS, top_k=4)) < 1e-9
    counts = draw_counts(SP(temperature=1.5), seed0=7000)
    assert chi2_pvalue(counts, reference_dist(LOGITS, temperature=1.3)) < 1e-6


def test_tied_logits_filters_are_deterministic() -> None:
    logits = [1.0, 3.0, 3.0, 3.0, 0.0]
    counts = draw_counts(SP(top_k=2), logits, n=2000)
    assert counts[3] == 0 and counts[1] > 0 and counts[2] > 0   # ties -> lower ids kept
    st = reshape_distribution(torch.tensor(logits), SP(top_p=0.5)).stages[-2]
    assert st.name == "top_p" and st.num_kept == 2


def test_temperature_zero_is_exact_argmax() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1000, generator=g) * 3
    x[5, 10] = x[5, 20] = x[5].max() + 1       # tie -> the lower id
    out = Sampler()(x, SamplingMetadata([SP(temperature=0.0)] * 64, [None] * 64))
    assert out.token_ids == x.argmax(dim=-1).tolist() and out.token_ids[5] == 10


def test_input_logits_not_modified() -> None:
    x = torch.randn(3, 50)
    before = x.clone()
    p = SP(top_k=3, top_p=0.5, temperature=0.7, repetition_penalty=1.5, logit_bias={1: 5})
    Sampler()(x, SamplingMetadata([p] * 3, [make_generator(i) for i in range(3)],
                                  [[1, 2]] * 3, [[3]] * 3, [frozenset({0})] * 3), trace=True)
    assert torch.equal(x, before)


# ---------- seeds ----------

def _run(rows: list[tuple[SP, int | None]], steps: int, vocab: int = 300) -> list[list[int]]:
    """Decode ``steps`` tokens for each row on fixed per-step logits; row r's seed (None = unseeded)."""
    gens = [None if p.is_greedy else make_generator(s) for p, s in rows]
    outs: list[list[int]] = [[] for _ in rows]
    for t in range(steps):
        base = torch.randn(vocab, generator=torch.Generator().manual_seed(100 + t))
        x = base.expand(len(rows), vocab).contiguous()
        meta = SamplingMetadata([p for p, _ in rows], gens, [[1, 2, 3]] * len(rows), outs)
        for r, tok in enumerate(Sampler()(x, meta).token_ids):
            outs[r].append(tok)
    return outs


def test_same_seed_same_tokens_in_any_batch() -> None:
    p = SP(temperature=1.2, top_p=0.95, repetition_penalty=1.1, frequency_penalty=0.3)
    alone = _run([(p, 1234)], 12)[0]
    noise = [(SP(), None), (SP(temperature=0), None), (SP(top_k=5), 9), (SP(), None)]
    for batch, pos in ((noise[:1], 1), (noise, 3), (noise[:2] + noise, 0), (noise + noise, 8)):
        rows = batch[:pos] + [(p, 1234)] + batch[pos:]
        assert _run(rows, 12)[pos] == alone
    assert _run([(p, 1234)], 12)[0] == alone


def test_different_seeds_differ_and_unseeded_vary() -> None:
    p = SP(temperature=1.5)
    a, b = _run([(p, 1), (p, 2)], 15)
    assert a != b
    u1, u2 = _run([(p, None), (p, None)], 15)
    assert u1 != u2
    assert make_generator(None).initial_seed() != make_generator(None).initial_seed()
    assert make_generator(-1).initial_seed() == 2**64 - 1


# ---------- penalties, logit bias, min_tokens ----------

def test_penalties_hand_computed() -> None:
    x = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    p = SP(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    out = Penalties()(x.clone(), BatchState([p], [[0, 1]], [[1, 2, 2]], [frozenset()]))
    # token 0: prompt only, positive -> /2 ; token 1: prompt+output x1, negative -> *2 -0.5 -0.25;
    # token 2: output x2, positive -> /2 -1.0 -0.25 ; tokens 3, 4 unseen
    assert out.tolist() == [[1.0, -2.75, -1.0, 3.0, -2.0]]


def test_presence_frequency_ignore_prompt_and_rows_are_independent() -> None:
    x = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    p = SP(presence_penalty=1.0, frequency_penalty=1.0)
    out = Penalties()(x.clone(), BatchState([p, SP()], [[0, 0], [0]], [[1], [1]], [frozenset()] * 2))
    assert out.tolist() == [[2.0, -1.0, 0.0], [2.0, 1.0, 0.0]]


def test_penalties_change_the_greedy_choice() -> None:
    x = torch.tensor([[1.0, 3.0, 2.5, 0.0]])
    p = SP(temperature=0, repetition_penalty=1.5)
    assert Sampler()(x, SamplingMetadata([p], [None], [[1]], [[]])).token_ids == [2]     # 3/1.5 = 2 < 2.5
    p = SP(temperature=0, frequency_penalty=2.0)
    assert Sampler()(x, SamplingMetadata([p], [None], [[1, 2]], [[]])).token_ids == [1]  # prompt: no effect
    assert Sampler()(x, SamplingMetadata([p], [None], [[]], [[1]])).token_ids == [2]     # 3-2 = 1 < 2.5


def test_logit_bias() -> None:
    x = torch.tensor([[1.0, 3.0, 2.5, 0.0]])
    s = Sampler()
    assert s(x, SamplingMetadata([SP(temperature=0, logit_bias={"3": 3.5})], [None])).token_ids == [3]
    assert s(x, SamplingMetadata([SP(temperature=0, logit_bias={1: -100})], [None])).token_ids == [2]
    p = SP(logit_bias={0: 100})
    counts = draw_counts(p, [1.0, 3.0, 2.5, 0.0], n=500)
    assert counts[0] == 500
    st = reshape_distribution(torch.tensor([1.0, 3.0, 2.5, 0.0]), SP(logit_bias={0: 2.0}))
    lb = {s.name: s for s in st.stages}["logit_bias"]
    ref = torch.softmax(torch.tensor([3.0, 3.0, 2.5, 0.0]), -1)   # candidate order: 1, 2, 0, 3 (raw)
    assert st.candidate_ids == [1, 2, 0, 3]
    assert lb.probs == pytest.approx(ref[[1, 2, 0, 3]].tolist(), abs=1e-6)


def test_min_tokens_suppresses_eos_and_stop_ids() -> None:
    x = torch.tensor([[10.0, 0.0, 9.0, 1.0]]).expand(2, 4).contiguous()   # 0 = eos, 2 = a stop id
    stop = [frozenset({0, 2})] * 2
    for p in (SP(temperature=0, min_tokens=3), SP(temperature=1.0, min_tokens=3)):
        g = [None if p.is_greedy else make_generator(i) for i in range(2)]
        early = Sampler()(x, SamplingMetadata([p] * 2, g, [[]] * 2, [[1, 1]] * 2, stop)).token_ids
        assert 0 not in early and 2 not in early
        late = Sampler()(x, SamplingMetadata([p] * 2, g, [[]] * 2, [[1, 1, 1]] * 2, stop)).token_ids
        assert late[0] in (0, 2)


# ---------- logprobs ----------

def test_logprobs_are_raw_log_softmax_with_ranks() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 200, generator=g) * 2
    params = [SP(temperature=0.5, top_k=5, logprobs=5, repetition_penalty=1.3), SP(temperature=0, logprobs=0),
              SP(), SP(temperature=1.0, logit_bias={7: 100}, logprobs=3)]
    out = Sampler()(x, SamplingMetadata(params, [make_generator(i) for i in range(4)],
                                        [[1, 2]] * 4, [[3]] * 4))
    ref = torch.log_softmax(x, dim=-1)
    assert out.logprobs[2] is None
    assert out.token_ids[3] == 7
    for i in (0, 1, 3):
        lp = out.logprobs[i]
        assert lp is not None and lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(float(ref[i, lp.token_id]), abs=1e-6)
        order = torch.argsort(ref[i], descending=True).tolist()
        assert lp.rank == order.index(lp.token_id) + 1
        k = params[i].logprobs
        assert [t for t, _, _ in lp.top] == order[:k]
        assert [r for _, _, r in lp.top] == list(range(1, k + 1))
        assert [v for _, v, _ in lp.top] == pytest.approx(ref[i, order[:k]].tolist(), abs=1e-6)
    assert out.logprobs[1].rank == 1 and out.logprobs[1].top == []   # type: ignore[union-attr]


# ---------- trace ----------

def test_trace_stages_and_draw() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 500, generator=g) * 2
    p = SP(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05, seed=77)
    meta = SamplingMetadata([p, SP(temperature=0)], [make_generator(77), None])
    out = Sampler()(x, meta, trace=True)
    assert out.trace is not None
    t = out.trace[0]
    names = [s.name for s in t.stages]
    assert names == ["raw", "penalties", "logit_bias", "min_tokens", "grammar", "temperature", "top_k", "top_p", "min_p"]
    assert len(t.candidate_ids) == 50 and t.candidate_ids[0] == int(x[0].argmax())
    st = {s.name: s for s in t.stages}
    assert st["raw"].num_kept == 500 and st["top_k"].num_kept == 20 and sum(st["top_k"].kept) == 20
    assert st["min_p"].num_kept <= st["top_p"].num_kept <= 20
    assert sum(st["min_p"].probs) == pytest.approx(1.0, abs=1e-5)
    assert st["raw"].probs == pytest.approx(torch.softmax(x[0], -1)[t.candidate_ids].tolist(), abs=1e-6)
    assert t.draw is not None and t.draw.token_id == out.token_ids[0] and t.draw.seed == 77
    assert t.draw.method == "exponential_race" and t.draw.q is not None and t.draw.chosen_q is not None
    i = t.candidate_ids.index(t.draw.token_id)
    final = st["min_p"].probs
    scores = [pp / q for pp, q in zip(final, t.draw.q, strict=True)]
    assert max(range(len(scores)), key=scores.__getitem__) == i
    assert out.trace[1].draw is not None and out.trace[1].draw.method == "greedy"
    # the playground's recomputation agrees with the trace
    re = reshape_distribution(x[0], p)
    assert re.candidate_ids == t.candidate_ids
    assert [s.probs for s in re.stages] == [s.probs for s in t.stages]


# ---------- the fast paths agree with plain references ----------

def test_penalties_match_dense_reference_on_random_rows() -> None:
    rng = torch.Generator().manual_seed(11)
    v, n = 40, 6
    x = torch.randn(n, v, generator=rng) * 3
    params = [SP(repetition_penalty=1 + 0.2 * i, frequency_penalty=0.1 * i - 0.3, presence_penalty=0.5 - 0.2 * i)
              for i in range(n)]
    params[2] = SP()
    prompts = [torch.randint(0, v, (i * 3,), generator=rng).tolist() for i in range(n)]
    outputs = [torch.randint(0, v, (i * 5 + 1,), generator=rng).tolist() for i in range(n)]
    got = Penalties()(x.clone(), BatchState(params, prompts, outputs, [frozenset()] * n))
    for i, p in enumerate(params):
        for t in range(v):
            want = float(x[i, t])
            c = outputs[i].count(t)
            if t in prompts[i] or c:
                want = want / p.repetition_penalty if want > 0 else want * p.repetition_penalty
            want = want - p.frequency_penalty * c - (p.presence_penalty if c else 0.0)
            assert float(got[i, t]) == pytest.approx(want, abs=1e-5), (i, t)


def test_top_k_and_candidate_sort_are_stable_under_ties() -> None:
    rng = torch.Generator().manual_seed(12)
    for _ in range(50):
        x = torch.randint(-3, 4, (5, 64), generator=rng).to(torch.float32)     # many ties
        x[torch.rand(5, 64, generator=rng) < 0.85] = float("-inf")
        x[:, 0] = 5.0
        ref_vals, ref_ids = _sorted_desc(x)
        vals, ids = _candidates_desc(x)
        m = vals.shape[1]
        assert torch.equal(vals, ref_vals[:, :m])
        finite = torch.isfinite(vals)
        assert torch.equal(ids[finite], ref_ids[:, :m][finite])
        k = int(torch.randint(1, 10, (1,), generator=rng))
        ps = [SP(top_k=k)] * 5
        got = TopK()(x.clone(), BatchState(ps, [[]] * 5, [[]] * 5, [frozenset()] * 5))
        for r in range(5):
            kept = ref_ids[r, :k][torch.isfinite(ref_vals[r, :k])].sort().values
            assert torch.equal(torch.isfinite(got[r]).nonzero().flatten(), kept)


def test_top_p_fast_path_equals_full_sort_path() -> None:
    rng = torch.Generator().manual_seed(13)
    x = torch.randn(8, 1000, generator=rng) * 2
    ps = [SP(top_k=30, top_p=0.6 + 0.05 * i) for i in range(8)]
    b = BatchState(ps, [[]] * 8, [[]] * 8, [frozenset()] * 8)
    masked = TopK()(x.clone(), b)
    fast = TopP()(masked.clone(), b)                       # 30 finite per row -> topk path
    ps_full = [SP(top_p=p.top_p) for p in ps]
    pad = masked.clone()
    pad[:, :300] = torch.where(torch.isfinite(pad[:, :300]), pad[:, :300], torch.full_like(pad[:, :300], -1e4))
    slow = TopP()(pad, BatchState(ps_full, [[]] * 8, [[]] * 8, [frozenset()] * 8))  # >V/4 finite: full sort
    assert torch.equal(torch.isfinite(fast), torch.isfinite(slow) & torch.isfinite(masked))


def test_logprobs_top_alternatives_break_ties_by_lower_id() -> None:
    x = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, 1.0, 2.0, -1.0]])
    for k, want in ((2, [1, 3]), (3, [1, 3, 6]), (4, [1, 3, 6, 2]), (5, [1, 3, 6, 2, 4])):
        out = Sampler()(x, SamplingMetadata([SP(temperature=0, logprobs=k)], [None]))
        lp = out.logprobs[0]
        assert lp is not None and [t for t, _, _ in lp.top] == want and lp.token_id == 1 and lp.rank == 1
    out = Sampler()(x, SamplingMetadata([SP(temperature=0, logprobs=3, logit_bias={7: 10})], [None]))
    assert out.logprobs[0] is not None and out.logprobs[0].rank == 8 and out.logprobs[0].token_id == 7


# ---------- mixed batches: plain greedy rows keep the fast path ----------

class _OnlyToken:
    """A stand-in grammar constraint that allows one token."""

    terminated = False

    def __init__(self, token: int) -> None:
        self.token = token

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        bitmask[row, self.token // 32] = 1 << (self.token % 32)


def test_mixed_batch_plain_greedy_rows_skip_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the rows that need processing (a grammar, sampling, penalties) go through the chain; every
    row's token equals the one it gets alone (an independent per-row reference)."""
    import hitenter.engine.sampler as sampler_mod

    seen: list[int] = []
    real = sampler_mod.run_chain
    monkeypatch.setattr(sampler_mod, "run_chain", lambda chain, x, batch, record=False: (
        seen.append(x.shape[0]), real(chain, x, batch, record))[1])
    x = torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    guided, plain, hot = SP(temperature=0), SP(temperature=0), SP(temperature=1.0, seed=3)
    params = [plain, guided, plain, plain, hot, plain, plain, SP(temperature=0, repetition_penalty=1.3)]
    cons = [None, _OnlyToken(77), None, None, None, None, None, None]
    meta = SamplingMetadata(params, [make_generator(3) if p is hot else None for p in params],
                            [[5, 6]] * 8, [[7]] * 8, constraints=cons)
    got = Sampler()(x, meta).token_ids
    assert seen == [3]                       # the constrained, the sampling and the penalized row only
    assert got[1] == 77 and [got[i] for i in (0, 2, 3, 5, 6)] == x[[0, 2, 3, 5, 6]].argmax(dim=-1).tolist()
    for i in range(8):
        alone = SamplingMetadata([params[i]], [make_generator(3) if params[i] is hot else None], [[5, 6]], [[7]],
                                 constraints=[cons[i]])
        assert Sampler()(x[i:i + 1], alone).token_ids == [got[i]]
