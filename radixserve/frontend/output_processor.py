"""Per-request frontend state: incremental detokenization, stop strings, logprobs.

Used by the offline ``LLM`` and by the API process alike. ``RequestState.process`` takes one
``EngineCoreOutput`` and returns the text that may be streamed now; text that could still turn
out to be the start of a stop string is held back until it cannot.
"""

from __future__ import annotations

from radixserve.core.reports import EngineCoreOutput
from radixserve.tokenizer.tokenizer import Tokenizer
from radixserve.outputs import CompletionOutput, Logprob
from radixserve.sampling_params import SamplingParams


class RequestState:
    def __init__(self, index: int, prompt_token_ids: list[int], params: SamplingParams,
                 tokenizer: Tokenizer) -> None:
        self.index = index
        self.params = params
        self.tokenizer = tokenizer
        self.detok = tokenizer.detokenizer(prompt_token_ids, params.skip_special_tokens)
        self.prompt_token_ids = prompt_token_ids
        self.token_ids: list[int] = []
        self.text = ""
        self.num_released = 0
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_cached_tokens = 0
        self._hold = max((len(s) for s in params.stop), default=1) - 1

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def process(self, out: EngineCoreOutput) -> str:
        """Apply one step's output; return the newly streamable text.

        After a stop string matched, ``finished`` is set with reason "stop" although the
        engine does not know yet: the caller aborts the request in the engine.
        """
        self.token_ids.extend(out.new_token_ids)
        self.num_cached_tokens = out.num_cached_tokens
        if self.logprobs is not None and out.logprobs is not None:
            self._add_logprobs(out)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = [None] + [
                self._entry(token, lp, top) for token, lp, top in zip(
                    self.prompt_token_ids[1:], out.prompt_logprobs[1:],
                    out.prompt_top_logprobs[1:])]
        before = len(self.text)
        self.text += self.detok.step(out.new_token_ids)
        if out.finish_reason is not None:
            self.text += self.detok.flush()  # a last, incomplete character
        if self.params.stop and self._match_stop(before):
            pass
        elif out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            last = self.token_ids[-1] if self.token_ids else None
            if out.finish_reason == "stop" and last in self.params.stop_token_ids:
                self.stop_reason = last
        end = len(self.text) if self.finished else max(self.num_released,
                                                        len(self.text) - self._hold)
        delta = self.text[self.num_released:end]
        self.num_released = end
        return delta

    def completion_output(self) -> CompletionOutput:
        return CompletionOutput(
            self.index, self.text, list(self.token_ids), self.finish_reason, self.stop_reason,
            self.logprobs, self.cumulative_logprob if self.logprobs is not None else None)

    def _match_stop(self, before: int) -> bool:
        start = max(0, before - self._hold)
        best = None
        for stop in self.params.stop:
            idx = self.text.find(stop, start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return False
        idx, stop = best
        self.text = self.text[: idx + len(stop) if self.params.include_stop_str_in_output else idx]
        self.finish_reason, self.stop_reason = "stop", stop
        return True

    def _add_logprobs(self, out: EngineCoreOutput) -> None:
        for token, lp, top in zip(out.new_token_ids, out.logprobs, out.top_logprobs or []):
            self.logprobs.append(self._entry(token, lp, top))
            self.cumulative_logprob += lp

    def _entry(self, token: int, lp: float, top: list[tuple[int, float]]
               ) -> dict[int, Logprob]:
        """{token id: Logprob}: the token first unless it is among the top alternatives
        (which carry their rank), each with its text."""
        entry = {tid: Logprob(tlp, rank + 1) for rank, (tid, tlp) in enumerate(top)}
        if token not in entry:
            entry = {token: Logprob(lp)} | entry
        for tid, item in entry.items():
            item.decoded_token = self.tokenizer.decode([tid], skip_special_tokens=False)
        return entry
