"""``ngram``: prompt lookup. The draft is what followed the latest earlier occurrence of the
request's last n tokens (n from ``max_ngram`` down to ``min_ngram``) in its own prompt and
output.

Each request keeps, per n, a map n-gram → the position after its latest occurrence, updated
with the tokens appended since the last call (O(new tokens) per step, not a scan of the
context), and dropped when the request finishes.
"""

from __future__ import annotations


class _Index:
    __slots__ = ("maps", "upto")

    def __init__(self, sizes: range) -> None:
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.upto = 0  # n-grams ending before this position are indexed


class NgramProposer:
    name = "ngram"
    enabled = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min <= max, got {min_ngram}, "
                             f"{max_ngram}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # longest first
        self._index: dict[str, _Index] = {}

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> list[int]:
        if k <= 0:
            return []
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
                return token_ids[start:start + k]
        return []

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        self._index.pop(request_id, None)
