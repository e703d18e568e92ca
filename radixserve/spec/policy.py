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

Decision (`SpecPolicy.draft_lens`): a request with per-position acceptance ``α`` (a moving
average of its own drafts; before its first, the moving average over all requests' drafts, so
a workload the proposer predicts well drafts from the start and one it predicts badly does not
probe every new request) that drafts ``k`` tokens emits ``1 + α + … + α^k`` tokens in
expectation. The step makes ``R`` tokens (one per sampling row) in ``T(N)``; drafting ``D``
tokens in all, taken in order of their expected gain ``α_j^i``, makes ``R + Σ gains`` in
``T(N + D)``. The policy picks the ``D`` with the most tokens per second, ``D = 0`` unless
drafting promises at least 3% more (the estimates are noisy and not every cost is measured):
drafts grow when the batch is small and acceptance high, and vanish when the extra tokens
cost more than they make (a large batch, or text the proposer cannot predict). Every ``D`` is
compared, not only the next token's marginal gain, so a cost step (a 2-token forward costing
about what a 5-token one does) does not stop drafting short. A request whose drafts keep
missing backs off (`SpecState`), so probing unpredictable text stays cheap.
A draft model's forward costs ``d`` seconds per draft position for the whole batch, so a step
whose deepest draft has ``k`` tokens takes ``T(N + D) + k·d`` (measured ``d``: spec/draft_model.py).
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
_ALPHA_RECOVER = 0.05  # a request not drafting drifts back to the prior by this step
_MAX_WAIT = 16  # steps a request that keeps missing waits between drafts, at most


@dataclass(slots=True)
class SpecState:
    """One request's acceptance estimate (plain data on the Request). After ``misses`` drafts
    in a row with nothing accepted, the request skips its next ``wait`` steps' drafts
    (2, 4, 8, then 16 steps): probing text the proposer cannot predict stays cheap."""

    alpha: float = _ALPHA_PRIOR
    num_drafted: int = 0
    num_accepted: int = 0
    misses: int = 0
    wait: int = 0

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
        self.prior = SpecState()  # acceptance over every request's drafts: a new one's guess

    def record(self, drafted: int, accepted: int) -> None:
        """A verified draft of any request (the acceptance a new request starts from)."""
        self.prior.record(drafted, accepted, _PRIOR_RATE)
        self.prior.wait = 0

    def draft_lens(self, states: list[SpecState], num_tokens: int, num_rows: int,
                   proposer_s: float = 0.0) -> list[int]:
        """Draft length per decoding request of a step already holding ``num_tokens`` batched
        tokens, ``num_rows`` of which sample. ``proposer_s``: seconds one more draft position
        costs the proposer for the whole batch (a draft model's forward; 0 for token
        proposers): its share of the step, ``proposer_s / T``, adds to the threshold."""
        if not self.adaptive:
            return [self.k_max] * len(states)
        # every (gain, request) a draft token could add, best first (per request α^i falls
        # with i, so any prefix of this order drafts a prefix of each request's tokens)
        prior = self.prior.alpha
        gains = sorted((((s.alpha if s.num_drafted else prior) ** i, j)
                        for j, s in enumerate(states) if not s.wait
                        for i in range(1, self.k_max + 1)), reverse=True)
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
