"""The engine-core process started before the API process has read its flags, so that the two
processes start up side by side (issue 63).

    API process:  python ─▶ imports, flags, its modules, tokenizer ... ──────────────▶ serve
    engine:             └─▶ python, torch, engine modules ─(waits)─▶ build ──▶ ready
                                                           ▲ (build, sockets): the launcher

``radixserve serve`` spends about 0.6 s importing its modules and parsing its flags before its
launcher would spawn the engine, whose first second then goes to starting Python and importing
torch: all of it on the way to ready. `PrestartedEngine` spawns the process at once with the
thread count the command line asks for (it must be set before torch loads:
`apply_engine_threads`); the process imports torch and the engine's modules, then waits for
what `run_engine_core` takes. The first `LocalLauncher.start` hands it that (`take`); a restart
spawns a fresh process as before.

Only for the one local engine (not ``--mock-engine``, ``--models-dir``, data-parallel replicas
or Ray): `may_prestart` reads the command line for those and for ``--threads`` before the
flags are parsed, and once they are, `wanted_by` ends a process that is not wanted after all
or was started with another thread count than the parse found. The process also ends when
the API process goes (its pipe closes). Torch-free at import: the API process imports it.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import multiprocessing
import signal
from multiprocessing.connection import Connection

_NOT_PRESTARTED = ("--mock-engine", "--models-dir", "--data-parallel-size", "-dp",
                   "--distributed-executor-backend", "-h", "--help")


def may_prestart(argv: list[str]) -> bool:
    """Whether ``argv`` (the command line after the program) is a ``serve`` whose one local
    engine is worth starting before the flags are parsed; a flag that may change that (even
    ``--data-parallel-size 1``) says no, and the engine is spawned as usual."""
    return argv[:1] == ["serve"] and not any(
        arg.split("=", 1)[0] in _NOT_PRESTARTED for arg in argv[1:])


def prestart(argv: list[str]) -> PrestartedEngine | None:
    """A `PrestartedEngine` where `may_prestart` says so (ended at this process's exit if no
    launcher took it), else None."""
    if not may_prestart(argv):
        return None
    engine = PrestartedEngine(_threads_flag(argv[1:]))
    atexit.register(engine.cancel)
    return engine


def _threads_flag(args: list[str]) -> int | None:
    """``--threads N`` as the full parse will most likely read it (None: not given, or not
    readable here: `PrestartedEngine.wanted_by` checks it against the parse)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--threads", type=int, default=None)
    try:
        return parser.parse_known_args(args)[0].threads
    except argparse.ArgumentError:
        return None


class PrestartedEngine:
    """An engine-core process started ahead of its build (see the module docstring). Not
    thread-safe: the API process's main thread drives it."""

    def __init__(self, threads: int | None = None) -> None:
        """``threads``: the engine's ``--threads`` (None: its default)."""
        self.threads = threads
        ctx = multiprocessing.get_context("spawn")
        receiver, self._sender = ctx.Pipe(duplex=False)
        self._proc: multiprocessing.Process | None = ctx.Process(
            target=_prestarted_main, args=(receiver, threads), name="radixserve-engine",
            daemon=True)
        self._proc.start()
        receiver.close()  # the child's now: EOF there once this end closes

    def wanted_by(self, args) -> PrestartedEngine | None:
        """After the flags are parsed: self if they serve one local engine with the thread
        count it was started with; else it is ended and None returned (the launcher spawns
        the engine). (An abbreviated flag can get past `may_prestart`: ``--mock`` for
        ``--mock-engine``, ``--thr 4`` for ``--threads 4``.)"""
        if (args.command == "serve" and not args.mock_engine and args.models_dir is None
                and args.data_parallel_size == 1 and args.distributed_executor_backend == "mp"
                and args.threads == self.threads):
            return self
        self.cancel()
        return None

    def take(self, build, input_addr: str, output_addr: str) -> multiprocessing.Process | None:
        """Hand the process ``run_engine_core``'s arguments and return it (the caller owns it
        from now on), or None once it was taken, cancelled, or has died."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        sent = proc.is_alive() and self._send((build, input_addr, output_addr))
        self._sender.close()
        if not sent:  # it died: reaped, and a fresh one is the caller's to start
            proc.kill()
            proc.join()
            return None
        return proc

    def cancel(self) -> None:
        """End the process if it was not taken (at once: until it is, it holds nothing but
        its imports), and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._sender.close()
        proc.terminate()
        proc.join()

    def _send(self, message) -> bool:
        try:
            self._sender.send(message)
            return True
        except (OSError, ValueError):  # the process died, or this end is closed
            return False


def _prestarted_main(receiver: Connection, threads: int | None) -> None:
    """The process: load torch and the engine's modules, wait for the build, then run the
    engine loop (engine/core_proc.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API process decides when we stop
    from radixserve import startup_trace

    startup_trace.begin("engine")
    _load(threads)
    try:
        message = receiver.recv()
    except EOFError:  # the API process is gone
        return
    finally:
        receiver.close()
    from radixserve.engine.core_proc import run_engine_core

    run_engine_core(*message)


def _load(threads: int | None) -> None:
    """What every engine build imports first: torch, once its thread count is exported (as
    `core_proc.build_engine` orders them; the build applies and logs the count), and the
    engine's modules."""
    from radixserve import startup_trace
    from radixserve.cpu.threads import export_engine_threads

    export_engine_threads(threads)
    import torch  # noqa: F401 - loaded now, while the API process starts

    startup_trace.mark("torch imported ahead")
    for module in ("radixserve.config", "radixserve.engine.build"):  # what the build imports
        importlib.import_module(module)
    startup_trace.mark("engine modules imported ahead")
