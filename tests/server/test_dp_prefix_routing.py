"""``--data-parallel-size 2`` on a tiny random-weight Llama: every request answered with the
greedy text one engine gives, and on 4 long system prompts × 8 requests (in a shuffled order)
cache-aware routing keeps each system prompt on one replica, so the replicas' prefix-cache hit
rate stays within 90 % of a single engine's and above round robin's, which sends each prompt
to both. The servers run one after another (one module fixture), each with the same model."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import make_hf_model

NUM_PREFIXES, PER_PREFIX = 4, 8
CONFIGS = {"dp1": ("--data-parallel-size", "1"),
           "cache_aware": ("--data-parallel-size", "2", "--dp-routing", "cache_aware"),
           "round_robin": ("--data-parallel-size", "2", "--dp-routing", "round_robin")}


def _system_prompt(k: int) -> str:
    rng = random.Random(k)
    words = ["river", "stone", "lamp", "garden", "copper", "window", "quiet", "north",
             "signal", "paper", "orbit", "velvet", "harbor", "maple", "ember", "thread"]
    return f"System {k}. " + " ".join(rng.choice(words) for _ in range(700))


def _workload() -> list[tuple[int, str]]:
    items = [(k, f"Question {j} about topic {k}?") for k in range(NUM_PREFIXES)
             for j in range(PER_PREFIX)]
    random.Random(7).shuffle(items)
    return items


def _chat(url: str, k: int, question: str) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "system", "content": _system_prompt(k)},
                     {"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    model = make_hf_model("llama", tmp_path_factory.mktemp("dp") / "llama", seed=3,
                          max_position_embeddings=4096)
    results = {}
    for name, flags in CONFIGS.items():
        server = ServerProc("--model", str(model), "--served-model-name", "tiny", *flags,
                            timeout=240)
        try:
            n = httpx.post(f"{server.url}/tokenize",
                           json={"prompt": _system_prompt(0)}).json()["count"]
            texts = [_chat(server.url, k, q) for k, q in _workload()]  # one at a time
            with ThreadPoolExecutor(8) as pool:  # and a burst of concurrent ones
                burst = list(pool.map(lambda kq: _chat(server.url, *kq), _workload()[:8]))
            load = httpx.get(f"{server.url}/load").json()
        finally:
            assert server.stop() == 0
        results[name] = dict(texts=texts, burst=burst, load=load, prompt_tokens=n)
    return results


def _hit_rate(load: dict) -> float:
    return load["prefix_cache_hit_tokens"] / load["prefix_cache_query_tokens"]


def test_every_request_is_answered_with_the_single_engine_greedy_text(runs):
    assert runs["dp1"]["prompt_tokens"] >= 1000
    for name in ("cache_aware", "round_robin"):
        assert runs[name]["texts"] == runs["dp1"]["texts"], name
        assert runs[name]["burst"] == runs["dp1"]["texts"][:8], name
    assert len(set(runs["dp1"]["texts"])) > 1  # the outputs depend on the prompt


def test_both_replicas_served_and_the_load_is_summed(runs):
    for name in ("cache_aware", "round_robin"):
        load = runs[name]["load"]
        replicas = load["replicas"]
        assert len(replicas) == 2 and all(r["up"] for r in replicas)
        assert all(r["num_routed_requests"] > 0 for r in replicas), replicas
        assert sum(r["num_routed_requests"] for r in replicas) == 40
        for key in ("prefix_cache_hit_tokens", "prefix_cache_query_tokens", "num_kv_blocks"):
            assert load[key] == sum(r[key] for r in replicas), key


def test_cache_aware_routing_keeps_the_hit_rate_of_one_engine_and_beats_round_robin(runs):
    single = _hit_rate(runs["dp1"]["load"])
    cache_aware = _hit_rate(runs["cache_aware"]["load"])
    round_robin = _hit_rate(runs["round_robin"]["load"])
    print(f"prefix hit rate: one engine {single:.3f}, cache_aware {cache_aware:.3f}, "
          f"round_robin {round_robin:.3f}")
    assert single > 0.8  # 28 of 32 system prompts are repeats
    assert cache_aware >= 0.9 * single, (cache_aware, single)
    assert cache_aware > round_robin, (cache_aware, round_robin)
