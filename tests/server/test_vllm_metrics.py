"""/metrics under vLLM v1's names beside ours: each ``vllm:`` family with vLLM's type, labels
and buckets, one child per data-parallel replica (``engine``), and the same values as its
``radixserve:`` twin (summed over engines). Two mock replicas, round-robin routing."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_proc import ServerProc

MAX_MODEL_LEN = 1000
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0)
REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)  # 1-2-5 up to max_model_len
# vLLM name (without "vllm:") -> (type, buckets or None)
EXPECTED = {
    "num_requests_running": ("gauge", None),
    "num_requests_waiting": ("gauge", None),
    "kv_cache_usage_perc": ("gauge", None),
    "prefix_cache_queries": ("counter", None),
    "prefix_cache_hits": ("counter", None),
    "num_preemptions": ("counter", None),
    "prompt_tokens": ("counter", None),
    "generation_tokens": ("counter", None),
    "request_success": ("counter", None),
    "time_to_first_token_seconds": ("histogram", TTFT),
    "inter_token_latency_seconds": ("histogram", ITL),
    "request_time_per_output_token_seconds": ("histogram", ITL),
    "e2e_request_latency_seconds": ("histogram", REQUEST),
    "request_queue_time_seconds": ("histogram", REQUEST),
    "request_prefill_time_seconds": ("histogram", REQUEST),
    "request_decode_time_seconds": ("histogram", REQUEST),
    "request_inference_time_seconds": ("histogram", REQUEST),
    "request_prompt_tokens": ("histogram", TOKENS),
    "request_generation_tokens": ("histogram", TOKENS),
    "request_params_max_tokens": ("histogram", TOKENS),
    "request_params_n": ("histogram", (1, 2, 5, 10, 20)),
}
MODEL = "tiny"


@pytest.fixture(scope="module")
def scraped():
    s = ServerProc("--mock-engine", "--served-model-name", MODEL, "--max-model-len",
                   str(MAX_MODEL_LEN), "--data-parallel-size", "2", "--dp-routing",
                   "round_robin", timeout=120)
    try:
        url = f"{s.url}/v1/completions"
        for max_tokens in (3, 5, 7, 9):
            r = httpx.post(url, json={"model": MODEL, "prompt": "hello there",
                                      "max_tokens": max_tokens}, timeout=60)
            assert r.status_code == 200, r.text
        r = httpx.post(url, json={"model": MODEL, "prompt": "two of them", "max_tokens": 4,
                                  "n": 2}, timeout=60)
        assert r.status_code == 200, r.text
        with httpx.stream("POST", url, json={"model": MODEL, "prompt": "a stream",
                                             "max_tokens": 6, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            assert "[DONE]" in r.read().decode()
        text = httpx.get(f"{s.url}/metrics").text
    finally:
        assert s.stop() == 0
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(family, suffix: str = "") -> list:
    return [x for x in family.samples if x.name == family.name + suffix]


def test_each_vllm_family_has_vllms_type_labels_and_buckets(scraped):
    for name, (kind, buckets) in EXPECTED.items():
        family = scraped.get(f"vllm:{name}")
        assert family is not None, f"vllm:{name} missing"
        assert family.type == kind, name
        extra = {"finished_reason"} if name == "request_success" else set()
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = set(sample.labels) - {"le"}
            assert labels == {"model_name", "engine"} | extra, (name, sample)
            assert sample.labels["model_name"] == MODEL
        assert {x.labels["engine"] for x in family.samples} == {"0", "1"}, name
        if buckets is not None:
            for engine in ("0", "1"):
                les = [float(x.labels["le"]) for x in _samples(family, "_bucket")
                       if x.labels["engine"] == engine]
                assert les == [*map(float, buckets), float("inf")], (name, engine)


def test_vllm_families_agree_with_ours(scraped):
    for name in EXPECTED:
        ours, theirs = scraped[f"radixserve:{name}"], scraped[f"vllm:{name}"]
        assert ours.type == theirs.type, name
        suffixes = {"gauge": ("",), "counter": ("_total",), "histogram": ("_sum", "_count")}
        for suffix in suffixes[ours.type]:
            if name == "request_success":
                for reason in ("stop", "length", "abort", "error"):
                    mine = sum(x.value for x in _samples(ours, suffix)
                               if x.labels["finished_reason"] == reason)
                    their = sum(x.value for x in _samples(theirs, suffix)
                                if x.labels["finished_reason"] == reason)
                    assert mine == pytest.approx(their), (name, reason)
                continue
            mine = sum(x.value for x in _samples(ours, suffix))
            their = sum(x.value for x in _samples(theirs, suffix))
            assert mine == pytest.approx(their), (name, suffix)


def test_what_was_observed(scraped):
    def total(name: str, suffix: str, engine: str | None = None) -> float:
        return sum(x.value for x in _samples(scraped[f"vllm:{name}"], suffix)
                   if engine is None or x.labels["engine"] == engine)

    # 6 HTTP requests, 7 samples (one with n=2), all to their max_tokens
    length = [x.value for x in _samples(scraped["vllm:request_success"], "_total")
              if x.labels["finished_reason"] == "length"]
    assert sum(length) == 7
    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_generation_tokens", "request_params_max_tokens"):
        assert total(name, "_count") == 7, name
    assert total("time_to_first_token_seconds", "_count") == 6
    assert total("request_params_n", "_count") == 6
    assert total("request_params_n", "_sum") == 4 * 1 + 2 + 1
    assert total("request_generation_tokens", "_sum") == 3 + 5 + 7 + 9 + 2 * 4 + 6
    assert total("generation_tokens", "_total") == 3 + 5 + 7 + 9 + 2 * 4 + 6
    assert total("request_params_max_tokens", "_sum") == 3 + 5 + 7 + 9 + 2 * 4 + 6
    # round robin: both replicas served requests, each under its own engine label
    assert total("e2e_request_latency_seconds", "_count", "0") > 0
    assert total("e2e_request_latency_seconds", "_count", "1") > 0
