"""Sampler: one token per logits row, each row with its own SamplingParams and its own RNG.

Contract:
- ``Sampler()(logits [N, V] fp32, meta) -> SamplerOutput``; the input logits are never modified.
- The processed logits go through the chain of ``logits_processors.default_chain()``
  (penalties -> logit_bias -> min_tokens -> grammar -> temperature -> top_k -> top_p -> min_p).
- Greedy rows (temperature 0) take ``argmax`` of the logits after penalties/bias/min_tokens/grammar
  (ties -> lowest id) and consume no randomness.
- Rows are handled separately: plain greedy rows (no penalty, bias, min_tokens or grammar) take the raw
  logits' argmax with no copy and no chain, even next to rows that need processing; only those rows
  (a grammar, sampling, penalties...) are copied and go through the chain.
- Other rows draw with gpt-fast's sync-free exponential race: ``argmax(probs / q)``, ``q ~ Exp(1)`` per
  token, counter-based draws from one 63-bit seed a step taken from the row's own ``torch.Generator``
  (:func:`row_seed`; the race and its draws: ``hitenter.kernels.race``). A seeded request therefore
  gets the same tokens whatever else is in the batch and wherever its row is. A sampling row whose
  generator is ``None`` falls back to torch's global RNG (not reproducible).
- Logprobs are ``log_softmax`` of the **raw** logits (before penalties, temperature and filters), as
  vLLM v1 does by default (``logprobs_mode="raw_logprobs"``): the chosen token's logprob and rank
  (1 + number of tokens with a strictly higher logprob) plus the top ``params.logprobs`` alternatives.
- ``trace=True`` adds a :class:`SamplingTrace` per row (for the playground); see
  :func:`reshape_distribution` to recompute the stages on cached logits without the model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hitenter.engine.logits_processors import BatchState, LogitsProcessor, default_chain
from hitenter.engine.logprobs import TokenLogprobs, batch_logprobs, token_logprobs
from hitenter.kernels.race import greedy_argmax, race, race_q
from hitenter.sampling_params import SamplingParams

__all__ = ["Sampler", "SamplingMetadata", "SamplerOutput", "StepSample", "TokenLogprobs", "token_logprobs",
           "make_generator", "reshape_distribution", "run_chain"]

TRACE_TOP_N = 50
_SYS_RANDOM = random.SystemRandom()


def row_seed(generator: torch.Generator | None) -> int:
    """This step's race seed for a sampling row: one 63-bit draw from the row's generator (torch's
    global RNG when None), so a seeded request gets the same draws wherever its row is."""
    return int(torch.randint(0, 2**63 - 1, (1,), generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (taken mod 2**64), or with a fresh seed from a global
    SystemRandom when None; ``generator.initial_seed()`` reports the seed actually used."""
    g = torch.Generator(device="cpu")
    g.manual_seed(_SYS_RANDOM.getrandbits(63) if seed is None else seed % 2**64)
    return g


@dataclass
class SamplingMetadata:
    """Per-row sampling inputs. Empty ``prompt_token_ids``/``output_token_ids``/``stop_token_ids``
    lists mean "empty for every row"; otherwise every list has one entry per row."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]   # None for greedy rows
    prompt_token_ids: Sequence[Sequence[int]] = field(default_factory=list)
    output_token_ids: Sequence[Sequence[int]] = field(default_factory=list)
    stop_token_ids: Sequence[frozenset[int]] = field(default_factory=list)  # suppressed while output < min_tokens
    constraints: Sequence[Any] = field(default_factory=list)   # grammar per row (structured outputs) or None

    def __post_init__(self) -> None:
        n = len(self.params)
        if not self.prompt_token_ids:
            self.prompt_token_ids = [()] * n
        if not self.output_token_ids:
            self.output_token_ids = [()] * n
        if not self.stop_token_ids:
            self.stop_token_ids = [frozenset()] * n
        for name in ("generators", "prompt_token_ids", "output_token_ids", "stop_token_ids"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: has {len(getattr(self, name))} rows, params has {n}")

    def subset(self, rows: Sequence[int]) -> SamplingMetadata:
        """The metadata of ``rows`` only (in that order)."""
        return SamplingMetadata([self.params[i] for i in rows], [self.generators[i] for i in rows],
                                [self.prompt_token_ids[i] for i in rows], [self.output_token_ids[i] for i in rows],
                                [self.stop_token_ids[i] for i in rows],
                                [self.constraints[i] for i in rows] if self.constraints else [])


@dataclass
class StageTrace:
    name: str             # "raw", then each processor's name ("penalties", ..., "min_p")
    probs: list[float]    # softmax of the logits after this stage, at SamplingTrace.candidate_ids
    kept: list[bool]      # False where the stage (or an earlier one) cut the candidate
    num_kept: int         # tokens still possible over the whole vocabulary


@dataclass
class DrawTrace:
    method: str                     # "greedy" or "exponential_race"
    token_id: int
    seed: int | None                # the row generator's initial seed
    q: list[float] | None = None    # the Exp(1) value of each candidate (token = argmax p / q)
    chosen_q: float | None = None
    chosen_u: float | None = None   # the equivalent uniform 1 - exp(-q) of the chosen token


@dataclass
class SamplingTrace:
    candidate_ids: list[int]        # top raw candidates (+ the chosen token when it is not among them)
    stages: list[StageTrace]
    draw: DrawTrace | None = None


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    trace: list[SamplingTrace] | None = None


@dataclass
class StepSample:
    """The engine's view of one step's sampling: per sampled request, the tokens it emits (one, or
    the accepted drafts + one with speculative decoding), their logprobs and an optional trace."""

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs | None]]
    trace: list[SamplingTrace | None] | None = None

    @classmethod
    def from_sampler(cls, out: SamplerOutput) -> StepSample:
        return cls([[t] for t in out.token_ids], [[lp] for lp in out.logprobs],
                   list(out.trace) if out.trace is not None else None)


def run_chain(chain: Sequence[LogitsProcessor], logits: Tensor, batch: BatchState,
              record: bool = False) -> tuple[Tensor, list[tuple[str, Tensor]]]:
    """Apply the chain to a copy of ``logits``; with ``record`` also return (name, logits) per stage."""
    x = logits.to(torch.float32).clone()
    stages: list[tuple[str, Tensor]] = [("raw", x.clone())] if record else []
    for proc in chain:
        x = proc(x, batch)
        if record:
            stages.append((proc.name, x.clone()))
    return x, stages


class _StageView:
    """Softmax, finite mask and kept count of every stage, computed once for the whole batch."""

    def __init__(self, stages: list[tuple[str, Tensor]]) -> None:
        self.names = [name for name, _ in stages]
        self.probs = [torch.softmax(x, dim=-1) for _, x in stages]
        self.finite = [torch.isfinite(x) for _, x in stages]
        self.kept = [f.sum(dim=-1).tolist() for f in self.finite]

    def row(self, i: int, cand: Tensor) -> list[StageTrace]:
        return [StageTrace(name, p[i, cand].tolist(), f[i, cand].tolist(), int(k[i]))
                for name, p, f, k in zip(self.names, self.probs, self.finite, self.kept, strict=True)]


def _candidates(raw_row: Tensor, top_n: int, extra: int | None = None) -> Tensor:
    """The ``top_n`` highest raw logits (ties -> lower id), plus ``extra`` when it is not among them."""
    kth = torch.topk(raw_row, min(top_n, raw_row.shape[0])).values[-1]
    ids = torch.nonzero(raw_row >= kth).flatten()
    _, order = torch.sort(raw_row[ids], descending=True, stable=True)
    cand = ids[order[:top_n]]
    if extra is not None and not bool((cand == extra).any()):
        cand = torch.cat([cand, torch.tensor([extra])])
    return cand


@dataclass
class DistributionStages:
    candidate_ids: list[int]
    stages: list[StageTrace]


def reshape_distribution(logits_row: Tensor, params: SamplingParams,
                         prompt_token_ids: Sequence[int] = (), output_token_ids: Sequence[int] = (),
                         stop_token_ids: frozenset[int] = frozenset(), top_n: int = TRACE_TOP_N,
                         chain: Sequence[LogitsProcessor] | None = None) -> DistributionStages:
    """The probabilities of the top ``top_n`` raw candidates after each stage of the chain, for one row
    of cached logits ``[V]`` (the playground's "what if I change top_p" view, no model run)."""
    batch = BatchState([params], [prompt_token_ids], [output_token_ids], [stop_token_ids])
    _, stages = run_chain(chain or default_chain(), logits_row.reshape(1, -1), batch, record=True)
    cand = _candidates(stages[0][1][0], top_n)
    return DistributionStages(cand.tolist(), _StageView(stages).row(0, cand))


class Sampler:
    """Callable sampler; ``chain`` defaults to :func:`default_chain`."""

    def __init__(self, chain: Sequence[LogitsProcessor] | None = None, trace_top_n: int = TRACE_TOP_N) -> None:
        self.chain = list(chain) if chain is not None else default_chain()
        self._plain_fast = chain is None    # the default chain leaves plain greedy rows alone
        self.trace_top_n = trace_top_n

    def __call__(self, logits: Tensor, meta: SamplingMetadata, trace: bool = False) -> SamplerOutput:
        n, v = logits.shape
        if n != len(meta.params):
            raise ValueError(f"logits: has {n} rows, metadata has {len(meta.params)}")
        cons = meta.constraints or [None] * n
        use_fast = self._plain_fast and not trace
        fast = [use_fast and c is None and _plain_greedy(p) for p, c in zip(meta.params, cons, strict=True)]
        if all(fast):
            # no processor touches a plain greedy row: its argmax is the raw logits' (no chain, no copy)
            tokens = greedy_argmax(logits)
            return SamplerOutput(tokens.tolist(), self._logprobs(logits, tokens, meta.params), None)
        if not any(fast):
            tokens, seeds, sample, stages = self._process(logits, meta, trace)
        else:
            # mixed batch: the plain greedy rows keep the fast path (raw argmax), and only the other rows
            # (a grammar, penalties, sampling...) are copied and go through the chain: a constrained or
            # sampling neighbour costs them nothing (the processors are row-independent)
            rest = [i for i, f in enumerate(fast) if not f]
            tokens = greedy_argmax(logits)
            sub, seeds, sample, stages = self._process(logits[rest], meta.subset(rest), False)
            tokens[rest] = sub
            sample = [rest[j] for j in sample]
        token_list = tokens.tolist()
        logprobs = self._logprobs(logits, tokens, meta.params)
        traces = self._traces(stages, seeds, sample, token_list, meta) if trace else None
        return SamplerOutput(token_list, logprobs, traces)

    def _process(self, logits: Tensor, meta: SamplingMetadata, record: bool
                 ) -> tuple[Tensor, list[int], list[int], list[tuple[str, Tensor]]]:
        """The chain, then greedy argmax / the exponential race, over all rows of ``logits``:
        (tokens, the race seeds of the sampling rows, their row indices, the recorded stages)."""
        n, v = logits.shape
        batch = BatchState(meta.params, meta.prompt_token_ids, meta.output_token_ids, meta.stop_token_ids,
                           meta.constraints)
        x, stages = run_chain(self.chain, logits, batch, record=record)
        tokens = torch.empty(n, dtype=torch.long)
        greedy = [i for i, p in enumerate(meta.params) if p.is_greedy]
        sample = [i for i, p in enumerate(meta.params) if not p.is_greedy]
        if greedy:
            tokens[greedy] = greedy_argmax(x[greedy] if len(greedy) < n else x)
        seeds = [row_seed(meta.generators[i]) for i in sample]
        if sample:
            tokens[sample] = race(x[sample] if len(sample) < n else x, seeds)
        return tokens, seeds, sample, stages

    def _traces(self, stages: list[tuple[str, Tensor]], seeds: list[int], sample: list[int],
                token_list: list[int], meta: SamplingMetadata) -> list[SamplingTrace]:
        traces = []
        view = _StageView(stages)
        sample_pos = {i: j for j, i in enumerate(sample)}
        for i in range(len(token_list)):
            cand = _candidates(stages[0][1][i], self.trace_top_n, extra=token_list[i])
            gen = meta.generators[i]
            seed = gen.initial_seed() if gen is not None else None
            if i in sample_pos:
                race_seed = seeds[sample_pos[i]]
                cq = float(race_q(race_seed, [token_list[i]])[0])
                draw = DrawTrace("exponential_race", token_list[i], seed, race_q(race_seed, cand.tolist()).tolist(),
                                 cq, -math.expm1(-cq))
            else:
                draw = DrawTrace("greedy", token_list[i], seed)
            traces.append(SamplingTrace(cand.tolist(), view.row(i, cand), draw))
        return traces

    @staticmethod
    def _logprobs(logits: Tensor, tokens: Tensor, params: Sequence[SamplingParams]) -> list[TokenLogprobs | None]:
        """Raw-distribution logprobs, computed only for the rows that asked."""
        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        logprobs: list[TokenLogprobs | None] = [None] * len(params)
        if lp_rows:
            lps = torch.log_softmax(logits[lp_rows].to(torch.float32), dim=-1)
            ks = [params[i].logprobs or 0 for i in lp_rows]
            for i, lp in zip(lp_rows, batch_logprobs(lps, tokens[lp_rows], ks), strict=True):
                logprobs[i] = lp
        return logprobs


def _plain_greedy(p: SamplingParams) -> bool:
    """Greedy and untouched by every processor of the default chain (penalties, bias, min_tokens)."""
    return p.is_greedy and not p.has_penalties and not p.logit_bias and not p.min_tokens and p.structured is None
