"""The image encoder's counters in the engine's `SchedulerStats` (served at /metrics:
frontend/http/metrics.py). Torch-free: the API process sums them over replicas."""

from __future__ import annotations

# SchedulerStats fields, each a counter summed over data-parallel replicas
IMAGE_FIELDS = ("images_encoded", "image_encoder_hits", "image_encode_seconds", "image_rows")


def fill_image_stats(stats, engine) -> None:
    """Copy the counters of ``engine``'s image encoder (runner/image_embeds.py) into
    ``stats``; zeros for a text-only model (core/images.py `NO_IMAGES`) or the mock engine."""
    images = getattr(getattr(engine, "images", None), "stats", None)
    if images is None:
        return
    stats.images_encoded = images.num_images_encoded
    stats.image_encoder_hits = images.num_encoder_hits
    stats.image_encode_seconds = images.encode_seconds
    stats.image_rows = images.num_image_rows


def image_metric_families(model: str, stats):
    """Ours (vLLM's multimodal cache metrics are per GPU encoder cache): images encoded and
    kept, the encoder's seconds, image-token rows computed."""
    from prometheus_client.core import CounterMetricFamily

    images = CounterMetricFamily(
        "radixserve:images", "Images by what the engine did with them: encoded by the vision "
        "encoder, or found among the encoder outputs it keeps.", labels=["model_name", "op"])
    images.add_metric([model, "encoded"], stats.images_encoded)
    images.add_metric([model, "cache_hit"], stats.image_encoder_hits)
    yield images
    seconds = CounterMetricFamily("radixserve:image_encode_seconds",
                                  "Seconds the vision encoder ran.", labels=["model_name"])
    seconds.add_metric([model], stats.image_encode_seconds)
    yield seconds
    rows = CounterMetricFamily(
        "radixserve:image_tokens", "Image-token rows computed in prefill (the rest came from "
        "the prefix cache).", labels=["model_name"])
    rows.add_metric([model], stats.image_rows)
    yield rows
