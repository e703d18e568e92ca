"""Frozen configuration of the engine's options, one dataclass per concern, resolved once at
engine start. Torch-free (both processes import it): names are checked against plain tuples
here, and what they resolve to (torch dtypes, backends) is looked up where it is built. A
model's shape is model_config.py; the scheduler's limits are core/sched_config.py."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field, fields

from radixserve.core.sched_config import SchedulerConfig
from radixserve.cpu.threads import check_threads

DTYPES = ("float32", "bfloat16", "float16")  # model and KV element types (models/loader.py)
# speculative methods (spec/proposer.py) and tensor-parallel all-reduces (parallel/comm.py)
PROPOSERS = ("off", "ngram", "suffix", "auto", "draft", "mtp")
TP_ALL_REDUCES = ("auto", "shm", "torch")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV pool: fixed-size blocks, pool sized from a memory budget (or an explicit count).
    ``kv_cache_memory_gb`` None: a share of the memory available after the weights, divided
    between ``num_local_engines`` (the engines on this machine sizing from the same memory at
    once), engine/kv_budget.py. A hybrid model's recurrent states (runner/recurrent_state.py)
    have a budget of their own, ``state_cache_memory_gb`` (None: sized by the engine,
    engine/build.py)."""

    block_size: int = 16
    kv_cache_memory_gb: float | None = None
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # or "float32", "float16", "bfloat16", "int8" (runner/kv_cache.py)
    state_cache_memory_gb: float | None = None
    num_local_engines: int = 1

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in ("auto", "int8") and self.kv_cache_dtype not in DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; supported: "
                             f"{['auto', *sorted(DTYPES), 'int8']}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_memory_gb is not None and not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.state_cache_memory_gb is not None and self.state_cache_memory_gb <= 0:
            raise ValueError(f"state_cache_memory_gb must be > 0, got "
                             f"{self.state_cache_memory_gb}")
        if self.num_local_engines < 1:
            raise ValueError(f"num_local_engines must be >= 1, got {self.num_local_engines}")


@dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs and in what number format. CPU defaults to float32, CUDA to
    bfloat16 (the torch device and dtype: ``device_and_dtype`` in models/loader.py);
    ``quantization`` ("auto", "none", "int8", "gguf") is resolved against the checkpoint at
    load (models/quantization.py). ``threads``: the engine's CPU threads (torch's pool, which the
    native kernels share); None: the CPUs the process may use (affinity mask and cgroup quota,
    see cpu/threads.py)."""

    device: str = "cpu"
    dtype: str | None = None
    quantization: str = "auto"
    threads: int | None = None

    def __post_init__(self) -> None:
        check_threads(self.threads)


@dataclass(frozen=True)
class StructuredConfig:
    """Structured output: ``fast_forward`` emits the tokens a grammar forces without a forward
    each; a grammar whose compile uses over ``compile_timeout_s`` CPU seconds (or waits 12x
    that on the clock: structured/cpu_budget.py) fails its request."""

    fast_forward: bool = True
    compile_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.compile_timeout_s > 0:
            raise ValueError(f"compile_timeout_s must be > 0, got {self.compile_timeout_s}")


KV_EVENT_PUBLISHERS = ("null", "zmq")
KV_EVENT_WIRE_FORMATS = ("map", "array")


@dataclass(frozen=True)
class KVDiskConfig:
    """The disk tier under the prefix cache (kvdisk/): ``path`` None is off; ``budget_gb``
    None: 10 GiB or a tenth of the disk's free space, whichever is smaller."""

    path: str | None = None
    budget_gb: float | None = None

    def __post_init__(self) -> None:
        if self.budget_gb is not None and not self.budget_gb > 0:
            raise ValueError(f"kv_disk_cache_gb must be > 0, got {self.budget_gb}")


@dataclass(frozen=True)
class KVEventsConfig:
    """KV cache events (engine/kv_events.py), vLLM's ``KVEventsConfig`` field for field:
    ``publisher`` zmq publishes on a PUB socket at ``endpoint`` (bound or connected:
    `kv_event_endpoint_binds`) with ``topic``, and answers replays from the last
    ``buffer_steps`` batches on a ROUTER bound at ``replay_endpoint``; ``hwm`` is the
    batches held for each subscriber (and each replay) that is not reading (more are dropped
    for it and counted; vLLM's 100,000 let a stuck subscriber pin ~330 MB), ``max_queue_size``
    the batches waiting for the publisher thread (more are dropped and counted).
    ``max_subscribers`` (ours): connections served at once on each bound socket, more are
    disconnected. Data-parallel replica ``data_parallel_rank`` adds its rank to both tcp
    ports (inproc: a ``_dp<rank>`` suffix), as vLLM does.
    ``wire_format`` (ours, not vLLM's): each event a field-name map, as vLLM publishes them
    since vllm-project/vllm#42892 (June 2026; vllm-router reads only these), or the
    positional array of vLLM before it (consumers that never learnt the maps).

    Exposure, where we differ from vLLM: vLLM's default ``tcp://*:5557`` binds every
    interface, and neither socket has any authentication (``--api-key`` covers HTTP only),
    so anyone who reaches the port reads every prompt's token ids as they are cached, and the
    replay socket hands out the last ``buffer_steps`` batches on request. Here the default is
    ``tcp://127.0.0.1:5557`` (a bind: a loopback host binds, `kv_event_endpoint_binds`), and
    a socket bound anywhere but loopback, ipc:// or inproc:// (``*``, ``0.0.0.0``, an
    address, a host or interface name) is refused unless ``allow_remote`` (ours) is true:
    the operator then says the network in between is trusted (a private one, or a firewall
    letting only the router in). A PUB connecting out to a named host is not a listener and
    needs no opt-in."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 1_000
    max_queue_size: int = 100_000
    max_subscribers: int = 16
    topic: str = ""
    wire_format: str = "map"
    allow_remote: bool = False
    data_parallel_rank: int = 0

    def __post_init__(self) -> None:
        if self.publisher not in KV_EVENT_PUBLISHERS:
            raise ValueError(f"unknown KV event publisher {self.publisher!r}; supported: "
                             f"{', '.join(KV_EVENT_PUBLISHERS)}")
        if self.wire_format not in KV_EVENT_WIRE_FORMATS:
            raise ValueError(f"unknown KV event wire_format {self.wire_format!r}; supported: "
                             f"{', '.join(KV_EVENT_WIRE_FORMATS)}")
        for name in ("buffer_steps", "hwm", "max_queue_size", "max_subscribers"):
            if getattr(self, name) < 1:
                raise ValueError(f"kv events {name} must be >= 1, got {getattr(self, name)}")
        if self.is_enabled and not self.allow_remote:
            self._refuse_remote_binds()

    def _refuse_remote_binds(self) -> None:
        """ValueError naming the first socket that would listen off this machine."""
        bound = [("endpoint", self.endpoint)] if kv_event_endpoint_binds(self.endpoint) else []
        if self.replay_endpoint is not None:  # the replay socket always binds
            bound.append(("replay_endpoint", self.replay_endpoint))
        for name, endpoint in bound:
            if not is_local_endpoint(endpoint):
                raise ValueError(
                    f"kv events {name} {endpoint} listens beyond this machine: anyone who "
                    "reaches it reads every prompt's token ids (ZMQ has no API key). Bind "
                    "loopback (tcp://127.0.0.1:PORT) and run the subscriber here, or set "
                    '"allow_remote": true in --kv-events-config once the network to the '
                    "subscribers is trusted")

    @property
    def is_enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    @staticmethod
    def parse(text: str | dict | None, data_parallel_rank: int = 0) -> KVEventsConfig:
        """From ``--kv-events-config``'s JSON (or its dict); ValueError naming the unknown
        fields. Like vLLM, only ``enable_kv_cache_events`` turns events on; with it and no
        publisher, the publisher is zmq."""
        data = json.loads(text) if isinstance(text, str) else dict(text or {})
        if not isinstance(data, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(KVEventsConfig)} - {"data_parallel_rank"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown --kv-events-config field(s) {unknown}; supported: "
                             f"{sorted(known)}")
        if data.get("enable_kv_cache_events") and "publisher" not in data:
            data["publisher"] = "zmq"
        return KVEventsConfig(**data, data_parallel_rank=data_parallel_rank)


def kv_event_endpoint_binds(endpoint: str) -> bool:
    """Whether the KV-event PUB socket binds ``endpoint`` (else it connects out to it):
    vLLM's rule, a ``*`` or ``::`` anywhere or ipc:// / inproc://, plus (ours, for the
    default) a loopback host, so ``tcp://127.0.0.1:5557`` listens here where vLLM would
    connect to a broker on this machine."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        return True
    return endpoint.startswith("tcp://") and _is_loopback_host(_tcp_host(endpoint))


def is_local_endpoint(endpoint: str) -> bool:
    """Whether a socket bound at ``endpoint`` is reachable from this machine only: ipc://,
    inproc://, or tcp:// on a loopback host (127.0.0.0/8, ::1, localhost)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    return endpoint.startswith("tcp://") and _is_loopback_host(_tcp_host(endpoint))


def _tcp_host(endpoint: str) -> str:
    """``HOST`` of ``tcp://HOST:PORT`` (brackets of an IPv6 literal removed)."""
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", a name or an interface: not provably loopback
        return False


MAX_SPECULATIVE_TOKENS = 7  # 1 + 7 fed tokens still run as decode rows (attention backends)


DEFAULT_SPECULATIVE = "auto"


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: ``method`` (radixserve/spec/proposer.py: off, ngram, suffix,
    auto) drafts up to ``num_speculative_tokens`` per request and step, verified in the same
    forward; ``adaptive`` sizes each draft from the request's acceptance and the measured step
    cost (spec/policy.py), else every draft is as long as the proposer allows.
    ``draft_model``: the draft model's path (any source the loader takes) for method
    ``draft``, which needs one; the other methods refuse one (see `resolve_method`)."""

    method: str = DEFAULT_SPECULATIVE
    num_speculative_tokens: int = 4
    adaptive: bool = True
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in PROPOSERS:
            raise ValueError(f"unknown speculative method {self.method!r}; supported: "
                             f"{', '.join(PROPOSERS)}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, "
                             f"got {self.num_speculative_tokens}")
        if self.method == "draft" and self.draft_model is None:
            raise ValueError("speculative method 'draft' needs a draft model (--draft-model "
                             "PATH: a .gguf file or a Hugging Face folder)")
        if self.method != "draft" and self.draft_model is not None:
            raise ValueError(f"a draft model is only used by speculative method 'draft', not "
                             f"{self.method!r}")

    @staticmethod
    def resolve_method(method: str | None, draft_model: str | None) -> str:
        """The method when none was chosen (None): ``draft`` with a draft model, else
        ``auto``, the default (measured never to lose more than 3%: docs/speculative-decoding.md); any
        other explicit method with a draft model is refused."""
        if method is None:
            return "draft" if draft_model is not None else DEFAULT_SPECULATIVE
        return method


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallel: ``tensor_parallel_size`` ranks each hold their share of every layer's
    heads and MLP (models/tp_shard.py), their partial outputs summed by ``all_reduce``
    (parallel/comm.py: auto, shm, torch)."""

    tensor_parallel_size: int = 1
    all_reduce: str = "auto"

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got "
                             f"{self.tensor_parallel_size}")
        if self.all_reduce not in TP_ALL_REDUCES:
            raise ValueError(f"unknown tensor-parallel all-reduce {self.all_reduce!r}; "
                             f"supported: {', '.join(TP_ALL_REDUCES)}")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (engine/lora_registry.py): ``adapters`` (name, path) loaded at start;
    ``max_loras`` resident at once (least recently used idle ones evicted beyond it)."""

    adapters: tuple[tuple[str, str], ...] = ()
    max_loras: int = 4

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        names = [name for name, _ in self.adapters]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"LoRA adapter names must be distinct and non-empty: {names}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine core needs; ``model`` is None for the embedded default model."""

    model: str | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    structured: StructuredConfig = field(default_factory=StructuredConfig)
    seed: int = 0
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    kv_disk: KVDiskConfig = field(default_factory=KVDiskConfig)
    # a vision model's image encoder: llama.cpp's mmproj GGUF beside a text GGUF (None: a
    # `*mmproj*.gguf` in the model's folder, or a folder's own vision tower, if any)
    mmproj: str | None = None

    def __post_init__(self) -> None:
        if self.lora.adapters and self.parallel.tensor_parallel_size > 1:
            raise ValueError("LoRA adapters are not supported with --tensor-parallel-size > 1")
        if self.speculative.draft_model is not None and self.parallel.tensor_parallel_size > 1:
            raise ValueError("a draft model (--draft-model) runs on one rank; it is not "
                             "supported with --tensor-parallel-size > 1 (use --speculative "
                             "ngram or suffix)")


def engine_config(model: str | None = None, *, block_size: int = 16,
                  kv_cache_memory_gb: float | None = None, num_kv_blocks: int | None = None,
                  state_cache_memory_gb: float | None = None,
                  enable_prefix_caching: bool = True, max_num_seqs: int = 64,
                  max_num_batched_tokens: int = 2048, max_model_len: int | None = None,
                  scheduling_policy: str = "fcfs", device: str = "cpu", dtype: str | None = None,
                  quantization: str = "auto", threads: int | None = None,
                  kv_cache_dtype: str = "auto", seed: int = 0,
                  structured_fast_forward: bool = True, speculative: str | None = None,
                  num_speculative_tokens: int = 4,
                  speculative_adaptive: bool = True, tensor_parallel_size: int = 1,
                  tp_all_reduce: str = "auto",
                  draft_model: str | None = None,
                  kv_events_config: str | dict | None = None,
                  data_parallel_rank: int = 0,
                  lora_modules: dict[str, str] | None = None,
                  max_loras: int = 4, num_local_engines: int = 1,
                  kv_disk_cache: str | None = None,
                  kv_disk_cache_gb: float | None = None,
                  mmproj: str | None = None) -> EngineConfig:
    """The EngineConfig for the flat engine options the CLI and ``LLM(...)`` take."""
    return EngineConfig(
        model=model,
        cache=CacheConfig(block_size, kv_cache_memory_gb, num_kv_blocks, enable_prefix_caching,
                          kv_cache_dtype, state_cache_memory_gb, num_local_engines),
        scheduler=SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len,
                                  scheduling_policy),
        device=DeviceConfig(device, dtype, quantization, threads),
        structured=StructuredConfig(fast_forward=structured_fast_forward), seed=seed,
        speculative=SpeculativeConfig(SpeculativeConfig.resolve_method(speculative, draft_model),
                                      num_speculative_tokens, speculative_adaptive,
                                      draft_model),
        parallel=ParallelConfig(tensor_parallel_size, tp_all_reduce),
        kv_events=KVEventsConfig.parse(kv_events_config, data_parallel_rank),
        lora=LoraConfig(tuple((lora_modules or {}).items()), max_loras),
        kv_disk=KVDiskConfig(kv_disk_cache, kv_disk_cache_gb), mmproj=mmproj)
