"""Start ``radixserve serve`` as a real subprocess for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(self, *args: str, timeout: float = 300.0,
                 env: dict[str, str] | None = None) -> None:
        """``env``: extra variables for the server (applied after RADIXSERVE_API_KEY is
        dropped from the inherited environment, so it may set that one)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixserve", "serve", "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**{k: v for k, v in os.environ.items() if k != "RADIXSERVE_API_KEY"},
                 **(env or {})})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/version", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not start")

    def engine_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def engine_pid(self) -> int | None:
        """The engine-core child (not multiprocessing's resource tracker, nor a dead engine
        not reaped yet), or None while there is none."""
        pids = [p for p in self.engine_pids() if b"spawn_main" in _cmdline(p)]
        assert len(pids) <= 1, pids
        return pids[0] if pids else None

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def wait_until_serving(proc, url: str, log_path, timeout: float = 60.0) -> None:
    """Until ``url``/v1/models answers 200 (a router or server started as ``proc``, its output
    in ``log_path``); fails with that output if the process exits, or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not start in {timeout} s"
        time.sleep(0.3)
