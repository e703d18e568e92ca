"""``ngram``: prompt lookup. The draft is what followed the latest earlier occurrence of the
request's last n tokens (n from ``max_ngram`` down to ``min_ngram``) in its own prompt and
output. Its evidence is the length of that match, followed back past the n-gram (up to
``_MAX_EVIDENCE`` tokens): a draft copied from a place that matched the last 12 tokens is far
likelier right than one that matched the last token only.

Each request keeps, per n, a map n-gram → the position after its latest occurrence, updated
with the tokens appended since the last call (O(new tokens) per step, not a scan of the
context), and dropped when the request finishes.
"""

from __future__ import annotations

from radixserve.spec.proposer import NO_DRAFT, Draft

_MAX_EVIDENCE = 16  # context tokens compared behind a match, at most


class _Index:
    __slots__ = ("maps", "upto")

    def __init__(self, sizes: range) -> None:
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.upto = 0  # n-grams ending before this position are indexed


class NgramProposer:
    name = "ngram"
    gives_evidence = True  # its drafts carry a match length (spec/proposer.py)
    enabled = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min <= max, got {min_ngram}, "
                             f"{max_ngram}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # longest first
        self._index: dict[str, _Index] = {}

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> Draft:
        if k <= 0:
            return NO_DRAFT
        index = self._index.get(request_id)
        if index is None:
            index = self._index[request_id] = _Index(self.sizes)
        n_tokens = len(token_ids)
        # Index every n-gram that has a token after it: those ending at p <= n_tokens - 1.
        for p in range(max(index.upto, 1), n_tokens):
            for n, table in index.maps.items():
                if p >= n:
                    table[tuple(token_ids[p - n:p])] = p
        index.upto = max(index.upto, n_tokens)
        for n, table in index.maps.items():
            if n_tokens < n:
                continue
            start = table.get(tuple(token_ids[n_tokens - n:]))
            if start is not None:
                return Draft(token_ids[start:start + k], _match_length(token_ids, start, n))
        return NO_DRAFT

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        self._index.pop(request_id, None)


def _match_length(token_ids: list[int], start: int, n: int) -> int:
    """How many tokens before ``start`` equal the context's last ones (at least the ``n`` of
    the n-gram found there, at most ``_MAX_EVIDENCE``)."""
    end, m = len(token_ids), n
    while m < _MAX_EVIDENCE and start - 1 - m >= 0 and \
            token_ids[start - 1 - m] == token_ids[end - 1 - m]:
        m += 1
    return m
