"""`MediaPolicy`: where a request's images may come from and how large they may be, from the
flags of ``radixserve serve`` (`add_media_args`, `media_policy`). The defaults take images
inline only (``data:`` URIs and bare base64): no local files, no remote fetches."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from radixserve.arg_types import positive, positive_int

MIB = 1 << 20
DEFAULT_MAX_IMAGE_BYTES = 20 * MIB
DEFAULT_FETCH_TIMEOUT_S = 10.0
DEFAULT_MAX_IMAGES = 8
DEFAULT_MAX_PIXELS = 64_000_000


@dataclass(frozen=True)
class MediaPolicy:
    """What image sources are allowed and the limits on one image and one request.

    ``allowed_paths``: real paths (symlinks resolved) of the folders ``file://`` URLs may
    read under; empty: no local files. ``allow_remote``: http(s) URLs are fetched.
    ``max_image_bytes``: an image's encoded size (inline, file or download);
    ``max_pixels``: width x height of a decoded image (the decompression-bomb guard);
    ``fetch_timeout_s``: a whole download, redirects included."""

    allowed_paths: tuple[str, ...] = ()
    allow_remote: bool = False
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    max_images_per_request: int = DEFAULT_MAX_IMAGES
    max_pixels: int = DEFAULT_MAX_PIXELS

    @classmethod
    def with_paths(cls, paths: list[str] | tuple[str, ...], **limits) -> MediaPolicy:
        """A policy whose ``allowed_paths`` are ``paths`` resolved (realpath), so a later
        check compares real paths with real paths."""
        return cls(tuple(os.path.realpath(p) for p in paths), **limits)


def _folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"not a folder: {text!r}")
    return text


def add_media_args(parser: argparse.ArgumentParser) -> None:
    """The image-input flags of ``radixserve serve`` (see `MediaPolicy`)."""
    parser.add_argument("--allowed-media-path", type=_folder, action="append", default=None,
                        metavar="DIR",
                        help="a folder whose images requests may name as file:// URLs "
                             "(repeatable). Paths are resolved first (symlinks, ..): one whose "
                             "real path leaves every such folder is refused. Default: no "
                             "file:// URLs")
    parser.add_argument("--allow-remote-media", action="store_true",
                        help="fetch http:// and https:// image URLs named in requests (off by "
                             "default: only inline data: URIs and base64 are taken). The "
                             "server fetches what clients name: enable only where that is safe")
    parser.add_argument("--max-image-bytes", type=positive_int, default=DEFAULT_MAX_IMAGE_BYTES,
                        metavar="BYTES",
                        help="largest encoded image (inline, file or download; default 20 MiB)")
    parser.add_argument("--max-image-pixels", type=positive_int, default=DEFAULT_MAX_PIXELS,
                        metavar="N",
                        help="largest decoded image, width x height (default 64,000,000): "
                             "the guard against decompression bombs")
    parser.add_argument("--media-fetch-timeout", type=positive, default=DEFAULT_FETCH_TIMEOUT_S,
                        metavar="SECONDS",
                        help="most time one remote image may take to download, redirects "
                             "included (default 10)")
    parser.add_argument("--image-max-tokens", type=positive_int, default=None, metavar="N",
                        help="most prompt tokens one image may take where the model sizes "
                             "images to their content (Qwen2.5-VL, Qwen3.5): larger images are "
                             "downscaled to fit (never below the model's minimum). Default: the "
                             "model's own limits (up to 16,384 tokens); fixed-size families "
                             "(Gemma 3, SmolVLM's tiles) keep theirs")
    parser.add_argument("--max-images-per-request", type=positive_int,
                        default=DEFAULT_MAX_IMAGES, metavar="N",
                        help="most images one request may carry (default 8)")


def media_policy(args: argparse.Namespace) -> MediaPolicy:
    """The server's `MediaPolicy` from its flags."""
    return MediaPolicy.with_paths(
        args.allowed_media_path or (), allow_remote=args.allow_remote_media,
        max_image_bytes=args.max_image_bytes, fetch_timeout_s=args.media_fetch_timeout,
        max_images_per_request=args.max_images_per_request, max_pixels=args.max_image_pixels)
