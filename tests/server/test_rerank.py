"""/v1/rerank, /rerank and /v1/score against a real ``serve --task rerank`` on the embedded
model: the response shapes, ordering, top_n, return_documents, vLLM's score pairing, the
errors in OpenAI's shape; each score equals P(yes) computed from the offline engine's prompt
logprobs of the reranker prompt followed by "yes" and by "no"."""

from __future__ import annotations

import math

import httpx
import pytest
from server_proc import ServerProc

from radixserve.frontend.rerank import Reranker, pair_text
from radixserve.sampling_params import SamplingParams

QUERY = "What is the capital of China?"
DOCS = ["The capital of China is Beijing.", "The capital of France is Paris.",
        "Horses and cows are both animals.", "Beijing is a large city in northern China."]
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--task", "rerank", "--max-model-len", str(MAX_MODEL_LEN))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def plain_server():
    """No --task rerank (the mock engine: the refusal comes before any engine work)."""
    s = ServerProc("--mock-engine")
    yield s
    assert s.stop() == 0


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _expected(llm, query: str, doc: str) -> float:
    """P(yes) from the log-probabilities of "yes" and of "no" after the reranker prompt."""
    reranker = Reranker.for_tokenizer(llm.get_tokenizer())
    body = llm.get_tokenizer().encode(pair_text(query, doc), add_special_tokens=False)
    ids = reranker.prompt_ids(body)
    score = SamplingParams(max_tokens=0, prompt_logprobs=0)
    lp = {}
    for token in (reranker.yes_id, reranker.no_id):
        out = llm.generate({"prompt_token_ids": ids + [token]}, score)[0]
        lp[token] = out.prompt_logprobs[-1][token].logprob
    return math.exp(lp[reranker.yes_id]) / (math.exp(lp[reranker.yes_id])
                                             + math.exp(lp[reranker.no_id]))


def test_rerank_scores_equal_the_offline_yes_no_probability(server, embedded_llm):
    r = _post(server, "/v1/rerank", {"model": "SmolLM2-135M-Instruct.Q4_1", "query": QUERY,
                                     "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "results", "usage"} and body["id"].startswith("rerank-")
    assert body["model"] == "SmolLM2-135M-Instruct.Q4_1"
    results = body["results"]
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    for x in results:
        assert set(x) == {"index", "relevance_score", "document"}
        assert x["document"] == {"text": DOCS[x["index"]]}
        assert 0 < x["relevance_score"] < 1
        assert x["relevance_score"] == pytest.approx(
            _expected(embedded_llm, QUERY, DOCS[x["index"]]), abs=2e-3)
    tok = embedded_llm.get_tokenizer()
    reranker = Reranker.for_tokenizer(tok)
    assert body["usage"] == {"total_tokens": sum(
        len(tok.encode(pair_text(QUERY, d), add_special_tokens=False))
        + reranker.num_template_tokens for d in DOCS)}


def test_top_n_return_documents_and_document_objects(server):
    full = _post(server, "/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    docs = [{"text": d} for d in DOCS]
    top = _post(server, "/v1/rerank", {"query": QUERY, "documents": docs, "top_n": 2,
                                       "return_documents": False}).json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in full[:2]]
    assert all(set(x) == {"index", "relevance_score"} for x in top)
    for top_n in (0, None, 10):
        got = _post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": top_n})
        assert [x["index"] for x in got.json()["results"]] == [x["index"] for x in full]


def test_score_pairs_list_by_list_and_one_by_list(server, embedded_llm):
    one = _post(server, "/v1/score", {"model": "SmolLM2-135M-Instruct.Q4_1", "text_1": QUERY,
                                      "text_2": DOCS[:3]})
    assert one.status_code == 200, one.text
    body = one.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["object"] == "list" and body["id"].startswith("score-")
    assert isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "score" for d in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert body["usage"]["completion_tokens"] == 0
    for d, doc in zip(body["data"], DOCS):
        assert d["score"] == pytest.approx(_expected(embedded_llm, QUERY, doc), abs=2e-3)
    # N:N pairs text_1[i] with text_2[i]; a one-item text_1 list pairs like a string
    queries = ["Where do horses live?", QUERY, "What is Paris?"]
    zipped = _post(server, "/v1/score", {"text_1": queries, "text_2": DOCS[:3]}).json()["data"]
    for d, q, doc in zip(zipped, queries, DOCS):
        assert d["score"] == pytest.approx(_expected(embedded_llm, q, doc), abs=2e-3)
    listed = _post(server, "/score", {"text_1": [QUERY], "text_2": DOCS[:3]}).json()["data"]
    assert [d["score"] for d in listed] == pytest.approx([d["score"] for d in body["data"]],
                                                         abs=1e-6)


def _error(r: httpx.Response, param: str | None, status: int = 400) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    return error["message"]


def test_errors(server):
    assert "documents" in _error(_post(server, "/v1/rerank", {"query": QUERY, "documents": []}),
                                 "documents")
    assert "top_n" in _error(_post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS,
                                                          "top_n": -1}), "top_n")
    long_doc = " ".join(["word"] * MAX_MODEL_LEN)
    r = _post(server, "/v1/rerank", {"query": QUERY, "documents": [DOCS[0], long_doc]})
    assert "maximum context length is 256" in _error(r, "documents")
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = _post(server, "/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS[:3]})
    assert "1:1, 1:N or N:N" in _error(r, "text_2")
    _error(_post(server, "/v1/score", {"text_1": [], "text_2": DOCS}), "text_1")
    _error(_post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_k": 1}),
           "top_k")
    _error(_post(server, "/v1/rerank", {"model": "other", "query": QUERY, "documents": DOCS}),
           "model", 404)


def test_refused_when_not_served_as_a_reranker(plain_server):
    for path, body in (("/v1/rerank", {"query": QUERY, "documents": DOCS}),
                       ("/rerank", {"query": QUERY, "documents": DOCS}),
                       ("/v1/score", {"text_1": QUERY, "text_2": DOCS})):
        r = _post(plain_server, path, body)
        assert "--task rerank" in _error(r, "model")
        assert r.json()["error"]["code"] == "rerank_not_supported"
