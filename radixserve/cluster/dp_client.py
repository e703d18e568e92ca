"""DataParallelClient: N engine-core replicas presented to the API process as one client.

It has the interface `AsyncLLM`, the metrics and the routes use of an `EngineCoreClient`
(``add_request``, ``abort``, ``dead``, ``stats``) and sends each request to the replica its
router picks; outputs come back through that replica's own client, so a replica that dies
fails only the requests it held (its client's ``mark_dead``). The server is dead only when
every replica is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from radixserve.frontend.core_client import EngineCoreClient, EngineDeadError
from radixserve.image_stats import IMAGE_FIELDS
from radixserve.kvdisk.stats import KV_DISK_FIELDS
from radixserve.core.reports import SchedulerStats
from radixserve.messages import EngineCoreRequest
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.cluster.routing import NoReplicaError
from radixserve.cluster.runtime_loras import RuntimeLoras


class DataParallelClient:
    def __init__(self, replicas: list[EngineCoreClient], router,
                 loras: RuntimeLoras | None = None) -> None:
        """``loras``: the adapters the replicas should hold, updated by ``lora_call`` (their
        supervisors bring a restarted replica to it)."""
        assert replicas
        self.replicas = replicas
        self.router = router
        self.loras = loras or RuntimeLoras()
        self.loras.on_forgotten.append(self._unload_forgotten)
        self._unloads: set[asyncio.Task] = set()
        # each replica's current process id (ReplicaSet supplies its supervisors')
        self.pids: Callable[[], list[int | None]] = lambda: [None] * len(replicas)

    @property
    def num_in_flight(self) -> int:
        return sum(replica.num_in_flight for replica in self.replicas)

    @property
    def dead(self) -> str | None:
        """None while any replica is up; else why they are down (one replica: its reason)."""
        reasons = [c.dead for c in self.replicas]
        if not all(reasons):
            return None
        if len(reasons) == 1:
            return reasons[0]
        return "; ".join(f"replica {i}: {r}" for i, r in enumerate(reasons))

    @property
    def ready(self):
        return next((c.ready for c in self.replicas if c.ready is not None), None)

    @property
    def stats(self) -> SchedulerStats:
        """The replicas' scheduler stats summed (KV usage: of all their blocks together)."""
        return sum_stats([c.stats for c in self.replicas])

    async def engine_states(self, timeout: float = 5.0) -> list:
        """Each replica's `EngineState` for the engine view (``/v1/engine/state``), asked for
        at once; in place of a state, the exception that replica answered (EngineDeadError
        while it is down, TimeoutError in a long step)."""
        return await asyncio.gather(*(c.engine_state(timeout) for c in self.replicas),
                                    return_exceptions=True)

    async def lora_call(self, name: str, path: str | None):
        """Load (``path``) or unload (None) a LoRA adapter on every live replica; the first
        refusal's `LoraReply` (the replicas load the same files, so they agree), else done,
        and recorded in ``loras``: a replica restarted later is brought to it."""
        if self.dead:
            raise EngineDeadError(self.dead)
        live = [c for c in self.replicas if not c.dead]
        replies = await asyncio.gather(*(c.lora_call(name, path) for c in live))
        refusal = next((r for r in replies if r.error is not None), None)
        if refusal is not None:
            return refusal
        if path is None:
            self.loras.unloaded(name)
        else:
            self.loras.loaded(name, path)
        # NOTE: a replica that came back while we waited started before that record: tell it
        # now (one starting from here on is told by its supervisor)
        late = [c for c in self.replicas if c not in live and not c.dead]
        await asyncio.gather(*(c.lora_call(name, path) for c in late), return_exceptions=True)
        return replies[0]

    def _unload_forgotten(self, name: str) -> None:
        """A restarted replica could not load ``name`` again: the others drop it too, so the
        name is free for a new load. Best effort, awaited by no one: a replica whose requests
        still use it keeps it (its unload is refused), unlisted and unrouted."""
        live = [c for c in self.replicas if not c.dead]
        task = asyncio.ensure_future(asyncio.gather(*(c.lora_call(name, None) for c in live),
                                                    return_exceptions=True))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Reset every live replica's prefix cache at once; True when each did (a replica
        that is down, or dies meanwhile, holds no cache: it counts as done). EngineDeadError
        when every replica is down."""
        if self.dead:
            raise EngineDeadError(self.dead)
        live = [c for c in self.replicas if not c.dead]
        answers = await asyncio.gather(
            *(c.reset_prefix_cache(reset_running_requests) for c in live),
            return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, EngineDeadError):
                raise answer
        return all(a is True or isinstance(a, EngineDeadError) for a in answers)

    def loads(self) -> list[int | None]:
        """Requests in flight at each replica; None for one that is down."""
        return [None if c.dead else len(c.queues) for c in self.replicas]

    async def add_request(self, request: EngineCoreRequest, queue: OutputBuffer) -> int:
        """Route ``request`` to a replica (EngineDeadError when none is up); its index."""
        try:
            i = self.router.choose(request.prompt_token_ids, self.loads())
        except NoReplicaError:
            raise EngineDeadError(self.dead or "every engine replica is down") from None
        await self.replicas[i].add_request(request, queue)
        return i

    async def abort(self, request_ids: list[str]) -> None:
        """Abort each request at the replica holding it (unknown ids are ignored)."""
        for client in self.replicas:
            mine = [rid for rid in request_ids if rid in client.queues]
            if mine:
                await client.abort(mine)

    def load(self) -> dict:
        """``/load``: the summed figures, then one entry per replica."""
        pids = self.pids()
        return {**_load_fields(self.stats, sum(len(c.queues) for c in self.replicas)),
                "data_parallel_size": len(self.replicas),
                "replicas": [{"replica": i, "pid": pids[i], "up": c.dead is None,
                              "num_routed_requests": self.router.num_routed[i],
                              **_load_fields(c.stats, len(c.queues))}
                             for i, c in enumerate(self.replicas)]}


def _load_fields(s: SchedulerStats, num_pending: int) -> dict:
    return {"num_requests_running": s.num_running, "num_requests_waiting": s.num_waiting,
            "kv_cache_usage": s.kv_usage, "num_kv_blocks": s.num_kv_blocks,
            "num_pending_requests": num_pending,
            "prefix_cache_query_tokens": s.prefix_query_tokens,
            "prefix_cache_hit_tokens": s.prefix_hit_tokens}


def sum_stats(all_stats: list[SchedulerStats]) -> SchedulerStats:
    """Counts and counters add up; KV usage is of all the blocks together (a plain mean
    where no replica reports a pool)."""
    if len(all_stats) == 1:
        return all_stats[0]
    blocks = sum(s.num_kv_blocks for s in all_stats)
    usage = (sum(s.kv_usage * s.num_kv_blocks for s in all_stats) / blocks if blocks
             else sum(s.kv_usage for s in all_stats) / len(all_stats))
    return SchedulerStats(
        num_running=sum(s.num_running for s in all_stats),
        num_waiting=sum(s.num_waiting for s in all_stats), kv_usage=usage,
        num_kv_blocks=blocks,
        prefix_query_tokens=sum(s.prefix_query_tokens for s in all_stats),
        prefix_hit_tokens=sum(s.prefix_hit_tokens for s in all_stats),
        num_preemptions=sum(s.num_preemptions for s in all_stats),
        spec_num_drafts=sum(s.spec_num_drafts for s in all_stats),
        spec_draft_tokens=sum(s.spec_draft_tokens for s in all_stats),
        spec_accepted_tokens=sum(s.spec_accepted_tokens for s in all_stats),
        spec_accepted_per_pos=_add_lists([s.spec_accepted_per_pos for s in all_stats]),
        spec_drafted_per_pos=_add_lists([s.spec_drafted_per_pos for s in all_stats]),
        num_kv_events_dropped=sum(s.num_kv_events_dropped for s in all_stats),
        num_kv_event_subscribers_behind=sum(s.num_kv_event_subscribers_behind
                                            for s in all_stats),
        num_kv_event_subscribers_refused=sum(s.num_kv_event_subscribers_refused
                                             for s in all_stats),
        **{f: sum(getattr(s, f) for s in all_stats) for f in KV_DISK_FIELDS + IMAGE_FIELDS})


def _add_lists(lists: list[list[int]]) -> list[int]:
    """Element-wise sums of lists of any lengths."""
    out = [0] * max(map(len, lists), default=0)
    for values in lists:
        for i, v in enumerate(values):
            out[i] += v
    return out
