"""A vision model served (`radixserve serve` on a tiny Gemma 3 text GGUF with llama.cpp's mmproj
beside it, found automatically): the same image on OpenAI chat, Responses, Anthropic Messages
and Ollama gives the same greedy answer (tests/engine/test_gemma3_images.py holds it to
transformers'); a second turn about it reads the image's KV from the prefix cache (usage.prompt_tokens_details.cached_tokens) and the encoder
ran once; /v1/models and /api/show say "vision"; a damaged image is a 400 and the server keeps
serving."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from server_proc import ServerProc
from tiny_gemma3_mmproj import gemma3_mmproj_gguf
from tiny_gemma3_vlm import gemma3_vlm_text_gguf, make_gemma3_vlm_hf

from radixserve.kernels import native

QUESTION = "Describe the picture."
MAX_TOKENS = 6


def png_b64(seed: int) -> str:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if native.load() is None:
        pytest.skip("Gemma 3's image rows need the native attention")
    root = tmp_path_factory.mktemp("vlm")
    folder = make_gemma3_vlm_hf(root / "hf", seed=3)
    model = gemma3_vlm_text_gguf(folder, root / "gemma3-tiny-Q8_0.gguf", "Q8_0")
    gemma3_mmproj_gguf(folder, root / "mmproj-gemma3-tiny-f16.gguf", "f16")
    proc = ServerProc("--model", str(model), "--block-size", "4", "--speculative", "off",
                      "--no-kv-disk-cache")
    yield proc
    proc.stop()


def chat(server: ServerProc, b64: str) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
            {"type": "text", "text": QUESTION}]}],
        "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def metric(server: ServerProc, line_start: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(line_start))


def test_every_api_answers_the_same_about_an_image(server):
    name = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
    b64 = png_b64(1)
    first = chat(server, b64)
    answer = first["choices"][0]["message"]["content"]
    assert first["usage"]["prompt_tokens"] > 16 and answer
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["usage"]["prompt_tokens_details"]["image_tokens"] == 16
    again = chat(server, b64)
    assert again["choices"][0]["message"]["content"] == answer
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 16  # past the image

    r = httpx.post(f"{server.url}/v1/responses", timeout=120, json={
        "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": f"data:image/png;base64,{b64}"},
            {"type": "input_text", "text": QUESTION}]}],
        "max_output_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["output"][-1]["content"][0]["text"] == answer

    r = httpx.post(f"{server.url}/v1/messages", timeout=120, json={
        "model": name, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64}},
            {"type": "text", "text": QUESTION}]}]})
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == answer

    r = httpx.post(f"{server.url}/api/chat", timeout=120, json={
        "model": name, "stream": False,
        "options": {"temperature": 0, "num_predict": MAX_TOKENS, "ignore_eos": True},
        "messages": [{"role": "user", "content": QUESTION, "images": [b64]}]})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == answer

    # one picture: encoded once, whatever the route (the later turns hit the prefix cache)
    assert metric(server, f'radixserve:images_total{{model_name="{name}",op="encoded"}}') == 1


def test_capabilities_and_a_damaged_image(server):
    models = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    assert "vision" in models[0]["capabilities"]
    show = httpx.post(f"{server.url}/api/show", timeout=10, json={"model": models[0]["id"]})
    assert "vision" in show.json()["capabilities"]
    b64 = png_b64(2)
    cut = base64.b64encode(base64.b64decode(b64)[:60]).decode()
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{cut}"}},
            {"type": "text", "text": QUESTION}]}], "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert chat(server, b64)["choices"][0]["message"]["content"]  # still serving
