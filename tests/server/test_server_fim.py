"""Fill in the middle through a real ``radixserve serve`` on a tiny random model whose vocabulary
has Qwen2.5-Coder's FIM tokens (tiny_fim): llama.cpp's ``POST /infill`` (whole, streamed, the
warm-up call, response_fields), ``suffix`` on /v1/completions and on Ollama's /api/generate,
each with the exact prompt ids the engine got; the 400s, in each route's shape, on a model
without FIM tokens; and ``GET /tokenizer_info`` read by lm-eval's own remote tokenizer."""

from __future__ import annotations

import json

import httpx
import pytest
from server_proc import ServerProc
from tiny_fim import FILE_SEP, MIDDLE, PREFIX, REPO, SUFFIX, make_fim_gguf, make_fim_hf_model
from tiny_models import make_hf_model

from radixserve.tokenizer.tokenizer import Tokenizer

CODE_BEFORE, CODE_AFTER = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim(tmp_path_factory):
    root = tmp_path_factory.mktemp("fim")
    path = make_fim_gguf(make_fim_hf_model(root / "hf"), root / "gguf" / "fim.gguf")
    server = ServerProc("--model", str(path), "--num-kv-blocks", "64", timeout=180)
    yield server, Tokenizer.from_gguf(path)
    assert server.stop() == 0


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = make_hf_model("qwen2", tmp_path_factory.mktemp("plain") / "m", seed=1)
    server = ServerProc("--model", str(path), "--num-kv-blocks", "64", timeout=180)
    yield server
    assert server.stop() == 0


def _plain_ids(tok: Tokenizer) -> list[int]:
    text = tok.encode_text
    return [PREFIX, *text(CODE_BEFORE), SUFFIX, *text(CODE_AFTER), MIDDLE]


def _events(body: str) -> list[dict]:
    assert "[DONE]" not in body  # llama.cpp ends /infill's stream with its last object
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def test_infill_whole_and_streamed(fim):
    server, tok = fim
    text = tok.encode_text
    request = {"input_prefix": CODE_BEFORE, "input_suffix": CODE_AFTER, "prompt": "a",
               "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
               "n_predict": 8, "temperature": 0, "samplers": ["top_k", "top_p", "infill"],
               "cache_prompt": True, "t_max_prompt_ms": 500, "return_tokens": True}
    expected = [REPO, *text("myproject\n"), FILE_SEP, *text("util.py\n"), *text("X = 1\n"),
                FILE_SEP, *text("filename\n"), PREFIX, *text(CODE_BEFORE),
                *tok.encode("a", add_special_tokens=False), SUFFIX, *text(CODE_AFTER), MIDDLE]
    whole = httpx.post(f"{server.url}/infill", json=request, timeout=60)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["stop"] is True and answer["tokens_evaluated"] == len(expected)
    assert answer["prompt"] == tok.decode(expected, skip_special_tokens=False)
    assert 1 <= answer["tokens_predicted"] <= 8 == answer["generation_settings"]["n_predict"]
    assert answer["tokens"] and len(answer["tokens"]) == answer["tokens_predicted"]
    assert answer["stop_type"] in ("eos", "limit")
    assert answer["timings"]["predicted_n"] == answer["tokens_predicted"]
    streamed = httpx.post(f"{server.url}/infill", json={**request, "stream": True}, timeout=60)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = _events(streamed.text)
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == answer["content"]  # greedy: the same
    assert events[-1]["tokens_predicted"] == answer["tokens_predicted"]


def test_infill_warm_up_and_response_fields(fim):
    server, _ = fim
    url = f"{server.url}/infill"
    warm = httpx.post(url, json={"input_prefix": CODE_BEFORE, "n_predict": 0}, timeout=60)
    assert warm.status_code == 200, warm.text
    assert warm.json()["content"] == "" and warm.json()["tokens_predicted"] == 0
    fields = ["content", "timings/prompt_n", "timings/predicted_n", "truncated"]
    cut = httpx.post(url, json={"input_prefix": CODE_BEFORE, "n_predict": 2,
                                "response_fields": fields}, timeout=60).json()
    assert sorted(cut) == sorted(fields)


def test_infill_refusals_in_llama_cpp_shape(fim):
    server, _ = fim
    url = f"{server.url}/infill"
    for body, needle in (({"input_prefix": "x", "mirostat": 2}, "mirostat"),
                         ({"input_prefix": "x", "n_probs": 3}, "n_probs"),
                         ({"input_prefix": "x", "samplers": ["nope"]}, "unknown samplers"),
                         ({"input_prefix": "x", "n_predict": 10_000}, "context")):
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == 400 and error["type"] and needle in error["message"]


def test_completions_suffix(fim):
    server, tok = fim
    expected = _plain_ids(tok)
    request = {"prompt": CODE_BEFORE, "suffix": CODE_AFTER, "max_tokens": 6, "temperature": 0}
    (render,) = httpx.post(f"{server.url}/v1/completions/render", json=request,
                           timeout=30).json()
    assert render["token_ids"] == expected
    whole = httpx.post(f"{server.url}/v1/completions", json={**request, "n": 2}, timeout=60)
    assert whole.status_code == 200, whole.text
    assert whole.json()["usage"]["prompt_tokens"] == len(expected)
    assert len(whole.json()["choices"]) == 2
    streamed = httpx.post(f"{server.url}/v1/completions", json={**request, "stream": True},
                          timeout=60)
    assert streamed.text.rstrip().endswith("data: [DONE]")
    text = "".join(json.loads(line[6:])["choices"][0]["text"]
                   for line in streamed.text.splitlines()
                   if line.startswith("data: {"))
    assert text == whole.json()["choices"][0]["text"]
    for extra, needle in (({"echo": True}, "echo"), ({"prompt": [1, 2]}, "token ids")):
        r = httpx.post(f"{server.url}/v1/completions", json={**request, **extra}, timeout=30)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_ollama_generate_suffix(fim):
    server, tok = fim
    expected = _plain_ids(tok)
    model = httpx.get(f"{server.url}/api/tags").json()["models"][0]["name"]
    request = {"model": model, "prompt": CODE_BEFORE, "suffix": CODE_AFTER, "stream": False,
               "options": {"temperature": 0, "num_predict": 6}}
    done = httpx.post(f"{server.url}/api/generate", json=request, timeout=60).json()
    assert done["done"] and done["prompt_eval_count"] == len(expected)
    assert done["context"][:len(expected)] == expected
    lines = httpx.post(f"{server.url}/api/generate", json={**request, "stream": True},
                       timeout=60).text.splitlines()
    assert "".join(json.loads(x)["response"] for x in lines) == done["response"]
    shown = httpx.post(f"{server.url}/api/show", json={"model": model}).json()
    assert "insert" in shown["capabilities"]
    r = httpx.post(f"{server.url}/api/generate", json={**request, "system": "be brief"})
    assert r.status_code == 400 and "system" in r.json()["error"], r.text


def test_model_without_fim_tokens_gets_400s(plain):
    url = plain.url
    r = httpx.post(f"{url}/infill", json={"input_prefix": "x", "input_suffix": "y"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("Infill is not supported by this model: ")
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix", r.text
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    model = httpx.get(f"{url}/api/tags").json()["models"][0]["name"]
    r = httpx.post(f"{url}/api/generate", json={"model": model, "prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and "does not support insert" in r.json()["error"], r.text
    shown = httpx.post(f"{url}/api/show", json={"model": model}).json()
    assert "insert" not in shown["capabilities"]


def test_tokenizer_info_for_lm_eval(fim):
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    server, tok = fim
    base = f"{server.url}/v1/completions"
    assert check_remote_tokenizer_support(base)
    remote = RemoteTokenizer(base)
    assert (remote.eos_token, remote.bos_token) == ("<|im_end|>", None)
    assert remote.eos_token_id == tok.eos_token_id
    assert remote.encode("hello world") == tok.encode("hello world", add_special_tokens=False)
    assert remote.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    info = httpx.get(f"{server.url}/tokenizer_info").json()
    assert info["added_tokens_decoder"][str(PREFIX)]["content"] == "<|fim_prefix|>"
    assert info["add_bos_token"] is False and info["model_max_length"] > 0


def test_schemathesis_infill_finds_no_server_error(fim):
    """/infill with bodies that fit its schema and bodies that do not: never a 5xx, every
    error in llama.cpp's shape."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings

    server, _ = fim
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operation = schema["/infill"]["POST"]
    found: list[str] = []
    for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
        @settings(max_examples=40, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(case=operation.as_strategy(mode))
        def call(case):
            if isinstance(case.body, dict):
                case.body.setdefault("n_predict", 4)  # else it runs to the context's end
            r = case.call(base_url=server.url, timeout=60)
            error = r.json().get("error") if r.status_code >= 400 else None
            if r.status_code >= 500 or (error is not None and set(error) != {
                    "code", "message", "type"}):
                found.append(f"{mode.value}: {r.status_code} {r.text[:200]} for "
                             f"{case.body!r:.200}")

        call()
    assert not found, "\n".join(found[:10])
