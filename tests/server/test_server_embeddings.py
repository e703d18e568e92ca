"""/v1/embeddings and Ollama's /api/embed against real server processes on a tiny random
Qwen3 model: vectors equal transformers' (same pooling, L2-normalised), batch = alone,
token-id inputs, base64, dimensions; the --task embed rule; errors in each route's shape."""

from __future__ import annotations

import base64
import json
import shutil

import httpx
import numpy as np
import ollama
import openai
import pytest
import torch
from server_proc import ServerProc

TEXTS = ["the cat sat on the mat", "a quick brown fox", "hello world, hello again"]


def _normalise(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def reference(tiny_hf_dirs):
    """text -> (token ids, {"last": vector, "mean": vector}) from transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_hf_dirs["qwen3"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = {}
    with torch.no_grad():
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            h = model.model(torch.tensor([ids])).last_hidden_state[0]
            out[text] = ids, {"last": _normalise(h[-1]), "mean": _normalise(h.mean(0))}
    return out


@pytest.fixture(scope="module")
def embed_server(tiny_hf_dirs):
    s = ServerProc("--model", str(tiny_hf_dirs["qwen3"]), "--task", "embed")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(embed_server):
    return openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="unused", max_retries=0)


def test_openai_embeddings_match_transformers_batched_and_alone(client, reference):
    batched = client.embeddings.create(model="qwen3", input=TEXTS)
    assert [d.index for d in batched.data] == [0, 1, 2]
    assert batched.usage.prompt_tokens == sum(len(reference[t][0]) for t in TEXTS)
    for text, item in zip(TEXTS, batched.data):
        alone = client.embeddings.create(model="qwen3", input=text).data[0].embedding
        np.testing.assert_allclose(item.embedding, reference[text][1]["last"], atol=3e-4)
        np.testing.assert_allclose(alone, item.embedding, atol=1e-6)


def test_token_ids_base64_and_dimensions(client, reference):
    ids = [reference[t][0] for t in TEXTS]
    by_ids = client.embeddings.create(model="qwen3", input=ids)
    one = client.embeddings.create(model="qwen3", input=ids[0]).data[0].embedding
    np.testing.assert_allclose(one, by_ids.data[0].embedding, atol=1e-6)
    raw = httpx.post(f"{client.base_url}embeddings",
                     json={"input": TEXTS[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, by_ids.data[0].embedding, atol=1e-6)
    cut = client.embeddings.create(model="qwen3", input=TEXTS[0], dimensions=16)
    vec = np.asarray(cut.data[0].embedding)
    assert vec.shape == (16,) and abs(np.linalg.norm(vec) - 1) < 1e-5
    np.testing.assert_allclose(vec, _normalise(by_ids.data[0].embedding[:16]), atol=1e-6)


def test_ollama_embed(embed_server, reference):
    oc = ollama.Client(host=embed_server.url)
    got = oc.embed(model="qwen3", input=TEXTS)
    assert got.prompt_eval_count == sum(len(reference[t][0]) for t in TEXTS)
    for text, vec in zip(TEXTS, got.embeddings):
        np.testing.assert_allclose(vec, reference[text][1]["last"], atol=3e-4)
    legacy = oc.embeddings(model="qwen3", prompt=TEXTS[0])
    np.testing.assert_allclose(legacy.embedding, got.embeddings[0], atol=1e-6)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"), ({"input": [[1, 2], []]}, "input"),
    ({"input": [999999]}, "input"), ({"input": "x", "dimensions": 100000}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "model": "other"}, "model"),
])
def test_bad_embedding_input_is_a_4xx_and_the_server_keeps_serving(embed_server, body, param):
    r = httpx.post(f"{embed_server.url}/v1/embeddings", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param, r.text
    o = httpx.post(f"{embed_server.url}/api/embed", json={"model": "nope", "input": "x"})
    assert o.status_code == 404 and set(o.json()) == {"error"}
    assert httpx.post(f"{embed_server.url}/v1/embeddings", json={"input": "ok"}).status_code \
        == 200


def test_a_generating_model_refuses_embeddings_without_task_embed(tiny_hf_dirs, tmp_path):
    """Without --task embed a plain causal LM answers 400 saying why; a sentence-transformers
    folder naming mean pooling is an embedding model, and embeds with mean pooling."""
    s = ServerProc("--model", str(tiny_hf_dirs["qwen3"]))
    try:
        r = httpx.post(f"{s.url}/v1/embeddings", json={"input": "hello"})
        assert r.status_code == 400 and "--task embed" in r.json()["error"]["message"]
        o = httpx.post(f"{s.url}/api/embed", json={"model": "qwen3", "input": "hello"})
        assert o.status_code == 400 and "--task embed" in o.json()["error"]
        chat = httpx.post(f"{s.url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert chat.status_code == 200  # generation still served
    finally:
        assert s.stop() == 0
    folder = tmp_path / "st-qwen3"
    shutil.copytree(tiny_hf_dirs["qwen3"], folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}))
    s = ServerProc("--model", str(folder))
    try:
        r = httpx.post(f"{s.url}/v1/embeddings", json={"input": TEXTS[0]})
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        h = model.model(torch.tensor([tok(TEXTS[0])["input_ids"]])).last_hidden_state[0]
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], _normalise(h.mean(0)),
                               atol=3e-4)
