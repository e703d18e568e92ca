"""Plain data passed from the scheduler to the model runner and back."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from radixserve.core.kv.recurrent_states import SeqState
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence's share of a step: feed ``token_ids`` at positions ``start_pos...``.

    ``block_ids`` is the sequence's whole block table (read-only for the runner), of the
    first KV group; ``window_block_ids`` the other groups' (core/kv/kv_groups.py). When
    ``sample`` is set, the last fed position produces the next token; the sampling fields
    are then filled (references to the request's lists: the runner only reads them).
    ``num_draft``: the last ``num_draft`` fed tokens are a speculative draft (not yet in the
    request's tokens); the runner then produces a token at each of the last ``num_draft + 1``
    positions and keeps the verified ones (runner/spec_verify.py).
    ``draft_work``: with a draft model (``--speculative draft``), what it runs for this
    sampling sequence once the step's tokens are known (see `DraftWork`); ``mtp``: with
    ``--speculative mtp``, what the model's MTP block runs (see `MtpWork`).
    ``prompt_logprobs``: on a prompt chunk of a request that asked for prompt logprobs, which
    of its rows score which prompt tokens (core/prompt_logprobs.py).
    ``pooling`` is set on every chunk of an embedding request (which never samples): mean
    pooling returns each chunk's sum of hidden states, last pooling the last prompt token's
    hidden state on the chunk that ends the prompt (``is_last_chunk``).
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool
    sampling_params: SamplingParams | None = None
    seed: int = 0
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    stop_token_ids: frozenset[int] = frozenset()
    num_draft: int = 0
    window_block_ids: list[list[int]] = field(default_factory=list)

    @property
    def draft_token_ids(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_draft:] if self.num_draft else []
    pooling: PoolingParams | None = None
    is_last_chunk: bool = False
    prompt_logprobs: PromptLogprobsWork | None = None
    draft_work: DraftWork | None = None  # the draft model proposes after this step
    mtp: MtpWork | None = None  # the model's MTP block runs on this step's positions
    lora_id: int | None = None  # the request's LoRA adapter (the runner groups rows by it)
    state: SeqState | None = None  # a hybrid model's recurrent state (core/kv/recurrent_states)
    # the request's images with rows in this chunk (messages.ImageInput; core/images.py): the
    # runner splices their encoder output over those rows
    images: list[Any] = field(default_factory=list)
    # an mRoPE model's (Qwen VL) rope position of the token at ``start_pos`` less
    # ``start_pos``, unless inside an image (core/images.py `rope_shift`); 0 otherwise
    rope_shift: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(slots=True)
class PromptLogprobsWork:
    """Prompt logprobs a chunk computes: its rows ``first_row ..`` score ``targets`` (the
    prompt tokens that follow those positions), each with its ``num_top`` best alternatives."""

    num_top: int
    first_row: int
    targets: list[int]


@dataclass(slots=True)
class DraftWork:
    """The draft model's share of a step for one sampling sequence, run after the target's
    tokens are sampled (runner/draft_runner.py). Positions of the request's tokens, with ``N``
    their number once this step's emitted tokens are appended::

        [ confirmed KV | spec KV (still valid where it matches) | catch-up | proposed ]
        0       num_confirmed    + len(spec_token_ids)                N      N + num_propose - 1

    The draft pool's KV is valid for the first ``num_confirmed`` tokens, and beyond them holds
    the KV of ``spec_token_ids`` (the last proposal but its final token), which stays valid as
    far as those tokens match what the request now has. The draft feeds the rest up to ``N``
    (catch-up), then proposes ``num_propose`` greedy tokens, writing the KV of all but the last.
    ``block_ids``: its block table in the draft pool, already long enough for all of that."""

    block_ids: list[int]
    num_confirmed: int
    spec_token_ids: list[int]
    num_propose: int


@dataclass(slots=True)
class MtpWork:
    """The MTP block's share of a step for one sequence (runner/mtp_runner.py), run after the
    target's tokens are known. The block writes its KV at every position the step fed and kept
    (rejected draft positions excepted), each from the target's hidden state there and the
    token that follows it: the next fed one; after the last, ``next_token_id`` for a prompt
    chunk that does not end the prompt, else the token this step emitted. Then, for a sampling
    sequence, it proposes ``num_propose`` greedy tokens (0: none), its own hidden state fed
    back after the first."""

    next_token_id: int | None
    num_propose: int


@dataclass(slots=True)
class Proposal:
    """A drafter's proposal for the next step: ``token_ids`` follow the request's first
    ``num_confirmed`` tokens (a draft model's KV of them is now valid, see `DraftWork`)."""

    token_ids: list[int]
    num_confirmed: int


@dataclass(slots=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    num_batched_tokens: int
    preempted_ids: list[str]

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(slots=True)
class ModelRunnerOutput:
    """Results for the sequences with ``sample`` set, in the order they appear in the batch.

    ``logprobs[i]`` is the sampled token's logprob and ``top_logprobs[i]`` a list of
    (token_id, logprob) pairs; both are None for rows that did not ask for logprobs.
    ``drafts``: for the sequences that fed a draft, what verification kept after the first
    token (``token_ids[i]``).
    ``proposals``: the draft model's proposals for the next step, by request;
    ``draft_seconds`` the time it took (``num_draft_forwards`` forwards of the draft model)
    and ``draft_forward_s`` the mean time of its decode-like forwards (0: none ran).
    ``pooled`` maps each embedding request of the step that pooled something to its vector
    (float32 values: a chunk's hidden-state sum for mean pooling, the last hidden state for
    last pooling; see `ScheduledSeq`).
    ``prompt_logprobs`` maps each request whose chunk scored prompt tokens to (their logprobs,
    their top alternatives), in prompt order (see `PromptLogprobsWork`).
    """

    request_ids: list[str]
    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]
    drafts: dict[str, DraftResult] | None = None
    pooled: dict[str, list[float]] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[list[float], list[list[tuple[int, float]]]]] = field(
        default_factory=dict)
    proposals: dict[str, Proposal] = field(default_factory=dict)
    draft_seconds: float = 0.0
    num_draft_forwards: int = 0
    draft_forward_s: float = 0.0


@dataclass(slots=True)
class DraftResult:
    """A verified draft of ``num_drafted`` tokens: the accepted ones matched the target, and
    the tokens emitted after the first are ``token_ids`` (all accepted drafts but the first,
    then the correction or bonus token), with their logprobs as in ModelRunnerOutput."""

    num_drafted: int
    num_accepted: int
    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


@dataclass(slots=True)
class GrammarBitmask:
    """The allowed-token bitmask of the step's constrained rows: row i of ``bitmask`` (an int32
    tensor ``[len(request_ids), ceil(vocab / 32)]``, a Future while it is being filled) belongs
    to ``request_ids[i]``; other sampling rows are unconstrained. A request with a draft of k
    tokens has k + 1 rows in a row, one per verified position (after 0..k draft tokens)."""

    request_ids: list[str]
    bitmask: Future
