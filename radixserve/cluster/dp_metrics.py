"""Per-replica Prometheus families, beside the summed ones `server.metrics` serves.

The existing ``radixserve:num_requests_running`` etc. stay the sum over replicas (dashboards
keep working); these carry a ``replica`` label: whether it is up, its scheduler gauges and
prefix-cache counters (from its own engine, reset when it restarts), the requests routed to
it and its restarts.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ReplicaCollector:
    """Reads the replicas' latest stats at scrape time (a `ReplicaSet`, started)."""

    def __init__(self, replica_set, model_name: str) -> None:
        self.replica_set = replica_set
        self.model = model_name

    def collect(self):
        dp = self.replica_set.client
        labels = ["model_name", "replica"]
        rows = list(enumerate(dp.replicas))
        gauges = (
            ("radixserve:replica_up", "1 while the replica's engine serves.",
             lambda c: float(c.dead is None)),
            ("radixserve:replica_num_requests_running", "Requests running in the replica.",
             lambda c: c.stats.num_running),
            ("radixserve:replica_num_requests_waiting", "Requests waiting in the replica.",
             lambda c: c.stats.num_waiting),
            ("radixserve:replica_kv_cache_usage_perc", "Fraction of the replica's KV blocks "
             "in use.", lambda c: c.stats.kv_usage),
            ("radixserve:replica_num_pending_requests", "Requests the API process has in "
             "flight at the replica.", lambda c: len(c.queues)))
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=labels)
            for i, c in rows:
                g.add_metric([self.model, str(i)], value(c))
            yield g
        restarts = self.replica_set.num_restarts
        counters = (
            ("radixserve:replica_prefix_cache_queries", "Prefix-cache lookups in the "
             "replica, in tokens (since it started).", lambda i, c: c.stats.prefix_query_tokens),
            ("radixserve:replica_prefix_cache_hits", "Prefix-cache hits in the replica, in "
             "tokens (since it started).", lambda i, c: c.stats.prefix_hit_tokens),
            ("radixserve:replica_routed_requests", "Engine requests routed to the replica.",
             lambda i, c: dp.router.num_routed[i]),
            ("radixserve:replica_engine_restarts", "Engine processes started to replace the "
             "replica's dead one.", lambda i, c: restarts[i]))
        for name, doc, value in counters:
            f = CounterMetricFamily(name, doc, labels=labels)
            for i, c in rows:
                f.add_metric([self.model, str(i)], value(i, c))
            yield f
