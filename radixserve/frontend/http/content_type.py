"""Which request bodies the server reads: every POST route takes JSON, so a POST must say
``Content-Type: application/json`` (optionally ``; charset=utf-8``), else 415. An API whose
own clients send JSON under any type (Ollama's: ``curl -d``, litellm) is read whatever the
type, unless the request comes from a browser (it carries ``Origin``).

This is what makes a cross-site form or ``fetch`` with ``text/plain`` (a "simple" request,
sent by a browser without a CORS preflight) unable to drive an unauthenticated server: a web
page can only send ``application/json`` after a preflight, which this server never grants.
"""

from __future__ import annotations

from radixserve.frontend.http.protocol_base import OpenAIError

_BODY_METHODS = {"POST", "PUT", "PATCH"}
_UTF8 = {b"utf-8", b"utf8"}


def unsupported_media_type(method: str, headers: dict[bytes, bytes],
                           json_only: bool = True) -> OpenAIError | None:
    """The 415 error for a request whose body is not declared as UTF-8 JSON; None when it is
    (or the method carries no body, or not ``json_only`` and no ``Origin`` header)."""
    if method not in _BODY_METHODS or (not json_only and b"origin" not in headers):
        return None
    given = headers.get(b"content-type")
    if given is None:
        return _refusal("no Content-Type")
    media_type, *params = (part.strip().lower() for part in given.split(b";"))
    if media_type != b"application/json":
        return _refusal(f"Content-Type {given.decode('latin-1')!r}")
    for param in params:
        name, _, value = param.partition(b"=")
        if name.strip() == b"charset" and value.strip().strip(b'"') not in _UTF8:
            return _refusal(f"Content-Type {given.decode('latin-1')!r}")
    return None


def _refusal(what: str) -> OpenAIError:
    return OpenAIError(f"unsupported media type: {what}; request bodies must be JSON "
                       "(Content-Type: application/json)", 415, code="unsupported_media_type")
