"""Prometheus series of admission control: queue depth, rejections, timeouts, aborts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AdmissionMetrics:
    """``registry``: the server's own. Every series carries the ``model_name`` label."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels, m, r = ["model_name"], model_name, registry
        self.waiting_seqs = Gauge("radixserve:admission_waiting_requests",
                                  "Admitted sequences (prompts x n) without a first token yet.",
                                  labels, registry=r).labels(m)
        self.waiting_tokens = Gauge("radixserve:admission_waiting_tokens",
                                    "Prompt tokens of the admitted sequences still waiting.",
                                    labels, registry=r).labels(m)
        self._rejections = Counter("radixserve:request_rejections",
                                   "Requests refused before reaching the engine, by reason.",
                                   ["model_name", "reason"], registry=r)
        self.timeouts = Counter("radixserve:request_queue_timeouts",
                                "Requests ended because they waited past their timeout.",
                                labels, registry=r).labels(m)
        self.aborts = Counter("radixserve:request_aborts",
                              "Engine requests aborted unfinished (client gone, timeout, error).",
                              labels, registry=r).labels(m)
        self.model = m

    def on_queue(self, num_seqs: int, num_tokens: int) -> None:
        self.waiting_seqs.set(num_seqs)
        self.waiting_tokens.set(num_tokens)

    def on_reject(self, reason: str) -> None:
        """``reason``: too_many_waiting, waiting_tokens, body_too_large, body_timeout,
        context_length."""
        self._rejections.labels(self.model, reason).inc()

    def on_timeout(self) -> None:
        self.timeouts.inc()

    def on_abort(self, num_requests: int) -> None:
        self.aborts.inc(num_requests)
