"""``POST /infill`` served: the repository-level FIM prompt (`fim_prompt.fim_prompt_ids`), one
engine request, and llama.cpp's ``/completion`` answer: one JSON object, or server-sent events
(``data: {...}`` per piece of text, the last with ``stop: true`` and the counts; no
``[DONE]``, as llama.cpp ends a non-OpenAI stream).

The editor-facing stops are llama.cpp's, applied to the text as it comes and ending the engine
request when they fire (``stop_type`` "limit"):

* ``n_indent``: on each line after the first, once its first character other than a space or
  tab arrives, a line indented less than ``n_indent`` ends the answer just before that
  character (a blank line counts as indent 0);
* ``t_max_predict_ms``: a piece holding a new line, written later than that after the first
  token, is the last.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from radixserve.core.reports import PromptProgress
from radixserve.frontend.async_llm import QueueTicket
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.llamacpp.protocol import InfillRequest
from radixserve.frontend.openai.protocol import random_id
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.prompt_progress import progress_fields
from radixserve.tokenizer.fim_prompt import InfillBudget, fim_prompt_ids

_ENCODE = msgspec.json.encode
_APPLIED_SAMPLERS = ["penalties", "top_k", "top_p", "min_p", "temperature"]  # the engine's


def infill_prompt(ctx: ServingContext, body: InfillRequest) -> list[int]:
    """The prompt's token ids; 400 where the model has no FIM tokens (llama.cpp's message)."""
    tokenizer = ctx.tokenizer
    try:
        tokenizer.require_fim()
    except ValueError as exc:
        raise OpenAIError(f"Infill is not supported by this model: {exc}") from None
    # NOTE: llama.cpp reads `prompt` with special tokens parsed, the code without
    prompt_ids = tokenizer.encode(body.prompt, add_special_tokens=False) if body.prompt else []
    return fim_prompt_ids(tokenizer, body.input_prefix, body.input_suffix,
                          prompt_ids=prompt_ids,
                          extra=[(c.filename, c.text) for c in body.input_extra],
                          budget=InfillBudget(ctx.max_model_len, body.n_predict))


def indent_cut(text: str, n_indent: int, start: int) -> tuple[int | None, int]:
    """(where ``text`` ends by the ``n_indent`` rule, or None; where to look from next time).
    ``start``: the first new line not judged yet."""
    newline = text.find("\n", start)
    while newline != -1:
        first = newline + 1
        end = first
        while end < len(text) and text[end] in " \t":
            end += 1
        if end == len(text):
            return None, newline  # the line's indent is not known yet
        if end - first < n_indent:
            return end, newline
        newline = text.find("\n", first)
    return None, len(text)


@dataclass
class Infill:
    """One /infill answer as it is written: the text, the tokens, why it stopped, times."""

    body: InfillRequest
    prompt_ids: list[int]
    arrival: float
    content: str = ""
    token_ids: list[int] = field(default_factory=list)
    stop_type: str = "none"
    stopping_word: str = ""
    num_cached: int = 0
    first_time: float | None = None
    end_time: float | None = None
    _scan_from: int = 0

    def add(self, text: str, new_ids: list[int]) -> tuple[str, bool]:
        """Take one step's text and ids; (the text to send, whether the answer ends here by
        the editor stops)."""
        now = time.time()
        self.first_time = self.first_time or now
        self.token_ids += new_ids
        start = len(self.content)
        self.content += text
        body = self.body
        if body.n_indent > 0:
            cut, self._scan_from = indent_cut(self.content, body.n_indent, self._scan_from)
            if cut is not None:
                self.content = self.content[:cut]
                self.stop_type = "limit"
                return self.content[start:], True
        if (body.t_max_predict_ms > 0 and "\n" in text
                and now - self.first_time > body.t_max_predict_ms / 1000):
            self.stop_type = "limit"
            return text, True
        return text, False

    def finish(self, state) -> None:
        """The engine's end of the request (unless an editor stop ended it first)."""
        self.end_time = time.time()
        self.num_cached = state.num_cached_tokens
        if self.stop_type != "none" or state.finish_reason is None:
            return
        if state.finish_reason == "length":
            self.stop_type = "limit"
        elif state.finish_reason == "stop":
            is_word = isinstance(state.stop_reason, str)
            self.stop_type = "word" if is_word else "eos"
            self.stopping_word = state.stop_reason if is_word else ""

    def timings(self) -> dict:
        end = self.end_time or time.time()
        first = self.first_time or end
        prompt_n = len(self.prompt_ids) - self.num_cached
        prompt_ms, predicted_ms = (first - self.arrival) * 1e3, (end - first) * 1e3
        predicted_n = len(self.token_ids)
        return {"cache_n": self.num_cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
                "prompt_per_second": prompt_n / prompt_ms * 1e3 if prompt_ms else 0.0,
                "predicted_n": predicted_n, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(predicted_n, 1),
                "predicted_per_second": (predicted_n / predicted_ms * 1e3
                                         if predicted_ms else 0.0)}

    def partial(self, text: str, new_ids: list[int]) -> dict:
        return {"index": 0, "content": text,
                "tokens": new_ids if self.body.return_tokens else [], "stop": False,
                "id_slot": -1, "tokens_predicted": len(self.token_ids),
                "tokens_evaluated": len(self.prompt_ids)}

    def progress(self, progress: PromptProgress) -> dict:
        """llama-server's progress object: an empty partial with ``prompt_progress``."""
        return self.partial("", []) | {"prompt_progress": progress_fields(progress)}

    def final(self, ctx: ServingContext, streamed: bool) -> dict:
        """The last object: the whole text (empty when ``streamed``: the pieces carried it),
        counts, settings and timings, cut to ``response_fields`` when the request names
        them."""
        body = self.body
        answer = {
            "index": 0, "content": "" if streamed else self.content,
            "tokens": self.token_ids if body.return_tokens and not streamed else [],
            "id_slot": -1, "stop": True, "model": ctx.model_name,
            "tokens_predicted": len(self.token_ids),
            "tokens_evaluated": len(self.prompt_ids),
            "generation_settings": {
                "n_predict": body.n_predict, "temperature": body.temperature,
                "top_k": body.top_k, "top_p": body.top_p, "min_p": body.min_p,
                "seed": body.seed, "stop": body.stop, "n_indent": body.n_indent,
                "t_max_predict_ms": body.t_max_predict_ms, "samplers": _APPLIED_SAMPLERS},
            "prompt": ctx.tokenizer.decode(self.prompt_ids, skip_special_tokens=False),
            "has_new_line": "\n" in self.content, "truncated": False,
            "stop_type": self.stop_type, "stopping_word": self.stopping_word,
            "tokens_cached": len(self.prompt_ids) + len(self.token_ids),
            "timings": self.timings()}
        if body.response_fields:
            return nested_values(answer, body.response_fields)
        return answer


def nested_values(answer: dict, paths: list[str]) -> dict:
    """llama.cpp's ``response_fields``: each ``a/b`` path present in ``answer``, keyed by
    the path itself."""
    out = {}
    for path in paths:
        value = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


async def run_infill(ctx: ServingContext, infill: Infill, params, ticket: QueueTicket,
                     streamed: bool) -> AsyncIterator[bytes]:
    """The answer's SSE events (``streamed``) or its one JSON body, as the engine writes it;
    an editor stop closes the engine's stream, which aborts the request."""
    steps = ctx.engine.generate(infill.prompt_ids, params, random_id("infill-"), 0,
                                infill.arrival, ticket)
    async with contextlib.aclosing(steps) as deltas:
        async for step in deltas:
            if step.progress is not None:  # only asked for when streamed
                yield b"data: " + _ENCODE(infill.progress(step.progress)) + b"\n\n"
                continue
            new_ids = list(step.output.new_token_ids)
            text, is_cut = infill.add(step.text, new_ids)
            if streamed and (text or (new_ids and not step.state.finished)):
                yield b"data: " + _ENCODE(infill.partial(text, new_ids)) + b"\n\n"
            if is_cut or step.state.finished:
                infill.finish(step.state)
                break
    last = _ENCODE(infill.final(ctx, streamed))
    yield b"data: " + last + b"\n\n" if streamed else last
