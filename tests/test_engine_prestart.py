"""radixserve/cluster/engine_prestart.py: the engine process started before the flags are
parsed, with the thread count they ask for, ends whenever it is not used (issue 63). Its use,
a real server's engine, is in tests/server/test_startup.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pytest

from radixserve.cluster.engine_prestart import PrestartedEngine, may_prestart, prestart

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIES = """
import os
from radixserve.cluster.engine_prestart import PrestartedEngine
engine = PrestartedEngine()
print(engine._proc.pid, flush=True)
os._exit(0)
"""


@pytest.mark.parametrize(("argv", "expected"), [
    (["serve"], True),
    (["serve", "--model", "m.gguf", "--threads", "2"], True),
    (["serve", "--mock-engine"], False),
    (["serve", "--models-dir", "/models"], False),
    (["serve", "--models-dir=/models"], False),
    (["serve", "--data-parallel-size", "1"], False),
    (["serve", "-dp", "2"], False),
    (["serve", "--distributed-executor-backend=ray"], False),
    (["serve", "--help"], False),
    (["generate", "hi"], False),
    ([], False),
])
def test_which_command_lines_start_the_engine_ahead(argv, expected):
    assert may_prestart(argv) is expected


def _gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether ``pid`` exits (or is left a zombie for init to reap) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _serve_args(**overrides) -> argparse.Namespace:
    args = {"command": "serve", "mock_engine": False, "models_dir": None,
            "data_parallel_size": 1, "distributed_executor_backend": "mp", "threads": None}
    return argparse.Namespace(**{**args, **overrides})


def test_it_waits_until_cancelled():
    engine = PrestartedEngine()
    proc = engine._proc
    time.sleep(1.0)
    assert proc.is_alive()  # loading torch, then waiting for its build
    engine.cancel()
    assert not proc.is_alive() and proc.exitcode is not None  # reaped
    assert engine.take(None, "ipc://in", "ipc://out") is None  # nothing left to take
    engine.cancel()  # twice: nothing more


@pytest.mark.parametrize("flag", [{"mock_engine": True}, {"data_parallel_size": 2},
                                  {"models_dir": "/models"},
                                  {"distributed_executor_backend": "ray"}])
def test_flags_that_want_no_prestarted_engine_end_it(flag):
    engine = PrestartedEngine()
    proc = engine._proc
    assert engine.wanted_by(_serve_args(**flag)) is None
    assert not proc.is_alive() and proc.exitcode is not None


@pytest.mark.parametrize(("argv", "threads"), [
    (["serve"], None), (["serve", "--threads", "3"], 3), (["serve", "--threads=3"], 3),
    (["serve", "--model", "m.gguf", "--threads", "2", "--port", "1"], 2),
    (["serve", "--threads", "x"], None), (["serve", "--thr", "4"], None)])
def test_the_thread_count_is_read_ahead_and_checked_against_the_parse(argv, threads):
    """A count the early read gets wrong (an abbreviated flag) ends the process: its pools
    were sized for another count."""
    engine = prestart(argv)
    try:
        assert engine.threads == threads
        assert engine.wanted_by(_serve_args(threads=threads)) is engine
        assert engine.wanted_by(_serve_args(threads=5)) is None
        assert engine._proc is None
    finally:
        engine.cancel()


def test_it_ends_when_the_api_process_dies_without_cleaning_up():
    """SIGKILL of the API process (here ``os._exit``, skipping atexit): the pipe closes, and the
    waiting engine process exits instead of lingering."""
    out = subprocess.run([sys.executable, "-c", _DIES], capture_output=True, text=True,
                         check=True, timeout=60, env={**os.environ, "PYTHONPATH": _REPO})
    assert _gone(int(out.stdout.split()[0]))


def test_a_dead_one_is_not_taken():
    """The launcher then spawns a fresh engine (cluster/engine_launcher.py)."""
    engine = PrestartedEngine()
    proc = engine._proc
    proc.kill()
    proc.join()
    assert engine.take(None, "ipc://in", "ipc://out") is None
    assert engine.take(None, "ipc://in", "ipc://out") is None  # once: nothing left
