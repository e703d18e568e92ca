"""frontend/media: images from data URIs, base64, files and http(s) URLs, against real encoded
images (Pillow, in tmp) and a local HTTP server; every refusal is a `MediaError` saying why."""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.server
import io
import os
import struct
import threading
import time
import zlib

import pytest
from PIL import Image

from radixserve.frontend.media.chat import load_chat_images, sniff_media_type
from radixserve.frontend.media.errors import MediaError
from radixserve.frontend.media.loader import decode_image, load_image, load_image_b64
from radixserve.frontend.media.policy import MediaPolicy, add_media_args, media_policy
from radixserve.frontend.openai.protocol_chat import ChatMessage


def encoded(fmt: str = "PNG", size=(32, 24), mode: str = "RGB") -> bytes:
    """A noise image (so its compressed data is not trivially short) in ``fmt``."""
    image = Image.effect_noise(size, 60).convert(mode)
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def load(url: str, policy: MediaPolicy | None = None) -> Image.Image:
    return asyncio.run(load_image(url, policy or MediaPolicy()))


def refused(url: str, policy: MediaPolicy | None = None) -> str:
    with pytest.raises(MediaError) as caught:
        load(url, policy)
    return str(caught.value)


# ----------------------------------------------------------------------------- inline


@pytest.mark.parametrize("fmt, mode", [("PNG", "RGB"), ("PNG", "RGBA"), ("JPEG", "RGB"),
                                       ("WEBP", "RGB"), ("GIF", "P"), ("BMP", "RGB"),
                                       ("PNG", "L")])
def test_data_uris_decode_fully_in_their_own_mode(fmt, mode):
    image = load(uri(encoded(fmt, mode=mode if fmt != "GIF" else "RGB")))
    assert image.size == (32, 24) and image.format == fmt
    assert image.mode == mode or fmt in ("GIF",)  # GIF stores a palette
    assert image.getpixel((0, 0)) is not None  # loaded: pixels are readable


def test_bare_base64_with_line_breaks():
    text = base64.encodebytes(encoded("JPEG")).decode()  # MIME: a newline every 76 characters
    assert "\n" in text
    image = asyncio.run(load_image_b64(text, MediaPolicy()))
    assert image.format == "JPEG" and image.size == (32, 24)
    one_line = base64.b64encode(encoded("PNG")).decode() + "\n"  # `base64 -w0 FILE; echo`
    assert asyncio.run(load_image_b64(one_line, MediaPolicy())).format == "PNG"


@pytest.mark.parametrize("url, says", [
    ("data:image/png;base64,%%%notbase64", "not valid base64"),
    ("data:image/png;base64,", "empty"),
    (uri(b"just some text, not an image"), "not an image"),
    (uri(b"%PDF-1.4 ..."), "not an image"),
    ("data:text/plain;base64,aGVsbG8=", "'text/plain' is not an image"),
    ("data:image/png,rawbytes", "must be base64"),
    ("data:image/png;base64", "needs a ','"),
])
def test_bad_inline_images(url, says):
    assert says in refused(url)


def test_unsupported_formats_are_refused():
    assert "not a supported format" in refused(uri(encoded("TIFF"), "image/tiff"))
    assert "not a supported format" in refused(uri(encoded("PPM"), "image/x-ppm"))


def test_truncated_and_corrupt_images():
    data = encoded("JPEG", size=(200, 160))
    assert "truncated" in refused(uri(data[: len(data) // 2], "image/jpeg"))
    png = encoded("PNG", size=(200, 160))
    says = refused(uri(png[: len(png) // 2]))
    assert "corrupt" in says or "truncated" in says
    broken = bytearray(png)
    broken[100:140] = b"\0" * 40  # inside the compressed data
    says = refused(uri(bytes(broken)))
    assert "corrupt" in says or "truncated" in says


def test_pixel_limit_is_checked_before_decoding():
    small = MediaPolicy(max_pixels=32 * 24 - 1)
    assert "too many pixels: 32x24" in refused(uri(encoded()), small)
    assert load(uri(encoded()), MediaPolicy(max_pixels=32 * 24)).size == (32, 24)


def _png_declaring(width: int, height: int) -> bytes:
    """A small PNG whose header declares ``width`` x ``height`` (1-bit grey), with one
    zlib-compressed row of data: what a decompression bomb looks like before decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (1 + (width + 7) // 8), 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows)
            + chunk(b"IEND", b""))


def test_a_decompression_bomb_never_allocates_its_pixels():
    """A tiny PNG declaring 30000 x 30000 (900 Mpx): refused from its header alone, by the
    policy's limit and, with that raised, by Pillow's own guard behind it."""
    data = _png_declaring(30000, 30000)
    assert len(data) < 1000
    assert "too many pixels" in refused(uri(data))
    assert "too many pixels" in refused(uri(data), MediaPolicy(max_pixels=10**12))


def test_size_limit_on_inline_images():
    data = encoded("BMP", size=(64, 64))  # BMP: uncompressed, ~12 KB
    assert "larger than 4096 bytes" in refused(uri(data, "image/bmp"),
                                               MediaPolicy(max_image_bytes=4096))
    assert load(uri(data, "image/bmp"), MediaPolicy(max_image_bytes=len(data))).size == (64, 64)


def test_decode_runs_off_the_event_loop():
    """The loop keeps ticking while a large image decodes on a worker thread."""
    data = uri(encoded("PNG", size=(1500, 1500)))  # noise: ~7 MB
    ticks = 0

    async def main():
        nonlocal ticks
        task = asyncio.ensure_future(load_image(data, MediaPolicy()))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.001)
        return task.result()

    assert asyncio.run(main()).size == (1500, 1500)
    assert ticks > 1


@pytest.mark.parametrize("url, says", [
    ("ftp://example.com/a.png", "'ftp' URLs are not supported"),
    ("javascript:alert(1)", "'javascript' URLs are not supported"),
    ("cat.png", "a URL without a scheme is not supported"),
    ("/etc/passwd", "a URL without a scheme"),
])
def test_other_schemes_are_refused(url, says):
    assert says in refused(url)


def test_sniffed_media_types():
    for fmt, kind in [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"),
                      ("WEBP", "image/webp"), ("BMP", "image/bmp")]:
        assert sniff_media_type(base64.b64encode(encoded(fmt)).decode()) == kind
    assert sniff_media_type("bm90IGFuIGltYWdl") == "application/octet-stream"
    assert sniff_media_type("%%%") == "application/octet-stream"
    assert load("data:application/octet-stream;base64,"
                + base64.b64encode(encoded()).decode()).format == "PNG"


# ----------------------------------------------------------------------------- file://


@pytest.fixture
def media_dir(tmp_path):
    allowed = tmp_path / "media"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "cat.png").write_bytes(encoded())
    (allowed / "sub" / "dog.jpg").write_bytes(encoded("JPEG"))
    (tmp_path / "secret.png").write_bytes(encoded())
    os.symlink(tmp_path / "secret.png", allowed / "escape.png")
    os.symlink(tmp_path, allowed / "up")
    os.symlink(allowed / "cat.png", allowed / "alias.png")  # stays inside: fine
    return allowed


def test_file_urls_under_the_allowed_folder(media_dir):
    policy = MediaPolicy.with_paths([str(media_dir)])
    assert load(f"file://{media_dir}/cat.png", policy).format == "PNG"
    assert load(f"file://{media_dir}/sub/dog.jpg", policy).format == "JPEG"
    assert load(f"file://localhost{media_dir}/alias.png", policy).format == "PNG"
    assert load(f"file://{media_dir}/sub/../cat.png", policy).format == "PNG"
    assert load(f"file://{str(media_dir).replace('media', 'm%65dia')}/cat.png",
                policy).format == "PNG"  # percent-escapes are read


@pytest.mark.parametrize("name", ["../secret.png", "escape.png", "up/secret.png",
                                  "sub/../../secret.png"])
def test_file_urls_cannot_leave_the_folder(media_dir, name):
    policy = MediaPolicy.with_paths([str(media_dir)])
    assert "outside the folders this server allows" in refused(f"file://{media_dir}/{name}",
                                                               policy)


def test_file_url_refusals(media_dir, tmp_path):
    assert "file:// image URLs are off" in refused(f"file://{media_dir}/cat.png")
    policy = MediaPolicy.with_paths([str(media_dir)])
    assert "cannot read" in refused(f"file://{media_dir}/missing.png", policy)
    assert "not a regular file" in refused(f"file://{media_dir}/sub", policy)
    assert "file:///absolute/path" in refused(f"file://otherhost{media_dir}/cat.png", policy)
    small = MediaPolicy.with_paths([str(media_dir)], max_image_bytes=100)
    assert "larger than 100 bytes" in refused(f"file://{media_dir}/cat.png", small)
    os.mkfifo(media_dir / "pipe")  # would block a plain open()
    assert "not a regular file" in refused(f"file://{media_dir}/pipe", policy)
    similar = tmp_path / "media-other"  # a sibling whose name extends the allowed one
    similar.mkdir()
    (similar / "x.png").write_bytes(encoded())
    assert "outside" in refused(f"file://{similar}/x.png", policy)


# ----------------------------------------------------------------------------- http(s)


class _Handler(http.server.BaseHTTPRequestHandler):
    PNG = encoded()

    def do_GET(self):
        if self.path == "/cat.png":
            self._send(200, self.PNG)
        elif self.path == "/big.png":  # honest Content-Length over the limit
            self._send(200, self.PNG + b"\0" * 100_000)
        elif self.path == "/chunked":  # no Content-Length: cut off while streaming
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(50):
                chunk = b"\0" * 4096
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, self.PNG)
        elif self.path == "/drip":  # each byte in time, the whole too slow
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.PNG)))
            self.end_headers()
            for byte in self.PNG[:40]:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)
        elif self.path == "/redirect":
            self._redirect("/cat.png")
        elif self.path.startswith("/loop"):
            self._redirect(f"/loop{int(self.path[5:] or 0) + 1}")
        elif self.path == "/text":
            self._send(200, b"<html>not an image</html>")
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, where: str) -> None:
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the client hung up on purpose (limits, time-outs)


@pytest.fixture(scope="module")
def web():
    server = _Server(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


REMOTE = MediaPolicy(allow_remote=True, max_image_bytes=50_000, fetch_timeout_s=1.0)


def test_remote_fetches_when_allowed(web):
    assert load(f"{web}/cat.png", REMOTE).format == "PNG"
    assert load(f"{web}/redirect", REMOTE).format == "PNG"


def test_remote_off_by_default(web):
    assert "remote image URLs are off" in refused(f"{web}/cat.png")
    assert "remote image URLs are off" in refused("https://example.com/cat.png")


@pytest.mark.parametrize("path, says", [
    ("/missing.png", "answered 404"),
    ("/big.png", "larger than 50000 bytes"),
    ("/chunked", "larger than 50000 bytes"),
    ("/slow", "longer than 1 seconds"),
    ("/drip", "longer than 1 seconds"),
    ("/loop", "more than 3 redirects"),
    ("/text", "not an image"),
])
def test_remote_refusals(web, path, says):
    started = time.monotonic()
    assert says in refused(f"{web}{path}", REMOTE)
    assert time.monotonic() - started < 2.5  # the time limit covers the whole fetch


def test_remote_connection_failure():
    assert "fetching the image failed" in refused("http://127.0.0.1:9/x.png", REMOTE)


# ----------------------------------------------------------------------------- a request


def _messages(*urls: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content=[
                {"type": "text", "text": "What is this?"},
                *({"type": "image_url", "image_url": {"url": u}} for u in urls)])]


def test_chat_images_in_order():
    urls = [uri(encoded("PNG", size=(10 + i, 10))) for i in range(3)]
    images = asyncio.run(load_chat_images(_messages(*urls), MediaPolicy()))
    assert [image.size for image in images] == [(10, 10), (11, 10), (12, 10)]
    assert asyncio.run(load_chat_images(_messages(), MediaPolicy())) == []


def test_chat_image_limits_and_failures_name_the_part():
    urls = [uri(encoded())] * 3
    with pytest.raises(MediaError, match="too many images: 3, at most 2 per request"):
        asyncio.run(load_chat_images(_messages(*urls), MediaPolicy(max_images_per_request=2)))
    with pytest.raises(MediaError, match=r"messages\[1\]\.content\[2\]: the image is not valid"):
        asyncio.run(load_chat_images(_messages(urls[0], "data:image/png;base64,@@"),
                                     MediaPolicy()))


def test_decode_image_direct():
    assert decode_image(encoded("GIF"), MediaPolicy()).format == "GIF"


# ----------------------------------------------------------------------------- flags


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_media_args(parser)
    return parser.parse_args(list(argv))


def test_policy_from_flags(tmp_path):
    assert media_policy(_args()) == MediaPolicy()
    assert MediaPolicy() == MediaPolicy((), False, 20 << 20, 10.0, 8, 64_000_000)
    link = tmp_path / "link"
    os.symlink(tmp_path, link)
    policy = media_policy(_args("--allowed-media-path", str(link), "--allowed-media-path",
                                str(tmp_path), "--allow-remote-media", "--max-image-bytes",
                                "1000", "--media-fetch-timeout", "2.5",
                                "--max-images-per-request", "3", "--max-image-pixels", "99"))
    assert policy == MediaPolicy((os.path.realpath(tmp_path),) * 2, True, 1000, 2.5, 3, 99)


@pytest.mark.parametrize("argv", [["--allowed-media-path", "/no/such/folder"],
                                  ["--max-image-bytes", "0"], ["--media-fetch-timeout", "-1"],
                                  ["--max-images-per-request", "x"]])
def test_bad_flags_are_usage_errors(argv):
    with pytest.raises(SystemExit):
        _args(*argv)
