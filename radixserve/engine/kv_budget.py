"""The paged KV pool's memory budget, from which engine/build.py sizes the pool.

Given: ``--kv-cache-memory-gb`` (``LLM(kv_cache_memory_gb=...)``), else the environment's
``RADIXSERVE_KV_CACHE_MEMORY_GB`` (as vLLM CPU's ``VLLM_CPU_KVCACHE_SPACE``: a fixed space for
every engine this environment starts; the test suite sets it). By default, a share of the
memory available after the weights are loaded:

    share   = KV_SHARE x available / engines        (engines: this machine's engines that
                                                     size from the same memory at once)
    useful  = bytes a token x max_num_seqs x max_model_len
    budget  = min(share, useful), raised to min(1 GiB, useful) (the old fixed default) where
              1 GiB is at most half of available / engines

Why 40% where vLLM takes 0.9 of a GPU: a GPU runs nothing else, a CPU engine shares the
machine's memory with the user's editor, browser and builds, which keep growing after the
engine starts, and with the API process, each step's activations and (hybrid models) the
recurrent states (their own 10%, engine/build.py ``STATE_SHARE``). 40% plus those 10% leave
half of what was available to everything else, so the machine does not swap when the rest
grows by as much as the engine takes. The pool is allocated untouched (runner/kv_cache.py
`allocate_kv_cache`): its pages become resident only as the prefix cache fills, so the
budget bounds how far the engine's memory grows rather than what it takes at start.

Torch-free: plain arithmetic on byte counts (tests feed it a made-up ``mem_available``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30
KV_SHARE = 0.40  # of the memory available after the weights, per engine
FLOOR_BYTES = GIB  # the old fixed default: kept when at most half of what is available
ENV = "RADIXSERVE_KV_CACHE_MEMORY_GB"


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The bytes the pool may take and why: ``source`` ends the start-up line
    ("--kv-cache-memory-gb", or "40% of the 20.0 GiB available after the weights ...");
    ``available`` is None for a given budget."""

    num_bytes: int
    source: str
    available: int | None = None


def given_budget(asked_gb: float | None) -> KVBudget | None:
    """The budget fixed by the flag (``asked_gb``) or else by ``RADIXSERVE_KV_CACHE_MEMORY_GB``;
    None: size it from the machine (`auto_budget`). ValueError for a malformed or
    non-positive environment value (the flag is checked where it is parsed)."""
    if asked_gb is not None:
        return KVBudget(int(asked_gb * GIB), "--kv-cache-memory-gb")
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        gb = float(text)
    except ValueError:
        gb = 0.0
    if not gb > 0:
        raise ValueError(f"{ENV}={text!r}: expected a number of GiB > 0")
    return KVBudget(int(gb * GIB), ENV)


def auto_budget(available: int, bytes_per_token: float, max_tokens: int,
                num_engines: int = 1) -> KVBudget:
    """The default budget: `KV_SHARE` of ``available`` (bytes, after the weights) divided
    between ``num_engines``, at most what ``max_tokens`` (max_num_seqs x max_model_len) take
    at ``bytes_per_token``, at least the 1 GiB floor where the machine has it (see the module
    docstring). Pure: the caller reads the memory."""
    assert num_engines >= 1 and bytes_per_token > 0 and max_tokens >= 1
    per_engine = max(available, 0) / num_engines
    useful = bytes_per_token * max_tokens
    budget = KV_SHARE * per_engine
    why = f"{KV_SHARE:.0%} of the {_gib(available)} available after the weights"
    if num_engines > 1:
        why += f", shared by {num_engines} engines"
    if budget > useful:
        budget = useful
        why += f"; held to the {max_tokens} tokens --max-num-seqs x max_model_len can use"
    floor = min(FLOOR_BYTES, useful)
    if budget < floor <= per_engine / 2:
        budget = floor
        why += f"; raised to the {_gib(floor)} floor"
    return KVBudget(int(budget), why, available)


def estimate_bytes(asked_gb: float | None) -> int:
    """What a model's pool is counted as before its load (``--models-dir`` admission,
    frontend/models_dir/memory.py): the given budget, else the 1 GiB floor (the default
    adapts to the memory left, and its pages are touched only as it fills)."""
    given = given_budget(asked_gb)
    return given.num_bytes if given is not None else FLOOR_BYTES


def num_local_engines(data_parallel_size: int = 1, loaded_models: int = 1,
                      is_remote: bool = False) -> int:
    """The engines started on this machine that each size their pool from the same free
    memory: one per data-parallel replica, for each model ``--models-dir`` may hold at once
    (``loaded_models``); 1 for replicas on Ray's other machines (``is_remote``)."""
    return 1 if is_remote else max(1, data_parallel_size) * max(1, loaded_models)


def estimated_weight_bytes(kind: str, path: str, is_widened: bool = False) -> int:
    """The weights' memory once loaded, from their files (nothing read): a GGUF file, or a
    Hugging Face folder's ``*.safetensors``, as stored (GGUF blocks and 16-bit-stored loads
    hold about the file), twice that for a 16-bit folder widened to float32
    (``is_widened``). An estimate (an int8 requantization holds less), for the sizing done
    before a load: ``radixserve env`` and tensor-parallel ranks."""
    if kind == "gguf":
        total = os.path.getsize(path)
    else:
        total = sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path)
                    if name.endswith(".safetensors"))
    return 2 * total if is_widened else total


def startup_line(num_blocks: int, num_tokens: int, num_bytes: int, budget: KVBudget) -> str:
    """The INFO line the engine logs (and ``radixserve env`` prints) for its pool."""
    return (f"KV pool: {num_blocks} blocks, {num_tokens} tokens, {_gib(num_bytes)} "
            f"({budget.source}); allocated untouched, resident only as blocks fill")


def short_of_one_request(budget: KVBudget, bytes_per_token: float, max_len: int) -> str | None:
    """A WARNING's text when ``budget`` cannot hold one ``max_len``-token request (the context
    is then cut to what it holds), else None."""
    held = int(budget.num_bytes // bytes_per_token)
    if held >= max_len:
        return None
    return (f"KV pool: {_gib(budget.num_bytes)} ({budget.source}) holds {held} tokens, fewer "
            f"than one {max_len}-token request: the context is cut to fit; free memory, or "
            "pass --kv-cache-memory-gb / --max-model-len")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"
