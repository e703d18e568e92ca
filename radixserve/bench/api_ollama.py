"""``bench serve --api ollama``: the same workload through Ollama's /api/chat and
/api/generate (raw), as plain dict translations of the OpenAI requests and answers."""

from __future__ import annotations

import json


def path(chat: bool) -> str:
    return "/api/chat" if chat else "/api/generate"


def payload(body: dict) -> dict:
    """The OpenAI chat / completion request ``body`` as the Ollama request."""
    options = {"num_predict": body["max_tokens"]}
    for key in ("temperature", "ignore_eos"):  # ignore_eos: radixserve's option extension
        if key in body:
            options[key] = body[key]
    out = {"model": body.get("model") or "", "stream": True, "options": options}
    if "messages" in body:
        out["messages"] = body["messages"]
    else:
        out.update(prompt=body["prompt"], raw=True)
    return out


def event(raw: bytes) -> dict | None:
    """One NDJSON line as the OpenAI stream event it stands for (None for a blank line)."""
    line = raw.strip()
    if not line:
        return None
    part = json.loads(line)
    if part.get("error"):
        return {"error": {"message": part["error"]}}
    text = (part.get("message") or {}).get("content") or part.get("response") or ""
    thinking = (part.get("message") or {}).get("thinking") or part.get("thinking") or ""
    choice = {"delta": {"content": text, "reasoning_content": thinking},
              "finish_reason": part.get("done_reason") if part.get("done") else None}
    out: dict = {"choices": [choice]}
    if part.get("done"):
        out["usage"] = {"prompt_tokens": part.get("prompt_eval_count") or 0,
                        "completion_tokens": part.get("eval_count") or 0}
    return out
