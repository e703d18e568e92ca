"""Which replica serves a request: ``--dp-routing cache_aware | round_robin | least_load``.

Every policy gets the replicas' loads (requests the API process has in flight at each, None
for one that is down and may not be chosen) and returns an index; `NoReplicaError` when all
are down.

cache_aware (the default):
    1. eligible = replicas up whose load ≤ min(load) + balance_threshold
       (a replica more than the threshold busier than the least busy loses the request)
    2. a replica's prefix match (blocks in its `PrefixIndex`) counts only if it covers at least
       ``cache_threshold`` of the prompt's full blocks: a short preamble every prompt shares
       (a chat template's default system prompt) must not pull every request to one replica
    3. among them the longest counted match, then the lowest load, then the smallest index
       (the most room left in its cache), then the lowest index number
    4. the prompt's blocks are recorded in the chosen replica's index
A request with no counted match anywhere therefore goes to the least busy replica, and between
idle ones to the one holding the least: new prefixes spread over the replicas even when
requests come one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.cluster.prefix_index import PrefixIndex, block_hashes

ROUTING_POLICIES = ("cache_aware", "round_robin", "least_load")

_NO_KV_POOL_CAPACITY = 1 << 16  # index blocks for a replica that reports no KV pool (mock)


class NoReplicaError(RuntimeError):
    """Every replica is down."""


@dataclass(frozen=True)
class RoutingConfig:
    policy: str = "cache_aware"
    balance_threshold: int = 16  # in-flight requests
    cache_threshold: float = 0.5  # the fraction of a prompt's blocks a match must cover

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"the cache threshold must be within [0, 1], got "
                             f"{self.cache_threshold}")
        if self.policy not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; supported: "
                             f"{', '.join(ROUTING_POLICIES)}")
        if self.balance_threshold < 0:
            raise ValueError(f"the balance threshold must be >= 0, got "
                             f"{self.balance_threshold}")


def _up(loads: list[int | None]) -> list[int]:
    up = [i for i, load in enumerate(loads) if load is not None]
    if not up:
        raise NoReplicaError("every engine replica is down")
    return up


class LeastLoadRouter:
    """The replica with the fewest requests in flight (ties: the lowest index)."""

    def __init__(self, num_replicas: int) -> None:
        self.num_routed = [0] * num_replicas  # requests sent to each

    def choose(self, prompt_ids: list[int], loads: list[int | None]) -> int:
        i = min(_up(loads), key=lambda r: (loads[r], r))
        self.num_routed[i] += 1
        return i

    def forget(self, replica: int) -> None:
        """Replica ``replica`` lost its cache (it died)."""


class RoundRobinRouter(LeastLoadRouter):
    """Each replica in turn, skipping those that are down."""

    def __init__(self, num_replicas: int) -> None:
        super().__init__(num_replicas)
        self._next = 0

    def choose(self, prompt_ids: list[int], loads: list[int | None]) -> int:
        _up(loads)
        n = len(loads)
        while loads[self._next % n] is None:
            self._next += 1
        i = self._next % n
        self._next += 1
        self.num_routed[i] += 1
        return i


class CacheAwareRouter(LeastLoadRouter):
    """Longest recorded prefix match among the replicas not too busy (see the module
    docstring). ``capacities``: each replica's index size in blocks (its KV blocks)."""

    def __init__(self, block_size: int, capacities: list[int], balance_threshold: int,
                 cache_threshold: float = 0.5) -> None:
        super().__init__(len(capacities))
        self.block_size = block_size
        self.balance_threshold = balance_threshold
        self.cache_threshold = cache_threshold
        self.indexes = [PrefixIndex(c if c > 0 else _NO_KV_POOL_CAPACITY) for c in capacities]
        self.num_matched_tokens = 0  # prompt tokens routed onto a recorded prefix

    def choose(self, prompt_ids: list[int], loads: list[int | None]) -> int:
        up = _up(loads)
        least = min(loads[r] for r in up)
        eligible = [r for r in up if loads[r] <= least + self.balance_threshold]
        hashes = block_hashes(prompt_ids, self.block_size,
                              max(index.capacity for index in self.indexes))
        matches = {r: self.indexes[r].match(hashes) for r in eligible}
        for r, n in matches.items():
            if n < self.cache_threshold * len(hashes):
                matches[r] = 0
        i = min(eligible, key=lambda r: (-matches[r], loads[r], len(self.indexes[r]), r))
        self.indexes[i].insert(hashes[:self.indexes[i].capacity])
        self.num_matched_tokens += matches[i] * self.block_size
        self.num_routed[i] += 1
        return i

    def forget(self, replica: int) -> None:
        self.indexes[replica].clear()


def make_router(config: RoutingConfig, block_size: int, capacities: list[int]):
    """The router ``config.policy`` names, for replicas with these KV block counts."""
    if config.policy == "cache_aware":
        return CacheAwareRouter(block_size, capacities, config.balance_threshold,
                                config.cache_threshold)
    if config.policy == "round_robin":
        return RoundRobinRouter(len(capacities))
    return LeastLoadRouter(len(capacities))
