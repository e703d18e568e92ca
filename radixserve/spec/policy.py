"""How many tokens each request drafts this step: its recent acceptance against the step's
measured cost.

Cost model (`StepCostModel`): the seconds of a step over ``n`` batched tokens, measured online
from the engine's own steps of decodes and drafts (the forward, the verification and the
drafting bookkeeping; spec/drafter.py feeds it), as an exponentially forgotten mean per bucket
of token counts (exact up to 8 tokens, then about 19% wide), read between buckets by linear
interpolation. It is a table, not a line: on a CPU a step costs little more for a few extra
tokens while the weights' reads dominate, then grows with the tokens once the batch is
compute-bound, and where that turns differs per CPU, ISA and thread count (a line fitted over
prefill chunks and decodes mispredicts exactly the decode sizes that matter). Until two sizes
have been measured, a 64-token step is taken to cost two 1-token steps.

Decision (`SpecPolicy.draft_lens`): a request with per-position acceptance ``α`` that drafts
``k`` tokens emits ``1 + α + … + α^k`` tokens in expectation. ``α`` comes from the evidence of
the draft itself where the proposer gives one: how many context tokens the draft's source
matched (a 12-token match in a loop or a quoted passage is accepted far more often than a
1-token one), read from a table of the acceptance measured over all drafts by match length
and by greedy or sampled (`AcceptanceTable`). Evidence is what keeps one workload's acceptance
out of another's: a pooled prior learned on a phase of quoting single streams made every
request of a following random 16-stream phase draft (0.84x), and the misses of that phase
then kept drafts off when the text began to loop. Without evidence (a draft model) ``α`` is
the request's own moving average, and before its first draft the pooled one over all drafts.
The step makes ``R`` tokens (one per sampling row) in ``T(N)``; drafting ``D``
tokens in all, taken in order of their expected gain ``α_j^i``, makes ``R + Σ gains`` in
``T(N + D)``. The policy picks the ``D`` with the most tokens per second, ``D = 0`` unless
drafting promises at least 3% more (the estimates are noisy and not every cost is measured):
drafts grow when the batch is small and acceptance high, and vanish when the extra tokens
cost more than they make (a large batch, or text the proposer cannot predict). Every ``D`` is
compared, not only the next token's marginal gain, so a cost step (a 2-token forward costing
about what a 5-token one does) does not stop drafting short. A request without evidence whose
drafts keep missing backs off (`SpecState`), so probing unpredictable text stays cheap.
A draft model's forward costs ``d`` seconds per draft position for the whole batch, so a step
whose deepest draft has ``k`` tokens takes ``T(N + D) + k·d`` (measured ``d``:
spec/draft_model.py).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

_PRIOR_TOKENS_PER_STEP = 64  # unmeasured: T(n) ∝ 64 + n (a 64-token step costs two 1-token)
_FORGET = 0.9  # weight of a bucket's older steps, per step it sees
_OUTLIER = 3.0  # a step slower than this many times its bucket's mean counts as this
_MIN_SPEEDUP = 1.03  # drafts must promise this much over none (noise, unmeasured costs)
_NEGLIGIBLE_GAIN = 1e-3  # draft tokens expected to add less are not considered
_ALPHA_PRIOR = 0.6  # per-position acceptance assumed for a request that has not drafted yet
_ALPHA_RATE = 0.2  # moving-average step of the acceptance estimate
_PRIOR_RATE = 0.05  # the same over all requests' drafts (a batch's first drafts all miss)
_PRIOR_WEIGHT = 4.0  # observations an evidence bucket's unmeasured acceptance is worth
_ALPHA_RECOVER = 0.05  # a request not drafting drifts back to the prior by this step
_MAX_WAIT = 16  # steps a request that keeps missing waits between drafts, at most


@dataclass(slots=True)
class SpecState:
    """One request's acceptance estimate (plain data on the Request). After ``misses`` drafts
    in a row with nothing accepted, a request without draft evidence skips its next ``wait``
    steps' drafts (2, 4, 8, then 16 steps): probing text the proposer cannot predict stays
    cheap. ``key``: the evidence of the draft being verified (``AcceptanceTable``)."""

    alpha: float = _ALPHA_PRIOR
    num_drafted: int = 0
    num_accepted: int = 0
    misses: int = 0
    wait: int = 0
    key: Key | None = None

    def record(self, drafted: int, accepted: int, rate: float = _ALPHA_RATE) -> None:
        """A verified draft: the first ``accepted`` of ``drafted`` tokens matched."""
        self.num_drafted += drafted
        self.num_accepted += accepted
        for i in range(min(accepted + 1, drafted)):
            self.alpha += rate * ((1.0 if i < accepted else 0.0) - self.alpha)
        self.misses = 0 if accepted else self.misses + 1
        self.wait = min(1 << self.misses, _MAX_WAIT) if self.misses else 0

    def idle(self, prior: float = _ALPHA_PRIOR) -> None:
        """A step without a draft: the estimate drifts back to ``prior`` (the policy's)."""
        self.alpha += _ALPHA_RECOVER * (prior - self.alpha)
        self.wait = max(self.wait - 1, 0)


Key = tuple[int, bool, int]  # (match bucket, sampled, source)


def evidence_key(match: int, sampled: bool, source: int = 0) -> Key | None:
    """The `AcceptanceTable` key of a draft whose ``source`` (spec/proposer.py: the request's
    own context 0, other requests' outputs 1) matched ``match`` context tokens (0: no
    evidence, None), for a greedy or a ``sampled`` request: match lengths bucketed as 1, 2, 3,
    4, 5-6, 7-9, 10-14, 15+ (each bucket keyed by its smallest length)."""
    if match <= 0:
        return None
    for low in (15, 10, 7, 5):
        if match >= low:
            return low, sampled, source
    return match, sampled, source


class AcceptanceTable:
    """Per-position acceptance by draft evidence (`evidence_key`), over every request's drafts.
    Unmeasured, a match of ``m`` tokens is taken to be accepted with ``m / (m + 1.5)`` (0.4
    for one token, 0.73 for four, 0.87 for ten), half that when sampled (a one-hot draft is
    accepted with the target's probability of it, far from 1 at temperature 1) and 20% less
    from other requests' outputs: longer matches predict better everywhere, and each bucket
    soon holds its own measure. A bucket is the mean of its observations with the prior
    worth ``_PRIOR_WEIGHT`` of them while it has seen few, then a moving average (step
    ``_PRIOR_RATE``), so it follows a workload that changes."""

    def __init__(self) -> None:
        self._buckets: dict[Key, list[float]] = {}  # key -> [alpha, observations]

    def alpha(self, key: Key) -> float:
        """The bucket's acceptance, taken one standard error low: ``a - sqrt(a (1 - a) / n)``
        with ``n`` its observations plus the prior's weight. A well-measured bucket keeps its
        mean (0.95 over 40 drafts: 0.92), a fresh or a middling one is discounted (a sampled
        0.3 over 50: 0.24), so drafts whose gain is within the noise of their estimate are not
        made: at temperature 1 such drafts measured 0.83-0.97x without the discount."""
        a, n = self.mean(key), self._buckets.get(key, (0.0, 0.0))[1] + _PRIOR_WEIGHT
        return max(a - math.sqrt(a * (1.0 - a) / n), 0.0)

    def mean(self, key: Key) -> float:
        """The bucket's measured mean (its prior until it has drafts)."""
        bucket = self._buckets.get(key)
        return self._prior(key) if bucket is None else bucket[0]

    def record(self, key: Key, drafted: int, accepted: int) -> None:
        """A verified draft with evidence ``key``: its first ``accepted`` of ``drafted``
        tokens matched (positions past the first miss are not observed)."""
        bucket = self._buckets.setdefault(key, [self._prior(key), 0.0])
        for i in range(min(accepted + 1, drafted)):
            bucket[1] += 1
            rate = max(_PRIOR_RATE, 1.0 / (_PRIOR_WEIGHT + bucket[1]))
            bucket[0] += rate * ((1.0 if i < accepted else 0.0) - bucket[0])

    def best(self, sampled: bool) -> float:
        """The highest acceptance any draft of a greedy or ``sampled`` request may expect:
        over the measured buckets of that kind and the priors of the unmeasured ones."""
        top = 0.0
        for match in (1, 2, 3, 4, 5, 7, 10, 15):
            for source in (0, 1):
                top = max(top, self.alpha((match, sampled, source)))
        return top

    def snapshot(self) -> dict[Key, float]:
        """The measured buckets' acceptance (for logs and tests)."""
        return {k: b[0] for k, b in sorted(self._buckets.items())}  # the means

    @staticmethod
    def _prior(key: Key) -> float:
        match, sampled, source = key
        return match / (match + 1.5) * (0.5 if sampled else 1.0) * (0.8 if source else 1.0)


def _bucket(num_tokens: int) -> int:
    if num_tokens <= 8:
        return num_tokens
    return 8 + round(4 * math.log2(num_tokens / 8))


class StepCostModel:
    """Step seconds by batched tokens: forgotten means per bucket, interpolated between."""

    def __init__(self) -> None:
        self._buckets: dict[int, list[float]] = {}  # bucket -> [weight, Σ w·n, Σ w·seconds]
        self._points: list[tuple[float, float]] | None = None  # (n, seconds), rising n

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0:
            return
        b = self._buckets.setdefault(_bucket(num_tokens), [0.0, 0.0, 0.0])
        if b[0] > 0:
            seconds = min(seconds, _OUTLIER * b[2] / b[0])
        b[0] = b[0] * _FORGET + 1.0
        b[1] = b[1] * _FORGET + num_tokens
        b[2] = b[2] * _FORGET + seconds
        self._points = None

    def points(self) -> list[tuple[float, float]]:
        """The measured (tokens, seconds) per bucket, tokens rising, seconds made
        non-decreasing (more tokens never cost less) from the right: a bucket costs at most
        what any larger one does. NOTE: not a running maximum from the left, which lets one
        slow small step (a stall, a warm-up) lift every larger bucket to its time, so that
        drafts look free and a batch drafts where it loses (measured: 0.85x at 16 streams);
        this way a noisy bucket can only make drafting look dearer, never cheaper."""
        if self._points is None:
            pts, low = [], math.inf
            for key in sorted(self._buckets, reverse=True):
                w, sn, st = self._buckets[key]
                low = min(low, st / w)
                pts.append((sn / w, low))
            self._points = pts[::-1]
        return self._points

    def seconds(self, num_tokens: float) -> float:
        """Estimated seconds of a step over ``num_tokens`` (relative units until measured)."""
        pts = self.points()
        if len(pts) < 2:
            n0, t0 = pts[0] if pts else (1.0, 1.0)
            return t0 * (_PRIOR_TOKENS_PER_STEP + num_tokens) / (_PRIOR_TOKENS_PER_STEP + n0)
        i = bisect.bisect_left(pts, (num_tokens, -1.0))
        i = min(max(i, 1), len(pts) - 1)  # interpolate inside, extend the end segments
        (n0, t0), (n1, t1) = pts[i - 1], pts[i]
        slope = (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0
        return max(t0 + slope * (num_tokens - n0), 1e-9)


class SpecPolicy:
    """``k_max``: the most tokens one request drafts; ``adaptive`` False drafts ``k_max``
    whenever the proposer has that many (for tests and measurements)."""

    def __init__(self, k_max: int, adaptive: bool = True) -> None:
        self.k_max = k_max
        self.adaptive = adaptive
        self.cost = StepCostModel()
        self.table = AcceptanceTable()  # acceptance by draft evidence, over every request
        self.prior = SpecState()  # acceptance over every evidence-less draft: a new one's guess

    def record(self, drafted: int, accepted: int, key: Key | None = None) -> None:
        """A verified draft of any request, with its evidence ``key`` (None: none)."""
        if key is None:
            self.prior.record(drafted, accepted, _PRIOR_RATE)
            self.prior.wait = 0
        else:
            self.table.record(key, drafted, accepted)

    def alpha(self, state: SpecState, key: Key | None = None) -> float:
        """A request's per-position acceptance for its next draft: the table's for the draft's
        evidence ``key``; without evidence its own estimate once it has drafted (0 while it
        backs off), the pooled one before."""
        if key is not None:
            return self.table.alpha(key)
        if state.wait:
            return 0.0
        return state.alpha if state.num_drafted else self.prior.alpha

    def may_draft(self, num_requests: int, num_tokens: int, num_rows: int,
                  alpha: float = 0.95) -> bool:
        """Whether drafting could pay in this step if every one of ``num_requests`` requests
        were predicted at ``alpha`` (the best its drafts may expect): when not, proposing is
        not worth its time."""
        if not self.adaptive:
            return True
        return any(self.draft_lens([SpecState(alpha=alpha, num_drafted=1)] * num_requests,
                                   num_tokens, num_rows))

    def draft_lens(self, states: list[SpecState], num_tokens: int, num_rows: int,
                   proposer_s: float = 0.0, keys: list | None = None,
                   limits: list[int] | None = None) -> list[int]:
        """Draft length per decoding request of a step already holding ``num_tokens`` batched
        tokens, ``num_rows`` of which sample. ``keys``: each request's draft evidence (None
        where it has none, see `alpha`); ``limits``: the most tokens each may draft (the
        proposal's length; default ``k_max``). ``proposer_s``: seconds one more draft position
        costs the proposer for the whole batch (a draft model's forward; 0 for token
        proposers): its share of the step, ``proposer_s / T``, adds to the threshold."""
        limits = limits or [self.k_max] * len(states)
        if not self.adaptive:
            return [min(self.k_max, n) for n in limits]
        keys = keys or [None] * len(states)
        # every (gain, request) a draft token could add, best first (per request α^i falls
        # with i, so any prefix of this order drafts a prefix of each request's tokens)
        gains = sorted(((a ** i, j) for j, (s, key, n) in enumerate(zip(states, keys, limits))
                        if (a := self.alpha(s, key)) > 0
                        for i in range(1, min(n, self.k_max) + 1)), reverse=True)
        made = float(max(num_rows, 1))
        rate0 = made / self.cost.seconds(num_tokens)
        best_rate, best_d = rate0, 0
        per_position = proposer_s if self.cost.points() else 0.0  # seconds once measured
        depth, deepest = [0] * len(states), 0
        for d, (gain, j) in enumerate(gains, 1):
            if gain < _NEGLIGIBLE_GAIN:
                break
            made += gain
            depth[j] += 1
            deepest = max(deepest, depth[j])
            rate = made / (self.cost.seconds(num_tokens + d) + per_position * deepest)
            if rate > best_rate:
                best_rate, best_d = rate, d
        if best_rate < _MIN_SPEEDUP * rate0:
            best_d = 0
        out = [0] * len(states)
        for _, j in gains[:best_d]:
            out[j] += 1
        return out
