"""A tensor-parallel rank > 0 (``python -m`` this module, started by ranks.py): its
`RankSpec` on stdin; it builds its runner only (engine/build.py) and serves rank 0's steps."""

from __future__ import annotations

import ctypes
import logging
import pickle
import signal
import sys

from radixserve.cpu.split import pin_process
from radixserve.cpu.threads import apply_engine_threads
from radixserve.engine.tp.ranks import PG_TIMEOUT, RankSpec, join

_PR_SET_PDEATHSIG = 1


def run_tp_rank(spec: RankSpec) -> None:
    """A rank > 0: die with rank 0, pin to its CPUs, join, build its runner, report ready
    (or the error) in the store and serve steps until rank 0 says stop."""
    _die_with_parent()
    pin_process(list(spec.cpus))
    apply_engine_threads(spec.threads)
    from torch.distributed import TCPStore

    store = TCPStore(spec.store_host, spec.store_port, spec.world, is_master=False,
                     timeout=PG_TIMEOUT)
    try:
        group = join(spec, store)
        # here, not at the top: loading the model code takes seconds (and is reported)
        from radixserve.engine.build import build_rank_runner

        runner = build_rank_runner(spec.config, spec.source, group)
    except Exception as exc:
        store.set(f"ready/{spec.rank}", f"{type(exc).__name__}: {exc}")
        raise
    try:
        group.serve(runner)
    finally:
        group.close()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (rank 0) dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _main() -> None:
    spec = pickle.loads(sys.stdin.buffer.read())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides when the ranks stop
    logging.basicConfig(level=logging.WARNING,
                        format=f"radixserve tp rank {spec.rank} %(levelname)s: %(message)s")
    run_tp_rank(spec)


if __name__ == "__main__":
    _main()
