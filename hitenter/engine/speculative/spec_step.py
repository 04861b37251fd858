"""SpecDecoder: the engine's speculative-decoding part (propose before a step, verify after the forward).

- ``propose(running, generators)``: before ``schedule()``, every running request that is a decode (all
  but its newest token computed, no drafts yet) and has not opted out (``SamplingParams.speculate``
  False: plain decoding, one token a step, no draft state) gets up to ``k = min(k_req, max_tokens - outputs - 1)``
  drafted tokens in ``request.spec_token_ids`` (so the accepted run plus one token never overshoots
  max_tokens). ``k_req`` is K (num_speculative_tokens) or, adaptive (the default), the length in
  [0, K] that maximises the request's expected tokens per second (``adaptive.py``: its acceptance so far,
  the measured draft step and target pass times, fed by ``observe`` after each step). The scheduler then
  scores them like any other tokens.
- ``sample(...)``: rows of requests without drafts go through the plain Sampler unchanged (same
  tokens, randomness, logprobs and traces as without speculation). A request with ``s`` drafts has
  ``s + 1`` logits rows; row ``j`` is processed by the request's logits-processor chain with output
  history ``outputs + drafts[:j]`` (what plain decoding would have seen had it produced those drafts),
  then verified (``rejection.py``): a greedy row keeps the drafts while they equal the target's argmax;
  a sampling row draws row j's token as plain decoding would (the race with the request's next row
  seed) and keeps the drafts while they equal it. Either way the emitted tokens, and a seeded request's
  generator, are exactly those of decoding without speculation. Logprobs are the raw ones of each
  emitted token's row.
- Structured outputs: a constrained request's drafts are cut at the first token its grammar
  refuses; row ``j`` is masked by the grammar after ``drafts[:j]`` (``GrammarConstraint.speculate``),
  so a refused draft is rejected, and the matcher is then rolled back by the number of rejected drafts
  (``settle``). The draft model draws under the same grammar (proposers.py).
- ``stats`` (:class:`SpecDecodeStats`) are the engine-wide counters; ``request.extra["spec_decode"]``
  holds per-request ``[num_draft_tokens, num_accepted_tokens, num_verify_steps]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hitenter.engine.logits_processors import BatchState
from hitenter.engine.sampler import (
    Sampler,
    SamplingMetadata,
    SamplingTrace,
    StepSample,
    TokenLogprobs,
    row_seed,
    run_chain,
    token_logprobs,
)
from hitenter.engine.scheduler import SchedulerOutput
from hitenter.engine.speculative.adaptive import AdaptiveK
from hitenter.engine.speculative.proposers import Proposer, stop_ids
from hitenter.engine.speculative.rejection import greedy_accept, race_accept
from hitenter.engine.structured import constraints_of
from hitenter.kernels.race import greedy_argmax
from hitenter.request import Request, RequestStatus


@dataclass
class SpecDecodeStats:
    """Engine-wide counters (vLLM's spec_decode_* metrics)."""

    num_drafts: int = 0                 # verification passes of a request with >= 1 drafted token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        if len(self.num_accepted_tokens_per_pos) < num_draft:
            self.num_accepted_tokens_per_pos += [0] * (num_draft - len(self.num_accepted_tokens_per_pos))
        for j in range(num_accepted):
            self.num_accepted_tokens_per_pos[j] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per verification pass (tokens per pass = 1 + this)."""
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


def spec_request_stats(reqs: Sequence[Request]) -> dict[str, float]:
    """Per-request speculation stats (summed over a request's n sequences) for RequestOutput.extra."""
    counts = [r.extra.get("spec_decode", (0, 0, 0)) for r in reqs]
    d, a, n = (sum(c[k] for c in counts) for k in range(3))
    return {"num_draft_tokens": d, "num_accepted_tokens": a, "num_verify_steps": n,
            "acceptance_rate": a / d if d else 0.0, "mean_accepted_length": a / n if n else 0.0}


class SpecDecoder:
    """`adaptive`: the draft length per request and step chosen by AdaptiveK (None: always K)."""

    def __init__(self, proposer: Proposer, num_speculative_tokens: int, method: str,
                 adaptive: AdaptiveK | None = None) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens: must be >= 1, got {num_speculative_tokens}")
        self.proposer = proposer
        self.k = num_speculative_tokens
        self.method = method
        self.adaptive = adaptive
        self.stats = SpecDecodeStats()
        self._t_propose = 0.0    # seconds the last propose() took (subtracted from its step's time)

    def release(self, request_id: str) -> None:
        self.proposer.release(request_id)
        if self.adaptive is not None:
            self.adaptive.release(request_id)

    def observe(self, num_tokens: int, num_requests: int, num_rows: Sequence[int], step_seconds: float) -> None:
        """A step ran `num_tokens` tokens of `num_requests` requests and sampled `num_rows` rows per
        request it sampled, in `step_seconds` (the whole step; the proposer's share is taken out). Only a
        pure decode step (every request sampled, every token a sampled row) measures the target's pass."""
        if self.adaptive is None or not num_requests:
            return
        if len(num_rows) == num_requests and sum(num_rows) == num_tokens:
            self.adaptive.costs.observe_pass(num_tokens, step_seconds - self._t_propose)
        self._t_propose = 0.0

    @property
    def wants_hidden(self) -> bool:
        """The proposer reads the target's hidden rows (the runner must keep them: ModelRunner.keep_hidden)."""
        return bool(getattr(self.proposer, "wants_hidden", False))

    def observe_target(self, sched: SchedulerOutput, hidden: Tensor) -> None:
        """The target's forward over `sched` gave these hidden rows (an MTP proposer keeps them)."""
        observe = getattr(self.proposer, "observe_target", None)
        if observe is not None:
            observe(sched, hidden)

    def _draft_length(self, r: Request, other_rows: int) -> int:
        if self.adaptive is None:
            return self.k
        return self.adaptive.choose(r.request_id, other_rows)

    def propose(self, running: Sequence[Request], sampler: Sampler) -> None:
        live = {r.request_id for r in running if r.status is RequestStatus.RUNNING}
        for rid in [r for r in self.proposer.request_ids if r not in live]:
            self.release(rid)   # preempted or finished: its draft state goes
        decodes = [r for r in running if r.status is RequestStatus.RUNNING and not r.spec_token_ids
                   and r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1]
        reqs, ks = [], []
        other = len(decodes) - 1    # rows of the other decodes in this step (1 each, + their drafts)
        for r in decodes:
            if not r.sampling_params.speculate:    # opted out: a plain row in this step
                continue
            k = min(self._draft_length(r, other), r.max_tokens - r.num_output_tokens - 1)
            if k > 0:
                reqs.append(r)
                ks.append(k)
                other += k
        if not reqs:
            return
        t0 = time.perf_counter()
        drafts = self.proposer.propose(reqs, ks, sampler.chain, [r.generator for r in reqs])
        self._t_propose = time.perf_counter() - t0
        if self.adaptive is not None and self.proposer.steps_run:
            self.adaptive.costs.observe_draft(self.proposer.steps_run, self._t_propose)
        for r, d in zip(reqs, drafts, strict=True):
            grammar = r.extra.get("grammar")
            if grammar is not None:
                # cut at the first token the grammar refuses, which the verifier would reject anyway (the
                # target's own token is emitted there)
                r.spec_token_ids = list(d.token_ids[:grammar.legal_prefix(d.token_ids)])
            else:
                r.spec_token_ids = list(d.token_ids)

    def sample(self, logits: Tensor, num_rows: Sequence[int], reqs: Sequence[Request],
               generators: Sequence[torch.Generator | None], sampler: Sampler, trace: bool = False) -> StepSample:
        starts = [sum(num_rows[:i]) for i in range(len(reqs))]
        tokens: list[list[int]] = [[] for _ in reqs]
        lps: list[list[TokenLogprobs | None]] = [[] for _ in reqs]
        traces: list[SamplingTrace | None] | None = [None] * len(reqs) if trace else None
        plain = [i for i, n in enumerate(num_rows) if n == 1]
        if plain:
            sel = [reqs[i] for i in plain]
            meta = SamplingMetadata([r.sampling_params for r in sel], [generators[i] for i in plain],
                                    [r.prompt_token_ids for r in sel], [r.output_token_ids for r in sel],
                                    [stop_ids(r) for r in sel], constraints_of(sel))
            out = sampler(logits[[starts[i] for i in plain]], meta, trace=trace)
            for j, i in enumerate(plain):
                tokens[i], lps[i] = [out.token_ids[j]], [out.logprobs[j]]
                if traces is not None and out.trace is not None:
                    traces[i] = out.trace[j]
        spec = [i for i, n in enumerate(num_rows) if n > 1]
        if spec:
            self._verify(logits, starts, num_rows, reqs, generators, spec, sampler, tokens, lps)
        return StepSample(tokens, lps, traces)

    def _verify(self, logits: Tensor, starts: Sequence[int], num_rows: Sequence[int], reqs: Sequence[Request],
                generators: Sequence[torch.Generator | None], spec: list[int], sampler: Sampler,
                tokens: list[list[int]], lps: list[list[TokenLogprobs | None]]) -> None:
        rows = [starts[i] + j for i in spec for j in range(num_rows[i])]
        params, prompts, outs, stops, masks = [], [], [], [], []
        for i in spec:
            r = reqs[i]
            grammar = r.extra.get("grammar")
            # structured outputs: each drafted position masked by the grammar after the drafts before it
            masks += grammar.speculate(r.spec_token_ids[:num_rows[i] - 1]) if grammar else [None] * num_rows[i]
            for j in range(num_rows[i]):
                params.append(r.sampling_params)
                prompts.append(r.prompt_token_ids)
                outs.append(r.output_token_ids + r.spec_token_ids[:j])
                stops.append(stop_ids(r))
        batch = BatchState(params, prompts, outs, stops, masks if any(m is not None for m in masks) else ())
        x, _ = run_chain(sampler.chain, logits[rows], batch)
        local = 0
        for i in spec:
            r, n = reqs[i], num_rows[i]
            draft = r.spec_token_ids[:n - 1]
            xi = x[local:local + n]
            local += n
            if r.sampling_params.is_greedy:
                tokens[i] = greedy_accept(greedy_argmax(xi).tolist(), draft)
            else:   # each row drawn as plain decoding draws it: the seeded request's very tokens
                tokens[i] = race_accept(xi, draft, lambda g=generators[i]: row_seed(g))
            accepted = len(tokens[i]) - 1
            if "grammar" in r.extra:
                r.extra["grammar"].settle(accepted)    # roll back the rejected drafts
            self.stats.record(n - 1, accepted)
            if self.adaptive is not None:
                self.adaptive.record(r.request_id, n - 1, accepted)
            d0, a0, s0 = r.extra.get("spec_decode", (0, 0, 0))
            r.extra["spec_decode"] = (d0 + n - 1, a0 + accepted, s0 + 1)
        want = [(i, j) for i in spec if reqs[i].sampling_params.logprobs is not None for j in range(len(tokens[i]))]
        if want:
            got = token_logprobs(logits[[starts[i] + j for i, j in want]],
                                 torch.tensor([tokens[i][j] for i, j in want], dtype=torch.long),
                                 [reqs[i].sampling_params.logprobs or 0 for i, _ in want])
            for (i, _), lp in zip(want, got, strict=True):
                lps[i].append(lp)
        for i in spec:
            if not lps[i]:
                lps[i] = [None] * len(tokens[i])
