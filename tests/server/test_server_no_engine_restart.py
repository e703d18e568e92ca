"""``--no-engine-restart``: when the engine process dies, in-flight streams end with an error
event and ``[DONE]``, and the API process exits non-zero (for an outside supervisor to act)
without leaving a process behind."""

from __future__ import annotations

import json
import os
import signal
import time

from server_proc import ServerProc
from test_server_faults import _Stream, _stream_body, _wait_gone


def test_the_server_exits_non_zero_when_its_engine_dies():
    s = ServerProc("--mock-engine", "--mock-step-ms", "5", "--max-model-len", "1000000",
                   "--no-engine-restart", timeout=120)
    try:
        children = s.engine_pids()
        streams = [_Stream(s.url, _stream_body(900_000)) for _ in range(4)]
        for t in streams:
            t.start()
        for t in streams:
            assert t.first.wait(30) and t.error is None, t.error
        os.kill(s.engine_pid(), signal.SIGKILL)
        killed = time.monotonic()
        code = s.proc.wait(timeout=20)
        exited_after = time.monotonic() - killed
        output = s.proc.stdout.read()
    finally:
        s.stop(timeout=10)
    assert code == 1, output
    assert exited_after < 10
    assert ("radixserve: error: the engine process exited with code -9 (engine restarts are "
            "off: --no-engine-restart)") in output
    assert "starting a new engine" not in output
    for t in streams:
        t.join(10)
        assert not t.is_alive() and t.status == 200, t.error
        assert t.payloads[-1] == "[DONE]", t.payloads[-3:]
        assert json.loads(t.payloads[-2])["error"]["type"] == "service_unavailable"
    assert not _wait_gone(children)
