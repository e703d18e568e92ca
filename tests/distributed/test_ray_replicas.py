"""``--distributed-executor-backend ray``: a local Ray head on loopback started by this module
(``ray.init`` in the test process, 2 CPUs), ``radixserve serve --data-parallel-size 2`` joining
it as a second driver. The replicas are actors in one placement group; both answer (a tiny
random-weight Llama: the same greedy text from each); a replica actor SIGKILLed fails only its
own requests and is replaced in its bundle; after the server exits no actor of it is alive,
its placement group is removed and the cluster's CPUs are free again. Skipped, saying so,
only where Ray is not installed (it is in the test extra)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'radixserve[ray]'; "
                          "it is in the test extra)")

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from server_proc import ServerProc  # noqa: E402
from tiny_models import make_hf_model  # noqa: E402

from radixserve.cluster.ray_executor import NAMESPACE  # noqa: E402

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def cluster():
    """A Ray head of 2 CPUs owned by this process; its workers import radixserve from this
    tree (they inherit PYTHONPATH from the head)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        info = ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE,
                        object_store_memory=80 * 1024**2, _node_ip_address="127.0.0.1")
    yield info.address_info["gcs_address"]
    ray.shutdown()


def _named_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("radixserve-")]


def _chat(url: str, text: str) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _replicas(url: str) -> list[dict]:
    return httpx.get(f"{url}/load").json()["replicas"]


def _placement_groups() -> list[dict]:
    return [pg for pg in ray.util.placement_group_table().values()
            if pg["name"].startswith("radixserve-")]


def test_two_replicas_as_ray_actors_answer_restart_and_leave_nothing(cluster, tmp_path):
    model = make_hf_model("llama", tmp_path / "llama", seed=3)
    server = ServerProc("--model", str(model), "--served-model-name", "tiny",
                        "--data-parallel-size", "2", "--dp-routing", "round_robin",
                        "--distributed-executor-backend", "ray", "--ray-address", cluster,
                        "--ray-placement-strategy", "PACK", "--engine-restart-attempts", "2",
                        timeout=300)
    try:
        replicas = _replicas(server.url)
        assert [r["up"] for r in replicas] == [True, True]
        assert len(_named_actors()) == 2
        [pg] = [pg for pg in _placement_groups() if pg["state"] == "CREATED"]
        assert pg["strategy"] == "PACK" and len(pg["bundles"]) == 2
        assert ray.available_resources().get("CPU", 0) == 0  # both bundles hold their CPU
        texts = [_chat(server.url, "Tell me about rivers.") for _ in range(2)]
        assert texts[0] == texts[1] and texts[0]
        assert [r["num_routed_requests"] for r in _replicas(server.url)] == [1, 1]

        dead_pid = replicas[0]["pid"]
        os.kill(dead_pid, signal.SIGKILL)
        deadline = time.monotonic() + 180
        while (r := _replicas(server.url)[0])["up"] and r["pid"] == dead_pid:
            assert time.monotonic() < deadline, "the actor's death went unnoticed"
            time.sleep(0.1)  # Ray reports it (no sentinel to watch as for a local process)
        while True:
            replicas = _replicas(server.url)
            if replicas[0]["up"] and replicas[0]["pid"] != dead_pid:
                break
            assert time.monotonic() < deadline, replicas
            assert _chat(server.url, "Tell me about rivers.") == texts[0]  # replica 1 serves
            time.sleep(0.5)
        assert [_chat(server.url, "Tell me about rivers.") for _ in range(2)] == texts
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'radixserve:replica_engine_restarts_total{model_name="tiny",replica="0"} 1.0' \
            in metrics
    finally:
        assert server.stop() == 0, server.proc.stdout.read()
    assert _named_actors() == []
    assert {pg["state"] for pg in _placement_groups()} == {"REMOVED"}
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) != 2:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)

