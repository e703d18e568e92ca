"""Prometheus metrics (prometheus-client), in a registry of the server's own.

Every family is published twice from the same observation: ``radixserve:<name>`` (labelled by
``model_name``; summed over data-parallel replicas) and vLLM v1's ``vllm:<name>`` with vLLM's
type, labels (``model_name``, ``engine``: the replica) and buckets, so dashboards and
autoscalers written for vLLM workers read radixserve unchanged. Latencies are measured from
HTTP arrival; engine gauges and counters come from the scheduler stats that ride on every
engine step's output message.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from radixserve.frontend.async_llm import FinishedSample, MetricsSink
from radixserve.frontend.http.admission_metrics import AdmissionMetrics
from radixserve.image_stats import image_metric_families
from radixserve.kvdisk.stats import disk_metric_families

# our buckets for the families we published before vLLM's names (dashboards use their le)
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5)
# vLLM's (vllm/v1/metrics/loggers.py)
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_N_BUCKETS = (1, 2, 5, 10, 20)
VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's buckets for token counts)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


# Scheduler stats, read at scrape time: (name after the prefix, help, SchedulerStats field)
_ENGINE_GAUGES = (
    ("num_requests_running", "Requests running in the engine.", "num_running"),
    ("num_requests_waiting", "Requests waiting for the engine.", "num_waiting"),
    ("kv_cache_usage_perc", "Fraction of KV blocks in use (1 = all).", "kv_usage"),
)
_ENGINE_COUNTERS = (
    ("prefix_cache_queries", "Prefix-cache lookups, in tokens.", "prefix_query_tokens"),
    ("prefix_cache_hits", "Prefix-cache hits, in tokens.", "prefix_hit_tokens"),
    ("num_preemptions", "Requests preempted (recomputed).", "num_preemptions"),
    ("spec_decode_num_drafts", "Speculative drafts verified.", "spec_num_drafts"),
    ("spec_decode_num_draft_tokens", "Speculative tokens drafted.", "spec_draft_tokens"),
    ("spec_decode_num_accepted_tokens", "Speculative tokens accepted.",
     "spec_accepted_tokens"),
    ("external_prefix_cache_hits", ("Prefix-cache hits read back from the disk tier "
                                    "(--kv-disk-cache), in tokens."), "kv_disk_hit_tokens"),
)


class _EngineCollector:
    """Reads the latest scheduler stats at scrape time: ours summed over the replicas
    (``client.stats``), vLLM's per replica (``client.replicas[i].stats``, engine="i")."""

    def __init__(self, client, model_name: str) -> None:
        self.client = client
        self.model = model_name

    def collect(self):
        summed = self.client.stats
        engines = [(str(i), c.stats) for i, c in enumerate(self.client.replicas)]
        for family, rows in ((GaugeMetricFamily, _ENGINE_GAUGES),
                             (CounterMetricFamily, _ENGINE_COUNTERS)):
            for name, doc, field in rows:
                ours = family(f"radixserve:{name}", doc, labels=["model_name"])
                ours.add_metric([self.model], getattr(summed, field))
                yield ours
                theirs = family(f"vllm:{name}", doc, labels=["model_name", "engine"])
                for engine, stats in engines:
                    theirs.add_metric([self.model, engine], getattr(stats, field))
                yield theirs
        yield from self._spec_per_position(summed)
        # ours only: vLLM publishes no such family
        dropped = CounterMetricFamily(
            "radixserve:kv_events_dropped", "KV cache events the engines dropped before "
            "sending (publisher queue full or send failed; --kv-events-config).",
            labels=["model_name"])
        dropped.add_metric([self.model], summed.num_kv_events_dropped)
        yield dropped
        subscribers = CounterMetricFamily(
            "radixserve:kv_event_subscribers_dropped", "KV event subscribers dropped: behind, "
            "each time one reached its high-water mark (it misses batches until it reads its "
            "backlog); over_limit, connections closed past max_subscribers.",
            labels=["model_name", "reason"])
        subscribers.add_metric([self.model, "behind"], summed.num_kv_event_subscribers_behind)
        subscribers.add_metric([self.model, "over_limit"],
                               summed.num_kv_event_subscribers_refused)
        yield subscribers
        yield from disk_metric_families(self.model, summed)
        yield from image_metric_families(self.model, summed)

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


class _Twin:
    """One observation, two families: ``radixserve:<name>`` {model_name, *extra} and
    ``vllm:<name>`` {model_name, engine, *extra}. vLLM's children exist from the start for
    every engine (and every value of ``presets``), as vLLM creates them."""

    def __init__(self, cls, name: str, doc: str, registry, model: str, num_engines: int,
                 buckets=None, vllm_buckets=None, extra: tuple[str, ...] = (),
                 presets: tuple[tuple[str, ...], ...] = ((),)) -> None:
        def family(prefix, labels, b):
            kw = {} if b is None else {"buckets": b}
            return cls(f"{prefix}:{name}", doc, ["model_name", *labels], registry=registry,
                       **kw)

        self.ours = family("radixserve", extra, buckets)
        self.theirs = family("vllm", ("engine", *extra), vllm_buckets or buckets)
        self.model = model
        if not extra:
            self.ours.labels(model)
        for engine in range(num_engines):
            for values in presets:
                self.theirs.labels(model, str(engine), *values)

    def observe(self, value: float, engine: int, *extra: str) -> None:
        self.ours.labels(self.model, *extra).observe(value)
        self.theirs.labels(self.model, str(engine), *extra).observe(value)

    def inc(self, value: float, engine: int, *extra: str) -> None:
        self.ours.labels(self.model, *extra).inc(value)
        self.theirs.labels(self.model, str(engine), *extra).inc(value)


class ServerMetrics(MetricsSink):
    """``client``: the engine client with ``stats`` (summed) and ``replicas`` (each with its
    own ``stats``); ``max_model_len`` sets the token-count buckets, as in vLLM."""

    def __init__(self, client, model_name: str, max_model_len: int) -> None:
        self.registry = r = CollectorRegistry()
        m, n = model_name, len(client.replicas)

        def twin(cls, name, doc, **kw):
            return _Twin(cls, name, doc, r, m, n, **kw)

        tokens = buckets_1_2_5(max_model_len)
        self.requests = twin(Counter, "request_success", "Finished requests by reason.",
                             extra=("finished_reason",),
                             presets=tuple((x,) for x in VLLM_FINISH_REASONS))
        self.prompt_tokens = twin(Counter, "prompt_tokens",
                                  "Prompt tokens processed (once per request, whatever n).")
        self.generation_tokens = twin(Counter, "generation_tokens",
                                      "Tokens generated, counted as they stream (aborted "
                                      "requests' too).")
        self.ttft = twin(Histogram, "time_to_first_token_seconds", "Time to first token.",
                         buckets=_LATENCY_BUCKETS, vllm_buckets=VLLM_TTFT_BUCKETS)
        self.itl = twin(Histogram, "inter_token_latency_seconds", "Inter-token latency.",
                        buckets=_ITL_BUCKETS, vllm_buckets=VLLM_ITL_BUCKETS)
        self.e2e = twin(Histogram, "e2e_request_latency_seconds", "End-to-end latency.",
                        buckets=_LATENCY_BUCKETS, vllm_buckets=VLLM_REQUEST_BUCKETS)
        self.queue = twin(Histogram, "request_queue_time_seconds",
                          "Per sample: arrival to first scheduled.",
                          buckets=_LATENCY_BUCKETS, vllm_buckets=VLLM_REQUEST_BUCKETS)
        self.prefill = twin(Histogram, "request_prefill_time_seconds",
                            "First scheduled to first output.", buckets=VLLM_REQUEST_BUCKETS)
        self.decode = twin(Histogram, "request_decode_time_seconds",
                           "First output to finish.", buckets=VLLM_REQUEST_BUCKETS)
        self.inference = twin(Histogram, "request_inference_time_seconds",
                              "First scheduled to finish.", buckets=VLLM_REQUEST_BUCKETS)
        self.tpot = twin(Histogram, "request_time_per_output_token_seconds",
                         "Per request: decode time per output token after the first.",
                         buckets=VLLM_ITL_BUCKETS)
        self.request_prompt = twin(Histogram, "request_prompt_tokens",
                                   "Prompt tokens per finished request.", buckets=tokens)
        self.request_generation = twin(Histogram, "request_generation_tokens",
                                       "Generated tokens per finished request.",
                                       buckets=tokens)
        self.max_tokens = twin(Histogram, "request_params_max_tokens",
                               "The max_tokens request parameter.", buckets=tokens)
        self.n = twin(Histogram, "request_params_n", "The n request parameter.",
                      buckets=VLLM_N_BUCKETS)
        self.engine_restarts = Counter(
            "radixserve:engine_restarts", "Engine processes started to replace a dead one.",
            ["model_name"], registry=r).labels(m)
        self.admission = AdmissionMetrics(r, m)
        self.registry.register(_EngineCollector(client, model_name))

    def on_first_token(self, ttft: float, engine: int) -> None:
        self.ttft.observe(ttft, engine)

    def on_token(self, itl: float, engine: int) -> None:
        self.itl.observe(itl, engine)

    def on_generated(self, num_tokens: int, engine: int) -> None:
        self.generation_tokens.inc(num_tokens, engine)

    def on_finish(self, sample: FinishedSample) -> None:
        state, engine = sample.state, sample.engine
        self.requests.inc(1, engine, state.finish_reason or "abort")
        if state.index == 0:  # once per HTTP request
            self.prompt_tokens.inc(sample.num_prompt_tokens, engine)
            self.n.observe(sample.n, engine)
        self.e2e.observe(sample.e2e, engine)
        self.decode.observe(sample.decode_time, engine)
        self.tpot.observe(sample.time_per_output_token, engine)
        if sample.queue_time is not None:
            self.queue.observe(sample.queue_time, engine)
            self.prefill.observe(sample.prefill_time, engine)
            self.inference.observe(sample.inference_time, engine)
        self.request_prompt.observe(sample.num_prompt_tokens, engine)
        self.request_generation.observe(sample.num_generation_tokens, engine)
        if state.params.max_tokens:
            self.max_tokens.observe(state.params.max_tokens, engine)

    def on_abort(self, num_requests: int) -> None:
        self.admission.on_abort(num_requests)

    def render(self) -> bytes:
        return generate_latest(self.registry)
