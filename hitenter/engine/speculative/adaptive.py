"""How many tokens to draft: per request, the k in [1, k_max] that maximises expected tokens per second,
from the acceptance seen so far and the measured costs of drafting and of the target's pass.

Model (Leviathan et al. 2023, section 3.3): each drafted token is accepted with probability ``alpha``
given that the ones before it were, so a step drafting ``k`` tokens emits
``E(k) = (1 - alpha^(k+1)) / (1 - alpha)`` tokens. It costs a proposal of ``k`` draft steps (``t_draft(k)``,
measured around the proposer per length: a draft model's proposal has a fixed part, its catch-up pass
over the tokens the last verification accepted, so a per-step average measured at k = 1 made every
longer proposal look dearer than it is; ~0 for prompt lookup) plus the target's pass over its ``k + 1`` rows (``t_rows``,
measured from the engine's pure-decode step times, per total row count; a request alone first runs each
length 0..K once to measure them: on AVX2 a pass over 4 rows may cost about what 3 rows cost, since the
matmul kernels take the rows in runs of 8/4/2/1). A plain step emits 1 token for ``t_rows(1)``. Where even ``k = 1`` costs more per token than a plain step, the request drafts nothing
(``k = 0``) and probes with ``k = 1`` every ``probe_every`` steps so ``alpha`` stays current.

``alpha`` per request: accepted / (accepted + rejections) over its verification passes, each pass
weighted down by ``decay`` per later pass (a pass accepting ``a`` of ``k`` drafts adds ``a`` successes
and one failure when ``a < k``: the maximum-likelihood estimate under the geometric model), seeded with
``prior_alpha`` worth ``prior_weight`` passes. Costs are exponential moving averages of wall-clock
seconds; before any is measured the controller drafts ``k_max`` (the configured num_speculative_tokens).

Which k is drafted never changes which tokens are emitted (verification keeps exactly the target's
output), only how fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROW_SLOPE = 0.05   # the prior extra cost of one more row in a decode pass, relative to a 1-row pass


@dataclass
class StepCosts:
    """Measured seconds: the target's pass by its total row count, and a proposal by its draft steps."""

    decay: float = 0.8
    rows: dict[int, float] = field(default_factory=dict)
    drafts: dict[int, float] = field(default_factory=dict)   # a whole proposal, by its number of steps

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def observe_pass(self, num_rows: int, seconds: float) -> None:
        """A target pass over `num_rows` generation rows (no prompt rows) took `seconds`."""
        if num_rows > 0 and seconds > 0:
            self.rows[num_rows] = self._ema(self.rows.get(num_rows), seconds)

    def observe_draft(self, num_steps: int, seconds: float) -> None:
        """The proposer took `seconds` for `num_steps` sequential draft steps."""
        if num_steps > 0 and seconds >= 0:
            self.drafts[num_steps] = self._ema(self.drafts.get(num_steps), seconds)

    def target(self, num_rows: int) -> float | None:
        """Estimated seconds of a pass over `num_rows` rows: measured, else interpolated linearly between
        measured row counts, else extrapolated (the slope of the two nearest measured counts below, or
        ROW_SLOPE of a 1-row pass); None before anything is measured."""
        return _estimate(self.rows, num_rows, ROW_SLOPE, floor_from_above=True)

    def draft(self, num_steps: int) -> float | None:
        """Estimated seconds of a proposal of `num_steps` steps. Measured per length, because a proposal
        has a fixed part besides its steps (the draft model first catches up on the tokens the last
        verification accepted: a pass over 1 + accepted rows); between and beyond measured lengths
        linear, from one measured length proportional (no fixed part assumed); None before any."""
        if len(self.drafts) == 1:
            (k0, s0), = self.drafts.items()
            return s0 * num_steps / k0
        return _estimate(self.drafts, num_steps, 0.0, floor_from_above=False)


def _estimate(table: dict[int, float], n: int, prior_rel_slope: float, floor_from_above: bool) -> float | None:
    """table[n], else linear between the nearest measured counts around n, else extrapolated from below
    with the slope of the two nearest below (at least 0; with one, ``prior_rel_slope`` x its value), else
    (nothing below) the nearest count above (``floor_from_above``) or the line through the two nearest
    above (at least 0); None for an empty table."""
    if n in table:
        return table[n]
    if not table:
        return None
    below = sorted(m for m in table if m < n)
    above = sorted(m for m in table if m > n)
    if below and above:
        lo, hi = below[-1], above[0]
        return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    if not below:
        if floor_from_above or len(above) < 2:
            return table[above[0]]
        a, b = above[0], above[1]
        return max(0.0, table[a] - max(0.0, (table[b] - table[a]) / (b - a)) * (a - n))
    lo = below[-1]
    slope = prior_rel_slope * table[lo]
    if len(below) > 1:
        slope = max(0.0, (table[lo] - table[below[-2]]) / (lo - below[-2]))
    return table[lo] + slope * (n - lo)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step drafting k emits when each draft is accepted with probability alpha (1 for k = 0)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class _Acceptance:
    hits: float
    trials: float
    idle: int = 0        # steps drafted nothing since the last probe


class AdaptiveK:
    """Per-request draft lengths (see the module doc). `allow_off`: k = 0 when speculation does not pay."""

    def __init__(self, k_max: int, prior_alpha: float = 0.7, prior_weight: float = 2.0, decay: float = 0.85,
                 probe_every: int = 8, allow_off: bool = True) -> None:
        if k_max < 1:
            raise ValueError(f"num_speculative_tokens: must be >= 1, got {k_max}")
        if not 0.0 <= prior_alpha < 1.0 or prior_weight <= 0 or not 0.0 < decay <= 1.0 or probe_every < 1:
            raise ValueError("AdaptiveK: need 0 <= prior_alpha < 1, prior_weight > 0, 0 < decay <= 1, "
                             "probe_every >= 1")
        self.k_max, self.decay, self.probe_every, self.allow_off = k_max, decay, probe_every, allow_off
        self.prior = (prior_alpha * prior_weight, prior_weight)
        self.costs = StepCosts()
        self._acc: dict[str, _Acceptance] = {}

    def _state(self, request_id: str) -> _Acceptance:
        s = self._acc.get(request_id)
        if s is None:
            s = self._acc[request_id] = _Acceptance(*self.prior)
        return s

    def alpha(self, request_id: str) -> float:
        s = self._state(request_id)
        return s.hits / s.trials if s.trials > 0 else 0.0

    def record(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """A verification pass of `num_drafted` drafts accepted the first `num_accepted`."""
        if num_drafted <= 0:
            return
        s = self._state(request_id)
        fail = 1.0 if num_accepted < num_drafted else 0.0
        s.hits = self.decay * s.hits + num_accepted
        s.trials = self.decay * s.trials + num_accepted + fail

    def release(self, request_id: str) -> None:
        self._acc.pop(request_id, None)

    def rate(self, alpha: float, k: int, other_rows: int) -> float | None:
        """Expected tokens per second of a step drafting k beside `other_rows` rows of other requests."""
        t_pass = self.costs.target(other_rows + k + 1)
        t_draft = self.costs.draft(k) if k else 0.0
        if t_pass is None or t_draft is None:
            return None
        cost = t_pass + t_draft
        return expected_tokens(alpha, k) / cost if cost > 0 else None

    def choose(self, request_id: str, other_rows: int = 0) -> int:
        """The draft length for this request's next step (0: draft nothing this step)."""
        alpha, s = self.alpha(request_id), self._state(request_id)
        if not other_rows and self.costs.rows:    # alone: measure every pass length once (the multi-row
            todo = [n for n in range(0 if self.allow_off else 1, self.k_max + 1)   # kernels' costs are
                    if n + 1 not in self.costs.rows]                                # not linear in rows;
            if todo:                                               # these steps measure each proposal too)
                return todo[0]
        rates = [self.rate(alpha, k, other_rows) for k in range(self.k_max + 1)]
        if any(r is None for r in rates):
            return self.k_max                      # nothing measured yet: the configured length
        best = max(range(1, self.k_max + 1), key=lambda k: rates[k])   # type: ignore[arg-type, return-value]
        if self.allow_off and rates[best] < rates[0]:   # type: ignore[operator]
            s.idle += 1
            if s.idle < self.probe_every:
                return 0
            best = 1                                # probe: keep alpha current
        s.idle = 0
        return best
