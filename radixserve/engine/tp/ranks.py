"""Starting a tensor-parallel engine's ranks on this machine.

    engine-core process (rank 0)                     ranks 1..N-1 (python -m tp/worker.py)
    start_tensor_parallel():
      split the CPUs (cpu_split), pin itself
      host a TCPStore, create the shm segment
      start_tp_ranks() ──── a RankSpec on stdin ───▶ run_tp_rank(): die with rank 0, pin,
      join the process group (gloo) ◀──────────────▶   threads, join the process group,
      build the engine (build_engine_core)             build its runner (build_rank_runner)
      wait for every "ready/r" in the store ◀───────   set "ready/r", serve_steps() until stop

`start_tp_ranks` (processes) and `run_tp_rank` (what each rank > 0 runs) are the two pieces a
Ray executor would replace and reuse: an actor per rank calling `run_tp_rank` with its spec
(with ``all_reduce="torch"`` where ranks are on different machines: shm needs one).
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta

from radixserve.config import EngineConfig
from radixserve.cpu.split import affinity_list, pin_process, replica_threads, split_cpus
from radixserve.parallel.shm_comm import ShmComm
from radixserve.parallel.comm import TorchComm, describe_all_reduce, resolve_all_reduce
from radixserve.engine.tp.group import SingleRank, TensorParallelGroup
from radixserve.models.tp_shard import check_tp_size
from radixserve.models.source import ModelSource

logger = logging.getLogger(__name__)

PG_TIMEOUT = timedelta(days=7)  # an idle engine's ranks wait for the next step this long
_MESSAGE_BYTES_MIN = 1 << 20
_WORKER = "radixserve.engine.tp.worker"  # what ranks > 0 run (python -m)


@dataclass(frozen=True)
class RankSpec:
    """What rank ``rank`` needs to join: the engine's config and model, the store rank 0
    hosts, the all-reduce (``shm_path``: the segment of "shm"), its CPUs and threads."""

    config: EngineConfig
    source: ModelSource
    rank: int
    world: int
    store_host: str
    store_port: int
    all_reduce: str
    shm_path: str | None
    slot_elems: int
    message_bytes: int
    cpus: tuple[int, ...]
    threads: int


def start_tensor_parallel(config: EngineConfig, source: ModelSource, model_config,
                          reader=None) -> SingleRank | TensorParallelGroup:
    """In the engine-core process: `SingleRank` for one rank, else start ranks 1..N-1 (they
    load their shards meanwhile) and join as rank 0. ValueError for a size the model does not
    split into (naming the valid ones) or a device other than the CPU."""
    world = config.parallel.tensor_parallel_size
    if world == 1:
        return SingleRank()
    if model_config.linear_attn is not None:
        raise ValueError(f"tensor parallel does not split {model_config.architecture}'s "
                         "recurrent (Gated DeltaNet) layers yet; run it on one rank")
    check_tp_size(model_config, world, reader)
    if config.device.device != "cpu":
        raise ValueError(f"tensor parallel runs on CPU ranks here, not {config.device.device!r}")
    all_reduce = resolve_all_reduce(config.parallel.all_reduce)
    runs = rank_cpus(affinity_list(), world)
    # --threads (or a data-parallel replica's share) is the engine's: split between the ranks
    total = config.device.threads
    per_rank = None if total is None else max(1, total // world)
    threads = [replica_threads(world, run, per_rank) for run in runs]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                     timeout=PG_TIMEOUT)
    slot_elems = config.scheduler.max_num_batched_tokens * model_config.hidden_size
    message_bytes = _message_bytes(config, model_config)
    shm_path = (ShmComm.create("/dev/shm" if os.path.isdir("/dev/shm") else None, world,
                               slot_elems, message_bytes) if all_reduce == "shm" else None)
    specs = [RankSpec(config, source, r, world, "127.0.0.1", store.port, all_reduce, shm_path,
                      slot_elems, message_bytes, tuple(runs[r]), threads[r])
             for r in range(world)]
    procs = start_tp_ranks(specs[1:])
    prior = affinity_list()
    try:
        pin_process(runs[0])
        group = join(specs[0], store, procs)
        group.prior_cpus = prior
    except BaseException:
        for proc in procs:
            proc.kill()
        if shm_path is not None:
            os.unlink(shm_path)
        pin_process(prior)
        raise
    atexit.register(group.close)  # an engine never closed still stops its ranks at exit
    logger.info("tensor parallel: %d ranks (CPUs %s, %s threads), all-reduce %s; native "
                "decoder layers run as two calls each, an all-reduce after each", world,
                " | ".join(",".join(map(str, run)) for run in runs),
                "/".join(map(str, threads)), describe_all_reduce(all_reduce))
    return group


def rank_cpus(cpus: list[int], world: int) -> list[list[int]]:
    """Each rank's CPUs: contiguous runs of this process's (``cpu_split``); with fewer CPUs
    than ranks they share them round-robin, with a WARNING (correct, but the ranks wait on
    each other's time slices)."""
    if world <= len(cpus):
        return split_cpus(cpus, world)
    logger.warning("tensor parallel: %d ranks on %d CPU(s) share them (slower; ranks times "
                   "data-parallel replicas should not exceed the CPUs)", world, len(cpus))
    return [[cpus[r % len(cpus)]] for r in range(world)]


def start_tp_ranks(specs: list[RankSpec]) -> list[subprocess.Popen]:
    """One process per spec (ranks > 0), each running `run_tp_rank`; they inherit stderr."""
    procs = []
    for spec in specs:
        env = {**os.environ, "OMP_NUM_THREADS": str(spec.threads)}
        proc = subprocess.Popen([sys.executable, "-m", _WORKER], stdin=subprocess.PIPE,
                                env=env)
        proc.stdin.write(pickle.dumps(spec))
        proc.stdin.close()
        procs.append(proc)
    return procs


def join(spec: RankSpec, store, procs: list | None = None) -> TensorParallelGroup:
    """Join the process group and map the comm as ``spec.rank`` (``procs``: rank 0's view
    of the others)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=spec.world,
                            timeout=PG_TIMEOUT)
    group = TensorParallelGroup(spec.rank, spec.world, None, store, spec.threads,
                                procs=procs or [], parent_pid=os.getppid(),
                                shm_path=spec.shm_path)
    if spec.all_reduce == "shm":
        group.comm = ShmComm(spec.shm_path, spec.rank, spec.world, spec.slot_elems,
                             spec.message_bytes, group.alive)
    else:
        group.comm = TorchComm(spec.rank, spec.world)
    if spec.rank > 0:
        group.shm_path = None  # rank 0 unlinks it
    return group


def _message_bytes(config: EngineConfig, model_config) -> int:
    """A bound on one step message: every fed token, and every running seq's fields and
    whole block table."""
    max_len = config.scheduler.max_model_len or model_config.max_position_embeddings
    blocks = -(-max_len // config.cache.block_size) + 1
    words = 1 + config.scheduler.max_num_batched_tokens + config.scheduler.max_num_seqs * (
        5 + blocks)
    return max(_MESSAGE_BYTES_MIN, 8 * words)

