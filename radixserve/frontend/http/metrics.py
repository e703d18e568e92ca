"""Prometheus metrics (prometheus-client), in a registry of the server's own.

Latencies are measured from HTTP arrival; engine gauges come from the scheduler stats that ride
on every engine step's output message.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry, Counter, Histogram, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from radixserve.frontend.async_llm import MetricsSink
from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.http.admission_metrics import AdmissionMetrics

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5)


class _EngineCollector:
    """Reads the latest scheduler stats at scrape time."""

    def __init__(self, client, model_name: str) -> None:
        self.client = client
        self.model = model_name

    def collect(self):
        s = self.client.stats
        labels = ["model_name"]
        for name, doc, value in (
                ("radixserve:num_requests_running", "Requests running in the engine.",
                 s.num_running),
                ("radixserve:num_requests_waiting", "Requests waiting for the engine.",
                 s.num_waiting),
                ("radixserve:kv_cache_usage_perc", "Fraction of KV blocks in use.", s.kv_usage)):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self.model], value)
            yield g
        for name, doc, value in (
                ("radixserve:prefix_cache_queries", "Prefix-cache lookups, in tokens.",
                 s.prefix_query_tokens),
                ("radixserve:prefix_cache_hits", "Prefix-cache hits, in tokens.",
                 s.prefix_hit_tokens),
                ("radixserve:num_preemptions", "Requests preempted (recomputed).",
                 s.num_preemptions),
                ("radixserve:spec_decode_num_drafts", "Speculative drafts verified.",
                 s.spec_num_drafts),
                ("radixserve:spec_decode_num_draft_tokens", "Speculative tokens drafted.",
                 s.spec_draft_tokens),
                ("radixserve:spec_decode_num_accepted_tokens", "Speculative tokens accepted.",
                 s.spec_accepted_tokens)):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric([self.model], value)
            yield c
        yield from self._spec_per_position(s)

    def _spec_per_position(self, s):
        """Accepted drafts, drafts that reached each position, and the acceptance rate at
        each draft position (0 = first), as vLLM defines it: of all verified drafts. Drafts
        differ in length (the policy adapts them), so accepted / drafted at a position is
        the acceptance of the drafts that had a token there."""
        labels = ["model_name", "position"]
        c = CounterMetricFamily("radixserve:spec_decode_num_accepted_tokens_per_pos",
                                "Drafts whose token at this position was accepted.",
                                labels=labels)
        d = CounterMetricFamily("radixserve:spec_decode_num_draft_tokens_per_pos",
                                "Drafts that had a token at this position.", labels=labels)
        for i, n in enumerate(s.spec_drafted_per_pos):
            d.add_metric([self.model, str(i)], n)
        g = GaugeMetricFamily("radixserve:spec_decode_acceptance_rate_per_pos",
                              "Fraction of verified drafts accepted up to this position.",
                              labels=labels)
        for i, n in enumerate(s.spec_accepted_per_pos):
            c.add_metric([self.model, str(i)], n)
            g.add_metric([self.model, str(i)], n / s.spec_num_drafts if s.spec_num_drafts else 0.0)
        yield c
        yield d
        yield g


class ServerMetrics(MetricsSink):
    def __init__(self, client, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels, m = self.registry, ["model_name"], model_name
        self.requests = Counter("radixserve:request_success", "Finished requests by reason.",
                                ["model_name", "finished_reason"], registry=r)
        self.prompt_tokens = Counter("radixserve:prompt_tokens", "Prompt tokens processed.",
                                     labels, registry=r).labels(m)
        self.generation_tokens = Counter("radixserve:generation_tokens",
                                         "Tokens generated, counted as they stream (aborted "
                                         "requests' too).",
                                         labels, registry=r).labels(m)
        self.ttft = Histogram("radixserve:time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=_LATENCY_BUCKETS, registry=r).labels(m)
        self.itl = Histogram("radixserve:inter_token_latency_seconds", "Inter-token latency.",
                             labels, buckets=_ITL_BUCKETS, registry=r).labels(m)
        self.e2e = Histogram("radixserve:e2e_request_latency_seconds", "End-to-end latency.",
                             labels, buckets=_LATENCY_BUCKETS, registry=r).labels(m)
        self.queue = Histogram("radixserve:request_queue_time_seconds",
                               "Time waiting before first scheduled.", labels,
                               buckets=_LATENCY_BUCKETS, registry=r).labels(m)
        self.engine_restarts = Counter(
            "radixserve:engine_restarts", "Engine processes started to replace a dead one.",
            labels, registry=r).labels(m)
        self.model = m
        self.admission = AdmissionMetrics(r, m)
        self.registry.register(_EngineCollector(client, model_name))

    def on_first_token(self, ttft: float, queue_time: float | None) -> None:
        self.ttft.observe(ttft)
        if queue_time is not None:
            self.queue.observe(queue_time)

    def on_token(self, itl: float) -> None:
        self.itl.observe(itl)

    def on_generated(self, num_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)

    def on_finish(self, state: RequestState, num_prompt: int, e2e: float) -> None:
        self.requests.labels(self.model, state.finish_reason or "abort").inc()
        if state.index == 0:
            self.prompt_tokens.inc(num_prompt)
        self.e2e.observe(e2e)

    def on_abort(self, num_requests: int) -> None:
        self.admission.on_abort(num_requests)

    def render(self) -> bytes:
        return generate_latest(self.registry)
