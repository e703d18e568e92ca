"""``radixserve serve --models-dir`` end to end over HTTP: a folder with a tiny Hugging Face
folder, a tiny GGUF and a file that is not a model. Mock engines (real processes, no model) for
the hub's behaviour; one test loads a real tiny model. Listing with states, load on first
request, 404 naming the models in each API's shape, 400 for a non-model (nothing leaked), LRU
eviction, keep_alive 0 / -1 and Ollama's empty-prompt calls, /models/load and /unload,
concurrent load/unload, memory refusal, no engine left after shutdown."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProc, _cmdline

HI = [{"role": "user", "content": "hi"}]
MOCK = ("--mock-engine", "--kv-cache-memory-gb", "0.01")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, tiny_hf_dirs, tiny_gguf_files):
    folder = tmp_path_factory.mktemp("models")
    (folder / "llama-hf").symlink_to(tiny_hf_dirs["llama"], target_is_directory=True)
    (folder / "qwen.gguf").symlink_to(tiny_gguf_files("qwen2", "F32"))
    (folder / "notes.gguf").write_text("these are my notes, not a model\n")
    return str(folder)


@pytest.fixture(scope="module")
def hub(models_dir):
    s = ServerProc("--models-dir", models_dir, "--max-loaded-models", "1",
                   "--models-idle-unload", "0", *MOCK)
    yield s
    assert s.stop() == 0
    assert engines(s) == []


def engines(server: ServerProc) -> list[int]:
    return [p for p in server.engine_pids() if b"spawn_main" in _cmdline(p)]


def states(server: ServerProc) -> dict[str, str]:
    data = httpx.get(f"{server.url}/v1/models").json()["data"]
    return {card["id"]: card["status"]["value"] for card in data}


def chat(server: ServerProc, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                      json={"model": model, "messages": HI, "max_tokens": 3, **extra})


def ollama(server: ServerProc, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/api/{path}", json={"stream": False, **body}, timeout=60)


def unload_all(server: ServerProc) -> None:
    for name in states(server):
        httpx.post(f"{server.url}/models/unload", json={"model": name}, timeout=60)


def test_listing_and_load_on_first_request(hub):
    unload_all(hub)
    assert states(hub) == {"llama-hf": "unloaded", "notes": "unloaded", "qwen": "unloaded"}
    tags = httpx.get(f"{hub.url}/api/tags").json()["models"]
    assert [(t["name"], t["state"]) for t in tags] == [
        ("llama-hf:latest", "unloaded"), ("notes:latest", "unloaded"), ("qwen:latest", "unloaded")]
    assert httpx.get(f"{hub.url}/api/ps").json()["models"] == []
    shown = httpx.post(f"{hub.url}/api/show", json={"model": "qwen:latest"}).json()
    assert "im_start" in shown["template"] and shown["details"]["format"] == "gguf"
    assert states(hub)["qwen"] == "unloaded"  # described from its file, not loaded
    answer = chat(hub, "llama-hf")
    assert answer.status_code == 200 and answer.json()["model"] == "llama-hf"
    assert states(hub)["llama-hf"] == "loaded" and len(engines(hub)) == 1
    ps = httpx.get(f"{hub.url}/api/ps").json()["models"]
    assert [(m["name"], m["state"]) for m in ps] == [("llama-hf:latest", "loaded")]
    card = httpx.get(f"{hub.url}/v1/models/llama-hf").json()
    assert card["status"]["value"] == "loaded" and card["max_model_len"] > 0
    assert httpx.get(f"{hub.url}/health").json()["models"]["llama-hf"] == "loaded"


def test_unknown_model_is_404_in_each_shape(hub):
    openai = chat(hub, "gpt-17")
    assert openai.status_code == 404
    error = openai.json()["error"]
    assert error["code"] == "model_not_found" and "llama-hf, notes, qwen" in error["message"]
    oll = ollama(hub, "chat", model="gpt-17", messages=HI)
    assert oll.status_code == 404 and "llama-hf, notes, qwen" in oll.json()["error"]
    anth = httpx.post(f"{hub.url}/v1/messages", headers={"anthropic-version": "2023-06-01"},
                      json={"model": "gpt-17", "max_tokens": 3, "messages": HI})
    assert anth.status_code == 404 and anth.json()["type"] == "error"
    assert "llama-hf" in anth.json()["error"]["message"]
    assert httpx.get(f"{hub.url}/v1/models/gpt-17").status_code == 404


def test_not_a_model_is_400_and_the_server_serves_on(hub):
    before = set(engines(hub))
    answer = chat(hub, "notes")
    assert answer.status_code == 400 and "not a GGUF file" in answer.json()["error"]["message"]
    load = httpx.post(f"{hub.url}/models/load", json={"model": "notes"})
    assert load.status_code == 400
    assert set(engines(hub)) == before and states(hub)["notes"] == "unloaded"
    assert chat(hub, "qwen").status_code == 200


def test_lru_eviction_with_one_model_at_a_time(hub):
    assert chat(hub, "llama-hf").status_code == 200
    assert chat(hub, "qwen").status_code == 200
    assert states(hub) == {"llama-hf": "unloaded", "notes": "unloaded", "qwen": "loaded"}
    assert len(engines(hub)) == 1
    assert ollama(hub, "generate", model="llama-hf", prompt="hi",
                  options={"num_predict": 2}).status_code == 200
    assert states(hub)["llama-hf"] == "loaded" and states(hub)["qwen"] == "unloaded"


def test_load_and_unload_routes(hub):
    load = httpx.post(f"{hub.url}/models/load", json={"model": "qwen"}, timeout=60)
    assert load.json() == {"model": "qwen", "state": "loaded"}
    unload = httpx.post(f"{hub.url}/models/unload", json={"model": "qwen"}, timeout=60)
    assert unload.json() == {"model": "qwen", "state": "unloaded", "was_loaded": True}
    assert engines(hub) == []
    missing = httpx.post(f"{hub.url}/models/load", json={"model": "nope"})
    assert missing.status_code == 404 and "qwen" in missing.json()["error"]["message"]


def test_concurrent_load_and_unload_of_one_model(hub):
    def one(i: int) -> int:
        if i % 3 == 0:
            return httpx.post(f"{hub.url}/models/unload", json={"model": "qwen"},
                              timeout=60).status_code
        if i % 3 == 1:
            return httpx.post(f"{hub.url}/models/load", json={"model": "qwen"},
                              timeout=60).status_code
        return chat(hub, "qwen").status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(24)))
    assert set(codes) <= {200, 503}, codes  # 503: a chat whose model was unloaded under it
    assert codes.count(200) >= 16
    assert len(engines(hub)) == (1 if states(hub)["qwen"] == "loaded" else 0)
    assert chat(hub, "qwen").status_code == 200 and len(engines(hub)) == 1


def test_one_models_engine_crash_leaves_the_others_serving(models_dir):
    s = ServerProc("--models-dir", models_dir, *MOCK)
    try:
        assert chat(s, "qwen").status_code == 200
        qwen_engines = set(engines(s))
        assert chat(s, "llama-hf").status_code == 200
        (llama_engine,) = set(engines(s)) - qwen_engines
        os.kill(llama_engine, signal.SIGKILL)
        assert chat(s, "qwen").status_code == 200
        deadline = time.monotonic() + 60  # its supervisor starts a new engine
        while chat(s, "llama-hf").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert set(engines(s)) & qwen_engines == qwen_engines and len(engines(s)) == 2
    finally:
        assert s.stop() == 0
    assert engines(s) == []


def test_keep_alive_zero_pin_and_empty_prompts(models_dir):
    s = ServerProc("--models-dir", models_dir, "--models-idle-unload", "1", *MOCK)
    try:
        pinned = ollama(s, "chat", model="qwen", messages=HI, keep_alive=-1,
                        options={"num_predict": 2})
        assert pinned.status_code == 200
        assert ollama(s, "generate", model="llama-hf", prompt="hi", keep_alive=0,
                      options={"num_predict": 2}).status_code == 200
        time.sleep(0.5)
        assert states(s)["llama-hf"] == "unloaded"  # keep_alive 0: gone after the request
        loaded = ollama(s, "generate", model="llama-hf")  # empty prompt: load
        assert loaded.json()["done_reason"] == "load" and states(s)["llama-hf"] == "loaded"
        scraped = httpx.get(f"{s.url}/metrics").text  # two models: one family per name
        families = {f.name: f for f in text_string_to_metric_families(scraped)}
        running = families["radixserve:num_requests_running"].samples
        assert sorted(x.labels["model_name"] for x in running) == ["llama-hf", "qwen"]
        time.sleep(3)  # past the 1 s idle unload: llama-hf goes, the pinned qwen stays
        assert states(s) == {"llama-hf": "unloaded", "notes": "unloaded", "qwen": "loaded"}
        gone = ollama(s, "chat", model="qwen", keep_alive=0)  # empty messages: unload
        assert gone.json()["done_reason"] == "unload" and states(s)["qwen"] == "unloaded"
        bad = ollama(s, "chat", model="qwen", messages=HI, keep_alive="soon")
        assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]
    finally:
        assert s.stop() == 0
    assert engines(s) == []


def test_guard_in_front_and_memory_refusal_names_the_numbers(models_dir):
    """The API key, size limit and content type are checked in front, once, in each route's
    shape; past them, a model too big for the memory budget is refused with the numbers."""
    s = ServerProc("--models-dir", models_dir, "--models-memory-gb", "0.1", "--api-key", "k",
                   "--max-request-bytes", "2000", *MOCK)
    try:
        assert chat(s, "qwen").status_code == 401
        assert ollama(s, "chat", model="qwen", messages=HI).json()["error"] == \
            "invalid or missing API key"
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        key = {"Authorization": "Bearer k"}
        rebound = httpx.get(f"{s.url}/v1/models", headers={**key, "Host": "attacker.example"})
        assert rebound.status_code == 403  # DNS rebinding (host_check), before the key
        big = httpx.post(f"{s.url}/v1/chat/completions", headers=key,
                         json={"model": "qwen", "messages": [{"role": "user",
                                                              "content": "x" * 3000}]})
        assert big.status_code == 413
        form = httpx.post(f"{s.url}/v1/chat/completions", content=b"model=qwen",
                          headers={**key, "content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415
        refused = httpx.post(f"{s.url}/v1/chat/completions", headers=key,
                             json={"model": "qwen", "messages": HI})
        assert refused.status_code == 507
        message = refused.json()["error"]["message"]
        assert "needs about 0.30 GiB" in message and "0.10 GiB is available" in message
        assert engines(s) == []
        listed = httpx.get(f"{s.url}/v1/models", headers=key).json()["data"]
        assert {m["id"]: m["status"]["value"] for m in listed}["qwen"] == "unloaded"
    finally:
        assert s.stop() == 0


def test_a_real_model_loads_and_answers(tmp_path, tiny_gguf_files):
    (tmp_path / "qwen.gguf").symlink_to(tiny_gguf_files("qwen2", "F32"))
    (tmp_path / "fake.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)  # the magic alone
    s = ServerProc("--models-dir", str(tmp_path), "--kv-cache-memory-gb", "0.01",
                   "--max-model-len", "256")
    try:
        fake = chat(s, "fake")
        assert fake.status_code == 400 and "cannot be loaded" in fake.json()["error"]["message"]
        assert engines(s) == []
        first = chat(s, "qwen", temperature=0)
        assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == 3
        assert first.json()["choices"][0]["message"]["content"] == \
            chat(s, "qwen", temperature=0).json()["choices"][0]["message"]["content"]
        assert len(engines(s)) == 1
        unloaded = httpx.post(f"{s.url}/models/unload", json={"model": "qwen"}, timeout=60)
        assert unloaded.json()["was_loaded"] and engines(s) == []
    finally:
        assert s.stop() == 0
