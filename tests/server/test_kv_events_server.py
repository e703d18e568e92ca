"""``radixserve serve --data-parallel-size 2 --kv-events-config ...`` on a tiny random-weight
Llama: each replica publishes on the endpoint's port + its rank, its batches carry that
rank, and the hashes are vLLM's for the prompt tokens (PYTHONHASHSEED set for the server)."""

from __future__ import annotations

import json
import socket

import httpx
from kv_event_wire import BS, SEED, BlockStored, Subscriber, vllm_hashes
from server_proc import ServerProc
from tiny_models import make_hf_model


def _two_free_ports() -> int:
    """A port p with p + 1 free too (for replicas 0 and 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two adjacent free ports")


def test_replicas_publish_on_offset_ports_with_their_rank(tmp_path):
    model = make_hf_model("llama", tmp_path / "llama", seed=3)
    port = _two_free_ports()
    # "*": the PUB binds (with a host name it would connect, as in vLLM)
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
    server = ServerProc("--model", str(model), "--served-model-name", "tiny",
                        "--block-size", str(BS), "--data-parallel-size", "2",
                        "--dp-routing", "round_robin", "--kv-events-config", json.dumps(config),
                        env={"PYTHONHASHSEED": SEED}, timeout=240)
    subs = [Subscriber(f"tcp://127.0.0.1:{port + rank}", b"kv") for rank in (0, 1)]
    try:
        prompts = [[5 + i] * (3 * BS) + [7] * 5 for i in range(2)]
        for prompt in prompts:  # round robin: one to each replica
            r = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
        got = [sub.drain(1.0) for sub in subs]
    finally:
        for sub in subs:
            sub.close()
        server.stop()
    firsts = []
    for rank, batches in enumerate(got):
        assert batches, f"replica {rank} published nothing"
        assert {batch.data_parallel_rank for _, batch in batches} == {rank}
        stored = [e for _, b in batches for e in b.events if isinstance(e, BlockStored)]
        firsts.append(stored[0])
    expected = [vllm_hashes(p)[:3] for p in prompts]
    assert sorted(e.block_hashes[:3] for e in firsts) == sorted(expected)
