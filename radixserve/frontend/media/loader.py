"""Images from what a request names: ``data:`` URIs, bare base64 (Ollama, Anthropic),
``file://`` URLs and http(s) URLs, as the `MediaPolicy` allows (reading: `fetch`). Each
becomes a fully decoded Pillow image, in the mode it was stored in; decoding runs on a worker
thread so a large image never blocks the event loop. Every refusal is a `MediaError` (a
``ValueError``: a 400) saying what was wrong."""

from __future__ import annotations

import asyncio
import binascii
import io
import struct
import zlib
from base64 import b64decode

from PIL import Image

from radixserve.frontend.media.errors import MediaError
from radixserve.frontend.media.fetch import fetch_remote, read_file
from radixserve.frontend.media.policy import MediaPolicy

__all__ = ["MediaError", "decode_image", "load_image", "load_image_b64"]

# the formats OpenAI and Anthropic take, and BMP; Pillow opens many more, some through outside
# programs (EPS: Ghostscript), which requests never reach
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
Image.init()  # registers the plugins: `open` preloads only a few (not WEBP)
# what Pillow raises on a corrupt or truncated file, besides its own errors
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
                  IndexError, TypeError)


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """``data`` decoded (``load()`` called: every pixel read), or MediaError: not an image of
    a supported format, more than ``policy.max_pixels`` pixels, corrupt or truncated.

    NOTE: the pixel limit is checked on the header's size before any pixel is decoded.
    Pillow's own guard (the process-wide ``Image.MAX_IMAGE_PIXELS``) is left as it is and
    only backs this one up: setting it per call would race with other threads."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:
        raise MediaError(f"the image has too many pixels: {exc}") from None
    except Image.UnidentifiedImageError:
        raise MediaError("not an image, or not a supported format (PNG, JPEG, WEBP, GIF, "
                         "BMP)") from None
    except _DECODE_ERRORS as exc:
        raise MediaError(f"the image is corrupt: {exc}") from None
    width, height = image.size
    if width * height > policy.max_pixels:
        raise MediaError(f"the image has too many pixels: {width}x{height} is more than "
                         f"{policy.max_pixels}")
    if width < 1 or height < 1:
        raise MediaError(f"the image is empty ({width}x{height})")
    try:
        image.load()
    except Image.DecompressionBombError as exc:
        raise MediaError(f"the image has too many pixels: {exc}") from None
    except _DECODE_ERRORS as exc:
        raise MediaError(f"the image is corrupt or truncated: {exc}") from None
    return image


def decode_b64(data: str, policy: MediaPolicy) -> bytes:
    """Base64 text (standard alphabet; whitespace such as MIME line breaks ignored) as bytes;
    MediaError when it is not base64 or decodes to more than ``policy.max_image_bytes``."""
    if len(data) // 4 * 3 > policy.max_image_bytes + 3 * len(data) // 76 + 3:
        raise _too_large(policy)  # checked before decoding: slack for line breaks
    try:
        raw = b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        try:  # line breaks inside (the rarer case: joined only then)
            raw = b64decode("".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise MediaError("the image is not valid base64") from None
    if len(raw) > policy.max_image_bytes:
        raise _too_large(policy)
    if not raw:
        raise MediaError("the image is empty")
    return raw


def _too_large(policy: MediaPolicy) -> MediaError:
    return MediaError(f"the image is larger than {policy.max_image_bytes} bytes")


def parse_data_uri(url: str) -> str:
    """The base64 text of a ``data:image/...;base64,`` URI (``application/octet-stream``
    too: the bytes, not the declared type, decide the format); MediaError otherwise."""
    head, comma, payload = url.partition(",")
    if not comma:
        raise MediaError("a data: URI needs a ',' before its data")
    media_type, *params = head[len("data:"):].split(";")
    media_type = media_type.strip().lower()
    if not (media_type.startswith("image/") or media_type == "application/octet-stream"):
        raise MediaError(f"a data: URI of type {media_type or 'text/plain'!r} is not an image")
    if "base64" not in (p.strip().lower() for p in params):
        raise MediaError("a data: URI must be base64 (data:image/png;base64,...)")
    return payload


async def load_image_b64(data: str, policy: MediaPolicy) -> Image.Image:
    """A bare base64 image (Ollama's ``images``, Anthropic's base64 source), decoded."""
    return await asyncio.to_thread(lambda: decode_image(decode_b64(data, policy), policy))


async def load_image(url: str, policy: MediaPolicy) -> Image.Image:
    """The image ``url`` names, decoded: a ``data:`` URI, or (as ``policy`` allows) a
    ``file://`` URL under an allowed folder or an http(s) URL; any other scheme is refused."""
    scheme = url[:url.find(":")].lower() if ":" in url[:12] else ""
    if scheme == "data":
        return await load_image_b64(parse_data_uri(url), policy)
    if scheme == "file":
        data = await asyncio.to_thread(read_file, url, policy)
    elif scheme in ("http", "https"):
        data = await fetch_remote(url, policy)
    else:
        shown = f"{scheme!r} URLs are" if scheme else "a URL without a scheme is"
        raise MediaError(f"{shown} not supported for images: use a data: URI "
                         "(data:image/png;base64,...), file:// or http(s)://")
    return await asyncio.to_thread(decode_image, data, policy)
