"""A local stand-in for the Hugging Face hub: the endpoints huggingface_hub calls to list a
repo and download its files, served from files on disk by a threaded ``http.server``. Point
the library at it with HF_ENDPOINT (a subprocess) or `FakeHub.patch` (this process).

``GET /api/models/{repo}/revision/{rev}``: the repo's id, commit and files (size, LFS sha256);
``HEAD|GET /{repo}/resolve/{rev}/{path}``: the file, with the headers the library reads
(X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size) and HTTP Range for resumed transfers.
Unknown repos answer 404 with X-Error-Code RepoNotFound, as the hub does."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import threading
from pathlib import Path
from typing import Self

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """``repos``: repo id -> {path in the repo: file on disk}. ``corrupt``: paths served with
    one byte changed (the listing keeps the true hash); ``cut_once``: paths whose first GET
    breaks off half way (the connection closes). ``requests``: (method, path, Range header)
    of every request, in order."""

    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = repos
        self.corrupt: set[str] = set()
        self.cut_once: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self._sha: dict[Path, str] = {}
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def patch(self, monkeypatch, home: Path) -> None:
        """Point this process's huggingface_hub at the fake hub, its cache in ``home``."""
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "ENDPOINT", self.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            self.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def env(self, home: Path) -> dict[str, str]:
        """The environment of a subprocess that uses the fake hub, its cache in ``home``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        return {**env, "HF_ENDPOINT": self.url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_TELEMETRY": "1"}

    def sha256(self, path: Path) -> str:
        if path not in self._sha:
            with open(path, "rb") as f:
                self._sha[path] = hashlib.file_digest(f, "sha256").hexdigest()
        return self._sha[path]

    # -- serving -----------------------------------------------------------------------

    def _answer(self, req, body: bool) -> None:
        self.requests.append((req.command, req.path, req.headers.get("Range")))
        path = req.path.split("?")[0]
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo = (info or resolve)[1] if info or resolve else None
        if repo not in self.repos:
            return self._send(req, 404, b'{"error": "Repository not found"}', body,
                              {"X-Error-Code": "RepoNotFound"})
        files = self.repos[repo]
        if info:
            siblings = [{"rfilename": name, "size": p.stat().st_size, "blobId": "0" * 40,
                         "lfs": {"size": p.stat().st_size, "sha256": self.sha256(p),
                                 "pointerSize": 134}} for name, p in files.items()]
            data = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
            return self._send(req, 200, data, body, {"Content-Type": "application/json"})
        name = resolve[3]
        if name not in files:
            return self._send(req, 404, b"{}", body, {"X-Error-Code": "EntryNotFound",
                                                      "X-Repo-Commit": COMMIT})
        data = files[name].read_bytes()
        if name in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        headers = {"X-Repo-Commit": COMMIT, "ETag": '"gitblob"', "Accept-Ranges": "bytes",
                   "X-Linked-Etag": f'"{self.sha256(files[name])}"',
                   "X-Linked-Size": str(len(data))}
        start = int(re.match(r"bytes=(\d+)-", req.headers.get("Range", "bytes=0-"))[1])
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if body and name in self.cut_once:
            self.cut_once.discard(name)
            return self._send(req, status, data[start:], body, headers, cut=True)
        return self._send(req, status, data[start:], body, headers)

    @staticmethod
    def _send(req, status: int, data: bytes, body: bool, headers: dict[str, str],
              cut: bool = False) -> None:
        req.send_response(status)
        for key, value in headers.items():
            req.send_header(key, value)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if body:
            req.wfile.write(data[:len(data) // 2] if cut else data)
        if cut:
            req.close_connection = True
            req.wfile.flush()
            req.connection.shutdown(2)
