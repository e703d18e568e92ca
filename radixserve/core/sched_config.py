"""The scheduler's limits (core/scheduler.py): a frozen part of the engine's configuration
(``EngineConfig.scheduler``, radixserve/config.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step limits: running requests, and the token budget shared by decodes and chunks."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    policy: str = "fcfs"  # or "lpm": longest prefix match first (cache-aware)
    # False: a waiting prompt is scheduled whole or waits (a cross-encoder's pairs: one
    # bidirectional forward each); max_num_batched_tokens must then hold max_model_len
    chunked_prefill: bool = True
    # the model attends bidirectionally within an image (Gemma 3): a chunk never ends inside
    # one (core/images.py `fit_chunk`)
    whole_images: bool = False

    def __post_init__(self) -> None:
        if self.policy not in ("fcfs", "lpm"):
            raise ValueError(f"unknown scheduling policy {self.policy!r}; supported: fcfs, lpm")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")

