"""The images of a chat request: counting and loading them (`load_chat_images`), refusing
them for a model that takes text only (`check_takes_images`), and the inline form other APIs'
bare base64 becomes (`data_uri`). Every route turns its images into the chat request's
``image_url`` parts first (OpenAI Responses, Anthropic, Ollama), so these see them all."""

from __future__ import annotations

import asyncio
from base64 import b64decode
from collections.abc import Sequence

from radixserve.frontend.media.errors import MediaError
from radixserve.frontend.media.policy import MediaPolicy

TEXT_ONLY = "the served model takes text only"

# leading bytes -> media type, for bare base64 that comes without one (Ollama's images)
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"), (b"BM", "image/bmp"))


def sniff_media_type(b64: str) -> str:
    """The image type base64 data starts with, else ``application/octet-stream`` (the
    loader decides from the bytes either way; this only labels the data URI)."""
    try:
        head = b64decode("".join(b64[:64].split())[:32] + "==", validate=False)
    except ValueError:
        return "application/octet-stream"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)),
                "application/octet-stream")


def data_uri(b64: str, media_type: str | None = None) -> str:
    """Bare base64 as a ``data:`` URI of ``media_type`` (sniffed when not given)."""
    return f"data:{media_type or sniff_media_type(b64)};base64,{b64}"


def image_urls(messages: Sequence) -> list[tuple[str, str]]:
    """(where, url) of every image part of chat ``messages`` (`ChatMessage`s), in order;
    ``where`` names the part as an error location (``messages[1].content[0]``)."""
    return [(f"messages[{i}].content[{j}]", part.image_url.url)
            for i, message in enumerate(messages)
            for j, part in enumerate(message.content if isinstance(message.content, list)
                                     else ())
            if part.type == "image_url"]


def check_takes_images(takes_images: bool, messages: Sequence, param: str = "messages"
                       ) -> None:
    """MediaError (naming the request field ``param``) when chat ``messages`` hold an image
    and the served model takes text only."""
    if not takes_images and image_urls(messages):
        raise MediaError(f"image input is not supported: {TEXT_ONLY}", param)


async def load_chat_images(messages: Sequence, policy: MediaPolicy) -> list:
    """Every image of chat ``messages`` as a decoded Pillow image, in prompt order; loaded
    concurrently (downloads overlap). MediaError naming the part for the first that fails,
    or before any is read when there are more than ``policy.max_images_per_request``."""
    from radixserve.frontend.media.loader import load_image  # Pillow: only when used

    urls = image_urls(messages)
    if len(urls) > policy.max_images_per_request:
        raise MediaError(f"too many images: {len(urls)}, at most "
                         f"{policy.max_images_per_request} per request", "messages")

    async def one(where: str, url: str):
        try:
            return await load_image(url, policy)
        except MediaError as exc:
            raise MediaError(f"{where}: {exc}", "messages") from None

    tasks = [asyncio.ensure_future(one(where, url)) for where, url in urls]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:  # the first failure ends the rest (their downloads, not threads)
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
