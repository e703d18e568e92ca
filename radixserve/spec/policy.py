"""How many tokens each request drafts this step: its recent acceptance against the step's
measured cost.

Cost model: a step over ``n`` batched tokens takes ``a + b·n`` seconds, fitted online by
least squares with forgetting over the engine's own steps (on a CPU ``a``, reading the weights,
dominates at small batches). A step that makes ``R`` tokens in ``T = a + b·N`` seconds gains
from one more draft token at position i iff the tokens it adds per second beat the step's rate:
``α^i · T / R > b``, where ``α`` is the request's per-position acceptance (a moving average).
So drafts grow when the batch is small and acceptance high, and vanish when the batch is large
(``b·R / T`` tends to 1, which no ``α^i`` exceeds). Until two different step sizes have been
measured, ``b / a`` is taken as 1/64 (a 64-token step costs two 1-token steps).
A draft model's cost enters the same way: one more draft position costs its forward
``d`` seconds shared by the batch, so the threshold becomes ``(b·R + d) / T``.
"""

from __future__ import annotations

from dataclasses import dataclass

_PRIOR_B_OVER_A = 1.0 / 64
_FORGET = 0.98  # weight of older steps, per step
_ALPHA_PRIOR = 0.6  # per-position acceptance assumed for a request that has not drafted yet
_ALPHA_RATE = 0.2  # moving-average step of the acceptance estimate
_ALPHA_RECOVER = 0.05  # a request not drafting drifts back to the prior by this step


@dataclass(slots=True)
class SpecState:
    """One request's acceptance estimate (plain data on the Request)."""

    alpha: float = _ALPHA_PRIOR
    num_drafted: int = 0
    num_accepted: int = 0

    def record(self, drafted: int, accepted: int) -> None:
        """A verified draft: the first ``accepted`` of ``drafted`` tokens matched."""
        self.num_drafted += drafted
        self.num_accepted += accepted
        for i in range(min(accepted + 1, drafted)):
            self.alpha += _ALPHA_RATE * ((1.0 if i < accepted else 0.0) - self.alpha)

    def idle(self) -> None:
        self.alpha += _ALPHA_RECOVER * (_ALPHA_PRIOR - self.alpha)


class StepCostModel:
    """``seconds ≈ a + b · tokens``, least squares over exponentially forgotten steps."""

    def __init__(self) -> None:
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        f = _FORGET
        self._w = self._w * f + 1.0
        self._n = self._n * f + num_tokens
        self._t = self._t * f + seconds
        self._nn = self._nn * f + num_tokens * num_tokens
        self._nt = self._nt * f + num_tokens * seconds

    def seconds(self, num_tokens: int) -> float | None:
        """``a + b·num_tokens``; None before any step was observed. With one step size seen,
        ``a`` and ``b`` split the mean step time by the prior ratio."""
        if self._w <= 0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        return mean_t * (1.0 + self.b_over_step(0) * num_tokens) / (
            1.0 + self.b_over_step(0) * mean_n)

    def b_over_step(self, num_tokens: int) -> float:
        """``b / (a + b·num_tokens)``: one more token's share of a step of ``num_tokens``."""
        if self._w > 0:
            mean_n, mean_t = self._n / self._w, self._t / self._w
            var = self._nn / self._w - mean_n * mean_n
            if var > 0.25:  # at least two step sizes seen
                b = max((self._nt / self._w - mean_n * mean_t) / var, 0.0)
                a = max(mean_t - b * mean_n, 1e-9)
                return b / (a + b * num_tokens)
        return _PRIOR_B_OVER_A / (1.0 + _PRIOR_B_OVER_A * num_tokens)


class SpecPolicy:
    """``k_max``: the most tokens one request drafts; ``adaptive`` False drafts ``k_max``
    whenever the proposer has that many (for tests and measurements)."""

    def __init__(self, k_max: int, adaptive: bool = True) -> None:
        self.k_max = k_max
        self.adaptive = adaptive
        self.cost = StepCostModel()

    def draft_lens(self, states: list[SpecState], num_tokens: int, num_rows: int,
                   proposer_s: float = 0.0) -> list[int]:
        """Draft length per decoding request of a step already holding ``num_tokens`` batched
        tokens, ``num_rows`` of which sample. ``proposer_s``: seconds one more draft position
        costs the proposer for the whole batch (a draft model's forward; 0 for token
        proposers): its share of the step, ``proposer_s / T``, adds to the threshold."""
        if not self.adaptive:
            return [self.k_max] * len(states)
        c = self.cost.b_over_step(num_tokens) * max(num_rows, 1)
        if proposer_s > 0:
            step_s = self.cost.seconds(num_tokens)
            if step_s is not None:
                c += proposer_s / step_s
        out = []
        for s in states:
            k, gain = 0, 1.0
            while k < self.k_max:
                gain *= s.alpha
                if gain <= c:
                    break
                k += 1
            out.append(k)
        return out
