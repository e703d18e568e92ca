"""ModelRunner: SchedulerOutput (plain data) → one batched forward → sampled tokens.

Input tensors are built once per step; the packed batch puts decode-like sequences first (one
new token, or a short chunk the backend runs as decode rows), then prefill chunks, with no
padding. Logits are computed only at positions that
sample. The runner reads the scheduled data and never mutates requests.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch

from radixserve.model_config import ModelConfig
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.images import NO_IMAGES
from radixserve.core.sched_output import (
    GrammarBitmask,
    ModelRunnerOutput,
    ScheduledSeq,
    SchedulerOutput,
)
from radixserve.layers.attn_backends import get_attn_backend, resolve_attn_backend
from radixserve.models.native_stack import plan_kernels
from radixserve.runner.draft_runner import NO_DRAFT_RUNNER, TargetStep
from radixserve.layers.forward_context import ForwardContext, forward_context
from radixserve.runner.kv_cache import (NATIVE_MAX_HEAD_DIM, allocate_kv_cache,
                                         torch_for_wide_heads)
from radixserve.runner.lora_set import NO_LORAS, LoraSet
from radixserve.runner.pooler import pool_hidden
from radixserve.runner.recurrent_state import StateTensors
from radixserve.runner.prompt_logprobs import prompt_logprobs
from radixserve.runner.sampler import Sampler, SamplingBatch
from radixserve.runner.spec_verify import verify_drafts


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: ModelConfig, num_blocks: int,
                 block_size: int, device: torch.device, dtype: torch.dtype,
                 attn_backend: str = "auto", kv_dtype: torch.dtype | None = None,
                 groups: KVGroups | None = None, num_state_slots: int = 0) -> None:
        """``kv_dtype``: the KV pool's elements (default ``dtype``); another one than the
        model's needs the cpu_native backend (ValueError otherwise). ``groups``: the KV
        groups the scheduler's tables follow (default one over every attention layer): each
        layer reads the table of its group and unit column (core/kv/kv_groups.py).
        ``num_state_slots``: a hybrid model's recurrent-state slots (the scheduler's state
        pool; runner/recurrent_state.py)."""
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = device
        kv_dtype = dtype if kv_dtype is None else kv_dtype
        self.backend_name = resolve_attn_backend(attn_backend, device, dtype, kv_dtype)
        if self.backend_name == "cpu_native" and config.widest_head_dim > NATIVE_MAX_HEAD_DIM:
            self.backend_name = torch_for_wide_heads(config, attn_backend)
        if kv_dtype != dtype and self.backend_name != "cpu_native":
            raise ValueError(f"a {str(kv_dtype).removeprefix('torch.')} KV cache for a "
                             f"{str(dtype).removeprefix('torch.')} model needs the native CPU "
                             "attention (a float32 model on CPU with the native kernels)")
        kv_config = config.kv_view()  # a hybrid model's attention layers
        self.groups = groups or KVGroups.single(kv_config.num_layers)
        self.kv_caches = allocate_kv_cache(kv_config, num_blocks, block_size, kv_dtype,
                                           device, self.groups)
        self.states = (StateTensors(config, num_state_slots, dtype, device)
                       if config.linear_attn is not None else None)
        # the step's block tables, one per (group, unit column); each layer's index into them
        self._tables = [(g, col) for g, group in enumerate(self.groups.groups)
                        for col in range(group.units_per_page)]
        self._layer_table = [self._tables.index((g, col))
                             for g, col, _ in self.groups.layer_slots()]
        self.backend = get_attn_backend(self.backend_name)
        plan_kernels(model, self.backend_name)  # what runs natively: model.kernel_plan
        self.sampler = Sampler()
        self.drafter = NO_DRAFT_RUNNER  # a draft model proposes after each step (draft_runner)
        self.loras = NO_LORAS  # LoRA adapters by id, once one is added (runner/lora_set.py)
        self.images = NO_IMAGES  # a vision model's image encoder (runner/image_embeds.py)

    def add_lora(self, lora_id: int, path: str) -> None:
        """Make the adapter at ``path`` resident as ``lora_id`` (between steps); ValueError /
        FileNotFoundError when it does not fit the model."""
        loras = self.loras if isinstance(self.loras, LoraSet) else LoraSet(self.model)
        loras.add(lora_id, path)
        self.loras = loras

    def remove_lora(self, lora_id: int) -> None:
        """Drop a resident adapter (between steps; no scheduled sequence may still name it)."""
        if isinstance(self.loras, LoraSet):
            self.loras.remove(lora_id)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput,
                grammar: GrammarBitmask | None = None) -> ModelRunnerOutput:
        """One forward + sampling; ``grammar`` masks its rows' logits before sampling (its
        bitmask, computed on another thread, is awaited only after the forward)."""
        seqs = sorted(sched.seqs, key=self._prefill_last)  # decode-like first, stable
        input_ids, positions, metas, sample_idx = self._prepare(seqs)
        with forward_context(self._context(metas, seqs)):
            hidden = self.model(input_ids, positions)
        pooled = pool_hidden(seqs, hidden, self.model.compute_logits)
        scored = prompt_logprobs(self.model, seqs, hidden)
        sampling = [s for s in seqs if s.sample]
        if not sampling:
            out = ModelRunnerOutput([], [], [], [])
        elif any(s.num_draft for s in sampling):
            out = verify_drafts(self.sampler, sampling,
                                self.model.compute_logits(hidden[sample_idx]),
                                self._grammar_rows(sampling, grammar), self.device)
        else:
            out = self._sample(sampling, self.model.compute_logits(hidden[sample_idx]),
                               grammar)
        out.pooled, out.prompt_logprobs = pooled, scored
        self.drafter.propose(TargetStep(seqs, hidden, sampling), out)
        return out

    @torch.inference_mode()
    def last_logits(self, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Run ``seqs`` (KV written as in ``execute``) and return the logits at each one's
        last fed position, ``[len(seqs), vocab]`` in the given order (a draft model's
        forwards)."""
        order, _, hidden, sample_idx = self._forward_packed(seqs)
        logits = self.model.compute_logits(hidden[sample_idx])
        result = torch.empty_like(logits)
        result[torch.tensor(order, device=logits.device)] = logits
        return result

    @torch.inference_mode()
    def all_logits(self, seqs: list[ScheduledSeq]) -> list[torch.Tensor]:
        """Run ``seqs`` (KV written as in ``execute``) and return each one's logits at every
        fed position, ``[num_tokens, vocab]``, in the given order (for tests and prompt
        logprobs)."""
        order, packed, hidden, _ = self._forward_packed(seqs)
        logits = self.model.compute_logits(hidden).split([s.num_tokens for s in packed])
        result: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        for rank, i in enumerate(order):
            result[i] = logits[rank]
        return result

    @torch.inference_mode()
    def forward_only(self, seqs: list[ScheduledSeq]) -> None:
        """The forward of ``seqs``, packed as ``execute`` packs them, without logits: a
        tensor-parallel rank > 0 writes its KV heads and gives its share of each all-reduce."""
        self._forward_packed(seqs)

    def _forward_packed(self, seqs: list[ScheduledSeq]):
        """The forward of ``seqs`` packed as ``execute`` packs them (decode-like first,
        stable): (the packed order as indices into ``seqs``, the packed seqs, the hidden
        rows, the rows that sample)."""
        order, packed, (input_ids, positions, metas, sample_idx) = self.pack(seqs)
        with forward_context(self._context(metas, packed)):
            hidden = self.model(input_ids, positions)
        return order, packed, hidden, sample_idx

    def pack(self, seqs: list[ScheduledSeq]):
        """``seqs`` packed as ``execute`` packs them (decode-like first, stable): (the packed
        order as indices into ``seqs``, the packed seqs, (input ids, positions, one attention
        metadata per block table, the rows that sample))."""
        order = sorted(range(len(seqs)), key=lambda i: self._prefill_last(seqs[i]))
        packed = [seqs[i] for i in order]
        return order, packed, self._prepare(packed)

    def _context(self, metas: list, seqs: list[ScheduledSeq]) -> ForwardContext:
        """The step's forward context; ``seqs`` in packed order (their LoRA rows)."""
        layer_metas = ([metas[0]] * len(self._layer_table) if len(metas) == 1
                       else [metas[i] for i in self._layer_table])
        lora = self.loras.batch(seqs, self.device)
        states = (None if self.states is None
                  else self.states.step(seqs, [s.num_tokens for s in seqs]))
        images = self.images.step(seqs, layer_metas)
        return ForwardContext(metas[0], self.kv_caches, self.backend, layer_metas, lora, states,
                              images)

    def _prefill_last(self, seq: ScheduledSeq) -> bool:
        return not self.backend.is_decode_like(seq.num_tokens, seq.start_pos)

    def _block_tables(self, seqs: list[ScheduledSeq]) -> list[np.ndarray]:
        """One padded ``[S, pages]`` table per (group, unit column) (``self._tables``)."""
        n = len(seqs)
        if len(self._tables) == 1:
            table = np.zeros((n, max(len(s.block_ids) for s in seqs)), np.int64)
            for i, s in enumerate(seqs):
                table[i, :len(s.block_ids)] = s.block_ids
            return [table]
        groups = self.groups.groups
        pages = [len(s.block_ids) // groups[0].units_per_page for s in seqs]
        # [S, pages, m] per group, then its columns: tables are ordered group, column
        per_group = [np.zeros((n, max(pages), g.units_per_page), np.int64) for g in groups]
        for i, s in enumerate(seqs):
            assert len(s.window_block_ids) == len(groups) - 1, "a table per KV group"
            for g, ids in enumerate((s.block_ids, *s.window_block_ids)):
                per_group[g][i, :pages[i]] = np.asarray(ids, np.int64).reshape(pages[i], -1)
        return [np.ascontiguousarray(t[:, :, col]) for t in per_group
                for col in range(t.shape[2])]

    def _prepare(self, seqs: list[ScheduledSeq]):
        """The packed step's tensors. Index arithmetic in numpy (~1 us per op at these sizes,
        where each torch op costs ~5 us; ~0.2 ms of a ~8 ms batch-1 step), then one tensor
        each; one attention metadata per block table (``_block_tables``)."""
        dev, bs, n = self.device, self.block_size, len(seqs)
        q_lens = np.fromiter((s.num_tokens for s in seqs), np.int64, n)
        starts = np.fromiter((s.start_pos for s in seqs), np.int64, n)
        tables = self._block_tables(seqs)
        seq_idx = np.repeat(np.arange(n), q_lens)
        cu = np.cumsum(q_lens)
        positions = starts[seq_idx] + np.arange(int(cu[-1])) - (cu - q_lens)[seq_idx]
        input_ids = np.fromiter(chain.from_iterable(s.token_ids for s in seqs), np.int64,
                                int(cu[-1]))
        sample_idx = (cu - 1)[np.fromiter((s.sample for s in seqs), bool, n)]
        if any(s.num_draft for s in seqs):  # every draft position yields logits too
            ends = [int(c) for c, s in zip(cu, seqs) if s.sample]
            drafts = [s.num_draft for s in seqs if s.sample]
            sample_idx = np.concatenate([np.arange(e - 1 - k, e) for e, k in zip(ends, drafts)])
        page, offset = positions // bs, positions % bs
        context_lens, q_list, start_list = ([s.context_len for s in seqs], q_lens.tolist(),
                                            starts.tolist())
        metas = []
        for table in tables:
            slot_mapping = table[seq_idx, page] * bs + offset
            metas.append(self.backend.build_metadata(
                slot_mapping=torch.from_numpy(slot_mapping).to(dev),
                block_table=torch.from_numpy(table).to(dev), context_lens=context_lens,
                q_lens=q_list, start_pos=start_list, block_size=bs,
                dtype=self.kv_caches[0][0].dtype))
        positions = self.images.positions(seqs, positions)  # mRoPE: rope positions
        input_ids, positions, sample_idx = (torch.from_numpy(a).to(dev)
                                            for a in (input_ids, positions, sample_idx))
        return input_ids, positions, metas, sample_idx

    def _grammar_rows(self, seqs: list[ScheduledSeq],
                      grammar: GrammarBitmask | None) -> tuple | None:
        """(logit rows, bitmask) of the constrained rows; a sequence's rows are its
        ``num_draft + 1`` consecutive ones, in the order the bitmask lists them."""
        if grammar is None:
            return None
        row_of, row = {}, 0
        for s in seqs:
            row_of[s.request_id] = row
            row += s.num_draft + 1
        seen: dict[str, int] = {}
        rows = []
        for rid in grammar.request_ids:
            rows.append(row_of[rid] + seen.get(rid, 0))
            seen[rid] = seen.get(rid, 0) + 1
        return torch.tensor(rows, device=self.device), grammar.bitmask.result()

    def _sample(self, seqs: list[ScheduledSeq], logits: torch.Tensor,
                grammar: GrammarBitmask | None) -> ModelRunnerOutput:
        mask = self._grammar_rows(seqs, grammar)
        batch = SamplingBatch.build(
            params=[s.sampling_params for s in seqs], seeds=[s.seed for s in seqs],
            output_token_ids=[s.output_token_ids for s in seqs],
            prompt_token_ids=[s.prompt_token_ids for s in seqs],
            stop_token_ids=[s.stop_token_ids for s in seqs],
            vocab_size=logits.shape[-1], device=self.device, grammar_mask=mask)
        out = self.sampler(logits, batch)
        token_ids = out.token_ids.tolist()
        logprobs: list = [None] * len(seqs)
        top: list = [None] * len(seqs)
        if out.logprobs is not None:
            all_lp = out.logprobs.tolist()
            top_ids, top_lp = (out.top_logprobs[0].tolist(), out.top_logprobs[1].tolist())
            for i, s in enumerate(seqs):
                n = s.sampling_params.logprobs
                if n is not None:
                    logprobs[i] = all_lp[i]
                    top[i] = list(zip(top_ids[i][:n], top_lp[i][:n]))
        return ModelRunnerOutput([s.request_id for s in seqs], token_ids, logprobs, top)
