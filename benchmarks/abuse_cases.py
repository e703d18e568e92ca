"""The abusive-input catalogue: requests a hostile or careless client sends, each with the
status code the server must answer (and, for errors, an OpenAI error body; for a 200 stream,
a last ``data: [DONE]``). abuse_catalogue.py (beside this file) runs it against a live server
and prints the table (abuse_runner.py sends and judges them); tests/server/test_server_edge.py
runs the fast cases against --mock-engine.

The cases assume a server's defaults: ``--max-n 16``, ``--max-prompts-per-request 128``, a
32 MiB body limit, a vocabulary far below 10**9 tokens, no ``--api-key``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
RENDER = "/v1/chat/completions/render"
USER = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class AbuseCase:
    """One request and the status it must get. ``raw`` is sent as the body verbatim (no
    JSON encoding of ``body``); ``headers`` replace the default JSON content type."""

    name: str
    path: str
    expected: int
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    method: str = "POST"
    is_slow: bool = False  # left out of the CI test
    declared_length: int | None = None  # a Content-Length that lies (sent on a raw socket)

    def content(self) -> bytes | None:
        if self.raw is not None:
            return self.raw
        return None if self.body is None else json.dumps(self.body).encode()

    @property
    def is_stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


def _completion(**fields) -> dict:
    return {"prompt": "hi", "max_tokens": 2, **fields}


def _chat(**fields) -> dict:
    return {"messages": USER, "max_tokens": 2, **fields}


def _raw_completion(fragment: str) -> bytes:
    """A completion body with a JSON fragment no encoder writes (``Infinity``, ``1e400``)."""
    return ('{"prompt": "hi", "max_tokens": 2, ' + fragment + "}").encode()


def _float_cases() -> list[AbuseCase]:
    cases = []
    bad = {"string": '"1"', "Infinity": "Infinity", "-Infinity": "-Infinity", "NaN": "NaN",
           "1e400": "1e400", "bool": "true", "list": "[1]"}
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty"):
        for label, value in bad.items():
            cases.append(AbuseCase(f"{name}={label}", COMPLETIONS, 400,
                                   raw=_raw_completion(f'"{name}": {value}')))
    ranges = {"temperature": -1, "top_p": 0, "min_p": 2, "presence_penalty": 3,
              "frequency_penalty": -3, "repetition_penalty": 0}
    cases += [AbuseCase(f"{k}={v} out of range", COMPLETIONS, 400, _completion(**{k: v}))
              for k, v in ranges.items()]
    cases.append(AbuseCase("chat temperature=Infinity", CHAT, 400,
                           raw=b'{"messages": [{"role": "user", "content": "hi"}], '
                               b'"temperature": Infinity}'))
    cases.append(AbuseCase("logit_bias value Infinity", COMPLETIONS, 400,
                           raw=_raw_completion('"logit_bias": {"5": Infinity}')))
    return cases


def _integer_cases() -> list[AbuseCase]:
    cases = []
    huge, tiny = 2**64, -(2**70)
    for name in ("seed", "priority", "top_k"):
        for label, value in (("2^64", huge), ("-2^70", tiny), ("2^200", 2**200)):
            cases.append(AbuseCase(f"{name}={label}", COMPLETIONS, 400,
                                   _completion(**{name: value})))
        cases.append(AbuseCase(f"{name}=2^64 streamed", COMPLETIONS, 400,
                               _completion(stream=True, **{name: huge})))
        cases.append(AbuseCase(f"chat {name}=2^64 streamed", CHAT, 400,
                               _chat(stream=True, **{name: huge})))
    for name in ("seed", "priority", "top_k", "n", "max_tokens", "min_tokens", "logprobs"):
        cases.append(AbuseCase(f'{name}="1" (string)', COMPLETIONS, 400,
                               _completion(**{name: "1"})))
        cases.append(AbuseCase(f"{name}=1.5", COMPLETIONS, 400, _completion(**{name: 1.5})))
        cases.append(AbuseCase(f"{name}=true", COMPLETIONS, 400, _completion(**{name: True})))
    cases += [
        AbuseCase("seed=2^63-1", COMPLETIONS, 200, _completion(seed=2**63 - 1)),
        AbuseCase("seed=-2^63", COMPLETIONS, 200, _completion(seed=-(2**63))),
        AbuseCase("seed=2^63-1, n=3 (derived seeds)", COMPLETIONS, 200,
                  _completion(seed=2**63 - 1, n=3)),
        AbuseCase("priority=-2^63", COMPLETIONS, 200, _completion(priority=-(2**63))),
        AbuseCase("top_k=2^63-1 streamed", COMPLETIONS, 200,
                  _completion(top_k=2**63 - 1, stream=True)),
        AbuseCase("top_k=-2", COMPLETIONS, 400, _completion(top_k=-2)),
        AbuseCase("n=0", COMPLETIONS, 400, _completion(n=0)),
        AbuseCase("n=17 (over --max-n)", COMPLETIONS, 400, _completion(n=17)),
        AbuseCase("n=2^64", CHAT, 400, _chat(n=2**64)),
        AbuseCase("max_tokens=2^70", COMPLETIONS, 400, _completion(max_tokens=2**70)),
        AbuseCase("max_tokens=-1", COMPLETIONS, 400, _completion(max_tokens=-1)),
        AbuseCase("max_tokens=0 (chat)", CHAT, 400, _chat(max_tokens=0)),
        AbuseCase("min_tokens > max_tokens", COMPLETIONS, 400, _completion(min_tokens=5)),
        AbuseCase("logprobs=21", COMPLETIONS, 400, _completion(logprobs=21)),
        AbuseCase("stop_token_ids [2^70]", COMPLETIONS, 400, _completion(stop_token_ids=[2**70])),
        AbuseCase("stop_token_ids [-1]", COMPLETIONS, 400, _completion(stop_token_ids=[-1])),
        AbuseCase("logit_bias key 'abc'", COMPLETIONS, 400, _completion(logit_bias={"abc": 1})),
        AbuseCase("logit_bias key 10^30", COMPLETIONS, 400,
                  _completion(logit_bias={str(10**30): 1})),
        AbuseCase("logit_bias value 1000", COMPLETIONS, 400, _completion(logit_bias={"5": 1000})),
    ]
    return cases


def _media_type_cases() -> list[AbuseCase]:
    cases = []
    refused = {"text/plain": {"content-type": "text/plain"}, "no content type": {},
               "form": {"content-type": "application/x-www-form-urlencoded"},
               "multipart": {"content-type": "multipart/form-data; boundary=x"},
               "latin-1 JSON": {"content-type": "application/json; charset=latin-1"},
               "json-ish": {"content-type": "application/jsonp"}}
    bodies = {COMPLETIONS: _completion(), CHAT: _chat(), RENDER: _chat(),
              "/tokenize": {"prompt": "hi"}, "/detokenize": {"tokens": [1, 2]}}
    for path, body in bodies.items():
        for label, headers in refused.items():
            if path in (COMPLETIONS, "/tokenize") or label in ("text/plain", "no content type"):
                cases.append(AbuseCase(f"{path} {label}", path, 415, body, headers=headers))
    accepted = {"charset=utf-8": "application/json; charset=utf-8",
                "upper case": "APPLICATION/JSON", "quoted charset": 'application/json; '
                                                                   'charset="UTF-8"'}
    cases += [AbuseCase(f"{COMPLETIONS} {label}", COMPLETIONS, 200, _completion(),
                        headers={"content-type": value}) for label, value in accepted.items()]
    return cases


def _body_cases() -> list[AbuseCase]:
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        AbuseCase("empty body", COMPLETIONS, 400, raw=b""),
        AbuseCase("body: null", COMPLETIONS, 400, raw=b"null"),
        AbuseCase("body: []", CHAT, 400, raw=b"[]"),
        AbuseCase("body: 123", COMPLETIONS, 400, raw=b"123"),
        AbuseCase('body: "str"', "/tokenize", 400, raw=b'"str"'),
        AbuseCase("truncated JSON", COMPLETIONS, 400, raw=b'{"prompt": "hi"'),
        AbuseCase("invalid UTF-8", COMPLETIONS, 400, raw=b'{"prompt": "\xff\xfe"}'),
        AbuseCase("lone surrogate escape", COMPLETIONS, 400, raw=b'{"prompt": "a\\ud800b", '
                                                                 b'"max_tokens": 2}'),
        AbuseCase("100k nested arrays as prompt", COMPLETIONS, 400,
                  raw=b'{"prompt": ' + deep + b"}"),
        AbuseCase("100k nested arrays on /tokenize", "/tokenize", 400,
                  raw=b'{"prompt": ' + deep + b"}"),
        AbuseCase("Content-Length of 1 GiB", COMPLETIONS, 413, _completion(),
                  declared_length=2**30),
        AbuseCase("33 MiB body", COMPLETIONS, 413, raw=b"x" * (33 * 2**20), is_slow=True),
        AbuseCase("unknown field", COMPLETIONS, 400, _completion(bogus=1)),
        AbuseCase("unknown model", COMPLETIONS, 404, _completion(model="no-such-model")),
        AbuseCase("unknown model, chat", CHAT, 404, _chat(model="no-such-model")),
        AbuseCase("GET on a POST route", COMPLETIONS, 405, method="GET", headers={}),
        AbuseCase("DELETE on /v1/models", "/v1/models", 405, method="DELETE", headers={}),
        AbuseCase("unknown path", "/v1/nothing", 404, method="GET", headers={}),
        AbuseCase("path traversal", "/v1/../../etc/passwd", 404, method="GET", headers={}),
    ]


def _prompt_cases() -> list[AbuseCase]:
    return [
        AbuseCase("prompt []", COMPLETIONS, 400, _completion(prompt=[])),
        AbuseCase("prompt [[]]", COMPLETIONS, 400, _completion(prompt=[[]])),
        AbuseCase("prompt [-1]", COMPLETIONS, 400, _completion(prompt=[-1])),
        AbuseCase("prompt token 10^9", COMPLETIONS, 400, _completion(prompt=[10**9])),
        AbuseCase("prompt token 2^70", COMPLETIONS, 400, _completion(prompt=[2**70])),
        AbuseCase("prompt mixed types", COMPLETIONS, 400, _completion(prompt=[1, "a"])),
        AbuseCase("prompt [true]", COMPLETIONS, 400, _completion(prompt=[True])),
        AbuseCase("prompt empty string", COMPLETIONS, 400, _completion(prompt="")),
        AbuseCase("10,000 prompts", COMPLETIONS, 400, _completion(prompt=["a"] * 10_000)),
        AbuseCase("129 prompts", COMPLETIONS, 400, _completion(prompt=["a"] * 129)),
        AbuseCase("10,000 token-id prompts", COMPLETIONS, 400,
                  _completion(prompt=[[5]] * 10_000)),
        AbuseCase("128 prompts", COMPLETIONS, 200, _completion(prompt=["a"] * 128, max_tokens=1)),
        AbuseCase("suffix", COMPLETIONS, 400, _completion(suffix="x")),
        AbuseCase("best_of != n", COMPLETIONS, 400, _completion(best_of=3)),
        AbuseCase("echo with logprobs", COMPLETIONS, 400, _completion(echo=True, logprobs=1)),
        AbuseCase("stream_options without stream", COMPLETIONS, 400,
                  _completion(stream_options={"include_usage": True})),
        AbuseCase("stream with usage", COMPLETIONS, 200,
                  _completion(stream=True, stream_options={"include_usage": True})),
        AbuseCase("stop: empty string", COMPLETIONS, 400, _completion(stop=[""])),
        AbuseCase("stop: 10,000 strings", COMPLETIONS, 200,
                  _completion(stop=[f"s{i}" for i in range(10_000)])),
    ]


def _chat_cases() -> list[AbuseCase]:
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    return [
        AbuseCase("messages []", CHAT, 400, _chat(messages=[])),
        AbuseCase("messages missing", CHAT, 400, {"max_tokens": 2}),
        AbuseCase("role robot", CHAT, 400, _chat(messages=[{"role": "robot", "content": "x"}])),
        AbuseCase("user without content", CHAT, 400, _chat(messages=[{"role": "user"}])),
        AbuseCase("image content part", CHAT, 400,
                  _chat(messages=[{"role": "user", "content": image}])),
        AbuseCase("content a number", CHAT, 400,
                  _chat(messages=[{"role": "user", "content": 5}])),
        AbuseCase("tool_calls on a user message", CHAT, 400, _chat(messages=[
            {"role": "user", "content": "x", "tool_calls": []}])),
        AbuseCase("tool_choice required without tools", CHAT, 400,
                  _chat(tool_choice="required")),
        AbuseCase("top_logprobs without logprobs", CHAT, 400, _chat(top_logprobs=2)),
        AbuseCase("top_logprobs=21", CHAT, 400, _chat(logprobs=True, top_logprobs=21)),
        AbuseCase("continue_final_message and add_generation_prompt", CHAT, 400,
                  _chat(continue_final_message=True)),
        AbuseCase("render: both template flags", RENDER, 400, _chat(continue_final_message=True)),
        AbuseCase("response_format type xml", CHAT, 400, _chat(response_format={"type": "xml"})),
        AbuseCase("json_schema without json_schema", CHAT, 400,
                  _chat(response_format={"type": "json_schema"})),
        AbuseCase("response_format and structured_outputs", CHAT, 400,
                  _chat(response_format={"type": "json_object"},
                        structured_outputs={"regex": "a"})),
        AbuseCase("structured regex '('", CHAT, 400, _chat(structured_outputs={"regex": "("})),
        AbuseCase("structured: two kinds", CHAT, 400,
                  _chat(structured_outputs={"regex": "a", "choice": ["a"]})),
        AbuseCase("structured: grammar garbage", CHAT, 400,
                  _chat(structured_outputs={"grammar": "%%% not a grammar"})),
        AbuseCase("chat streamed ok", CHAT, 200, _chat(stream=True)),
        AbuseCase("chat n=3 ok", CHAT, 200, _chat(n=3, seed=1)),
    ]


def _tokenize_cases() -> list[AbuseCase]:
    return [
        AbuseCase("tokenize: empty messages, both template flags", "/tokenize", 400,
                  {"messages": [], "add_generation_prompt": True,
                   "continue_final_message": True}),
        AbuseCase("tokenize: empty messages", "/tokenize", 400, {"messages": []}),
        AbuseCase("tokenize: both template flags", "/tokenize", 400,
                  {"messages": USER, "continue_final_message": True}),
        AbuseCase("tokenize: prompt and messages", "/tokenize", 400,
                  {"prompt": "hi", "messages": USER}),
        AbuseCase("tokenize: neither", "/tokenize", 400, {}),
        AbuseCase("tokenize: prompt a number", "/tokenize", 400, {"prompt": 5}),
        AbuseCase("tokenize: continue the final message", "/tokenize", 200,
                  {"messages": USER, "continue_final_message": True,
                   "add_generation_prompt": False}),
        AbuseCase("detokenize [-1]", "/detokenize", 400, {"tokens": [-1]}),
        AbuseCase("detokenize [2^70]", "/detokenize", 400, {"tokens": [2**70]}),
        AbuseCase('detokenize ["a"]', "/detokenize", 400, {"tokens": ["a"]}),
        AbuseCase("detokenize [1.0]", "/detokenize", 400, {"tokens": [1.0]}),
        AbuseCase("detokenize ok", "/detokenize", 200, {"tokens": [1, 2, 3]}),
    ]


def catalogue() -> list[AbuseCase]:
    """Every case, in a stable order."""
    return (_float_cases() + _integer_cases() + _media_type_cases() + _body_cases()
            + _prompt_cases() + _chat_cases() + _tokenize_cases())
