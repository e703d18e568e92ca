"""Reading an image's bytes from a ``file://`` or an http(s) URL, as the `MediaPolicy`
allows, never more than its ``max_image_bytes``."""

from __future__ import annotations

import asyncio
import os
import stat
from urllib.parse import unquote, urlsplit

import httpx

from radixserve.frontend.media.errors import MediaError
from radixserve.frontend.media.policy import MediaPolicy

MAX_REDIRECTS = 3


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def read_file(url: str, policy: MediaPolicy) -> bytes:
    """The bytes of the regular file a ``file://`` URL names (blocking: run it on a worker
    thread); MediaError unless its real path (symlinks and ``..`` resolved) lies under one of
    ``policy.allowed_paths``, or when it is missing or too large."""
    if not policy.allowed_paths:
        raise MediaError("file:// image URLs are off on this server (--allowed-media-path)")
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise MediaError("a file:// image URL is file:///absolute/path on this machine")
    path = os.path.realpath(unquote(parts.path))
    if not any(_inside(path, folder) for folder in policy.allowed_paths):
        raise MediaError("the file:// image is outside the folders this server allows "
                         "(--allowed-media-path)")
    try:
        # NOTE: opened by its real path, so a link swapped in after the check is not followed
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise MediaError(f"cannot read the file:// image: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaError("the file:// image is not a regular file")
        if info.st_size > policy.max_image_bytes:
            raise MediaError(f"the image is larger than {policy.max_image_bytes} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(policy.max_image_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > policy.max_image_bytes:  # grew since fstat
        raise MediaError(f"the image is larger than {policy.max_image_bytes} bytes")
    return data


async def fetch_remote(url: str, policy: MediaPolicy) -> bytes:
    """The body of an http(s) image URL: a 200 after at most `MAX_REDIRECTS` redirects,
    within ``policy.fetch_timeout_s`` in all, streamed and cut off past
    ``policy.max_image_bytes``; MediaError otherwise (remote media off included)."""
    if not policy.allow_remote:
        raise MediaError("remote image URLs are off on this server (--allow-remote-media); "
                         "send the image inline as a data: URI")
    try:
        async with asyncio.timeout(policy.fetch_timeout_s):
            return await _download(url, policy)
    except TimeoutError:
        raise MediaError(f"fetching the image took longer than {policy.fetch_timeout_s:g} "
                         "seconds") from None
    except httpx.TooManyRedirects:
        raise MediaError(f"fetching the image: more than {MAX_REDIRECTS} redirects") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise MediaError(f"fetching the image failed: {type(exc).__name__}: {exc}") from None


async def _download(url: str, policy: MediaPolicy) -> bytes:
    limit = policy.max_image_bytes
    client = httpx.AsyncClient(timeout=policy.fetch_timeout_s, follow_redirects=True,
                               max_redirects=MAX_REDIRECTS)
    async with client, client.stream("GET", url) as response:
        if response.status_code != 200:
            raise MediaError(f"fetching the image: the server answered "
                             f"{response.status_code} {response.reason_phrase}")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise MediaError(f"the image is larger than {limit} bytes")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limit:
                raise MediaError(f"the image is larger than {limit} bytes")
        return bytes(body)
