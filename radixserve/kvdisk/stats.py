"""The disk tier's counters in the engine's `SchedulerStats` (served at /metrics:
frontend/http/metrics.py). Torch-free: the API process sums them over replicas."""

from __future__ import annotations

# SchedulerStats fields, each a counter summed over data-parallel replicas
KV_DISK_FIELDS = ("kv_disk_hit_tokens", "kv_disk_pages_written", "kv_disk_pages_read",
                  "kv_disk_pages_corrupt", "kv_disk_pages_dropped", "kv_disk_bytes_written",
                  "kv_disk_bytes_read")


def fill_disk_stats(stats, kv) -> None:
    """Copy the counters of ``kv``'s disk tier (kv: the `KVCacheManager`, None for the mock
    engine) into ``stats``; nothing without a tier."""
    tier = getattr(kv, "disk", None)
    store = getattr(tier, "store", None)
    if store is None:
        return
    stats.kv_disk_hit_tokens = kv.num_disk_hit_tokens
    stats.kv_disk_pages_written = store.stats.num_pages_written
    stats.kv_disk_pages_read = store.stats.num_pages_read
    stats.kv_disk_pages_corrupt = store.stats.num_corrupt
    stats.kv_disk_pages_dropped = tier.stats.num_pages_dropped
    stats.kv_disk_bytes_written = store.stats.num_bytes_written
    stats.kv_disk_bytes_read = store.stats.num_bytes_read


def disk_metric_families(model: str, stats):
    """Ours only (vLLM has no disk tier; its ``external_prefix_cache_hits``, the disk's
    hits in tokens, is among the engine counters): pages and bytes by what was done."""
    from prometheus_client.core import CounterMetricFamily

    pages = CounterMetricFamily(
        "radixserve:kv_disk_pages", "KV pages of the disk tier (--kv-disk-cache): written, "
        "read back, corrupt (damaged or foreign files found and deleted), dropped (evicted "
        "while the writer was behind, not saved).", labels=["model_name", "op"])
    for op in ("written", "read", "corrupt", "dropped"):
        pages.add_metric([model, op], getattr(stats, f"kv_disk_pages_{op}"))
    yield pages
    size = CounterMetricFamily("radixserve:kv_disk_bytes", "Bytes of KV pages the disk tier "
                               "wrote and read back.", labels=["model_name", "op"])
    for op in ("written", "read"):
        size.add_metric([model, op], getattr(stats, f"kv_disk_bytes_{op}"))
    yield size
