"""`MediaError`, apart so the request models can name it without loading Pillow or httpx."""

from __future__ import annotations


class MediaError(ValueError):
    """An image a request names cannot be used; the message says why (a 400 whose
    ``param`` is the request field, when set)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
