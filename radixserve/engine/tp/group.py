"""This process's place in a tensor-parallel engine, as engine/build.py sees it.

    SingleRank               one rank (no tensor parallel): the whole model, the runner as is
    TensorParallelGroup      rank r of N: its `TensorShard`, its comm (parallel/); rank 0
                             wraps its runner to broadcast each step and owns the other ranks'
                             processes; rank r > 0 serves the steps rank 0 sends

Rank 0 is the engine-core process (the scheduler runs there only); ranks.py starts the
others (worker.py). Ranks die together: rank 0 notices a lost rank at its next step
(`RankLost`, which ends the engine process, and the API process starts a new engine), the other
ranks die with rank 0 (``PR_SET_PDEATHSIG``) or notice it gone while waiting.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from radixserve.cpu.split import pin_process
from radixserve.engine.tp.runner import STOP, TensorParallelRunner, serve_steps
from radixserve.models.tp_shard import TensorShard
from radixserve.parallel.shm_comm import RankLost

_READY_POLL_S = 0.02


class SingleRank:
    """No tensor parallel (the null object `start_tensor_parallel` returns for one rank)."""

    shard = TensorShard()

    def rank_threads(self, requested: int | None) -> int | None:
        return requested

    def runner(self, runner):
        return runner

    def close(self) -> None:
        pass


@dataclass
class TensorParallelGroup:
    """Rank ``rank`` of ``world``, joined (process group and comm). ``store``: the TCPStore of
    the start-up handshake; rank 0 holds the other ranks' processes (``procs``) and unlinks the
    shared-memory file ``shm_path`` once every rank is ready."""

    rank: int
    world: int
    comm: object
    store: object
    threads: int
    procs: list = field(default_factory=list)
    parent_pid: int = 0  # ranks > 0: rank 0's process (their parent)
    prior_cpus: list[int] | None = None  # rank 0: its CPUs before it pinned itself
    shm_path: str | None = None
    _closed: bool = False

    @property
    def shard(self) -> TensorShard:
        return TensorShard(self.rank, self.world, self.comm)

    def rank_threads(self, requested: int | None) -> int:
        """This rank's threads (its share of the CPUs, or ``--threads`` per rank)."""
        return self.threads

    def alive(self) -> bool:
        """False once another rank is known to be gone."""
        if self.rank == 0:
            return all(p.poll() is None for p in self.procs)
        return os.getppid() == self.parent_pid

    def runner(self, runner) -> TensorParallelRunner:
        """Rank 0: wait until every rank has built its shard, then the broadcasting runner."""
        assert self.rank == 0, "ranks > 0 serve rank 0's steps"
        self._wait_ready()
        if self.shm_path is not None:  # every rank has it mapped: nothing is left on a crash
            os.unlink(self.shm_path)
            self.shm_path = None
        return TensorParallelRunner(runner, self)

    def serve(self, runner) -> None:
        """Rank r > 0: report ready, then run rank 0's steps on ``runner`` until it sends the
        stop message."""
        self.store.set(f"ready/{self.rank}", "ok")
        serve_steps(runner, self.comm)

    def _wait_ready(self) -> None:
        pending = list(range(1, self.world))
        while pending:
            for r in list(pending):
                if self.store.check([f"ready/{r}"]):
                    status = self.store.get(f"ready/{r}").decode()
                    if status != "ok":
                        raise RuntimeError(f"tensor-parallel rank {r} failed to start: {status}")
                    pending.remove(r)
            for r, proc in enumerate(self.procs, start=1):
                if r in pending and proc.poll() is not None:
                    raise RuntimeError(f"tensor-parallel rank {r} exited with code "
                                       f"{proc.returncode} while starting")
            if pending:
                time.sleep(_READY_POLL_S)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the ranks and leave the process group (rank 0: the others are told to stop,
        waited for, killed if they do not exit in time). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.rank == 0 and self.procs:
            if self.alive():
                try:
                    self.comm.send_step(STOP)
                except RankLost:
                    pass
            deadline = time.monotonic() + timeout
            for proc in self.procs:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: kill it
                    proc.kill()
                    proc.wait()
        self.comm.close()
        if self.shm_path is not None:
            os.unlink(self.shm_path)
            self.shm_path = None
        _leave_process_group()
        if self.prior_cpus is not None:  # an offline LLM's process goes on after it
            pin_process(self.prior_cpus)


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
