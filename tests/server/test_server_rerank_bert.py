"""/v1/rerank and /v1/score served by a real ``serve`` on tiny random BERT and XLM-R
cross-encoder folders (--task auto picks rerank for them): scores equal transformers'
sigmoid(logit) on the tokenizer's pair encoding, the Cohere/Jina shape (sorted, top_n,
return_documents), vLLM's score pairing, long documents cut and huge ones refused, and what
a cross-encoder does not serve refused with a 400."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_cross_encoders import MAX_LEN, WORDS, make_cross_encoder, reference_scores  # noqa: E402

QUERY = "what is the capital of china?"
DOCS = ["the capital of china is beijing.", "the capital of france is paris.",
        "horses and cows are both animals", "beijing is a large city in northern china.",
        " ".join(WORDS * 3)]  # longer than the model reads: cut


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ce_server")
    return {kind: make_cross_encoder(kind, root / kind, seed=1) for kind in ("bert",
                                                                            "xlm-roberta")}


@pytest.fixture(scope="module")
def servers(folders):
    made = {"bert": ServerProc("--model", str(folders["bert"])),  # --task auto
            "xlm-roberta": ServerProc("--model", str(folders["xlm-roberta"]), "--task",
                                      "rerank")}
    yield made
    for s in made.values():
        assert s.stop() == 0


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_rerank_equals_transformers(kind, servers, folders):
    r = _post(servers[kind], "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == kind and body["id"].startswith("rerank-")
    want = reference_scores(folders[kind], [(QUERY, d) for d in DOCS])
    results = body["results"]
    assert [x["index"] for x in results] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    for x in results:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=1e-4)
        assert x["document"] == {"text": DOCS[x["index"]]}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folders[kind])
    lengths = [len(tok(QUERY, d, truncation="longest_first")["input_ids"]) for d in DOCS]
    assert lengths[-1] == MAX_LEN
    assert body["usage"] == {"total_tokens": sum(lengths)}
    top = _post(servers[kind], "/rerank", {"query": QUERY, "documents": [{"text": d}
                                                                          for d in DOCS],
                                           "top_n": 2, "return_documents": False}).json()
    assert [x["index"] for x in top["results"]] == [x["index"] for x in results[:2]]
    assert all(set(x) == {"index", "relevance_score"} for x in top["results"])


def test_score_pairs(servers, folders):
    r = _post(servers["bert"], "/v1/score", {"text_1": QUERY, "text_2": DOCS[:3]})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    want = reference_scores(folders["bert"], [(QUERY, d) for d in DOCS[:3]])
    assert [d["index"] for d in data] == [0, 1, 2]
    assert [d["score"] for d in data] == pytest.approx(want, abs=1e-4)
    queries = ["where do horses live", QUERY, "what is paris"]
    zipped = _post(servers["bert"], "/score", {"text_1": queries, "text_2": DOCS[:3]})
    want = reference_scores(folders["bert"], list(zip(queries, DOCS[:3])))
    assert [d["score"] for d in zipped.json()["data"]] == pytest.approx(want, abs=1e-4)


def _error(r: httpx.Response, param: str | None) -> str:
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    return r.json()["error"]["message"]


def test_errors(servers):
    s = servers["bert"]
    assert "documents is empty" in _error(
        _post(s, "/v1/rerank", {"query": QUERY, "documents": []}), "documents")
    huge = "word " * (MAX_LEN * 64 // 5 + 1)
    r = _post(s, "/v1/rerank", {"query": QUERY, "documents": [DOCS[0], huge]})
    assert "refuses texts over 4096 characters" in _error(r, "documents")
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "text_2" == _post(s, "/v1/score", {"text_1": QUERY, "text_2": [huge]}
                             ).json()["error"]["param"]
    assert "cross-encoder" in _error(
        _post(s, "/v1/rerank", {"query": QUERY, "documents": DOCS, "instruction": "x"}),
        "instruction")
    r = _post(s, "/v1/completions", {"prompt": "the capital", "max_tokens": 2})
    assert r.status_code == 400 and "cross-encoder" in r.text, r.text
    r = _post(s, "/v1/embeddings", {"input": "the capital"})
    assert r.status_code == 400, r.text


def test_embed_task_refused_at_start(folders):
    run = subprocess.run([sys.executable, "-m", "radixserve", "serve", "--model",
                          str(folders["bert"]), "--task", "embed"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "is a cross-encoder" in run.stderr
