"""Qwen3.5 (hybrid: Gated DeltaNet + gated attention) against transformers, through the paged
KV cache and the recurrent-state slots: packed prefill, chunks and decodes at different paces,
a resume from a snapshot (a prefix-cache hit), exact invariance of a sequence's logits to its
batch and its chunking, and the GGUF file llama.cpp's converter writes."""

from __future__ import annotations

import pytest
import torch
from test_windowed_models import Paged, hf_logits, prompts
from tiny_hybrid import make_qwen35_hf_model, qwen35_hf_to_gguf
from transformers import AutoModelForCausalLM

from radixserve.core.kv.recurrent_states import ZERO, SeqState
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native
from radixserve.models.loader import load_model, load_model_config
from radixserve.models.source import ModelSource
from radixserve.runner.model_runner import ModelRunner

ATOL = 1e-4
BACKENDS = ["cpu_native", "torch"] if native.load() is not None else ["torch"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_qwen35_hf_model(tmp_path_factory.mktemp("qwen35") / "hf", seed=5)


@pytest.fixture(scope="module")
def stored(hf_dir, tmp_path_factory):
    """The Q8_0 GGUF's runner, its matrices as stored: native, batch-invariant linears."""
    if native.load() is None:
        pytest.skip("exact invariance needs the native kernels")
    gguf = qwen35_hf_to_gguf(hf_dir, tmp_path_factory.mktemp("q8") / "q.gguf", "Q8_0")
    return runner_for(gguf, quantization="gguf")


@pytest.fixture(scope="module")
def reference(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def runner_for(path, backend="auto", block_size=4, quantization="none") -> ModelRunner:
    source = ModelSource.resolve(str(path))
    config = load_model_config(source)
    model = load_model(source, config, torch.device("cpu"), torch.float32, show_progress=False,
                       quantization=quantization)
    return ModelRunner(model, config, 96, block_size, torch.device("cpu"), torch.float32,
                       attn_backend=backend, num_state_slots=8)


class Stateful(Paged):
    """`Paged` sequences with a recurrent-state slot each (sequence i in slot i)."""

    def chunk(self, i: int, n: int, snapshot: tuple[int, int] | None = None) -> ScheduledSeq:
        seq = super().chunk(i, n)
        seq.state = SeqState(i, ZERO if seq.start_pos == 0 else None, snapshot)
        return seq


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_prefill_matches_transformers(backend, hf_dir, reference):
    runner = runner_for(hf_dir, backend)
    tokens = prompts(runner.config.vocab_size, (30, 5, 17, 1), seed=1)
    paged = Stateful(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_and_decodes_match_transformers(backend, hf_dir, reference):
    runner = runner_for(hf_dir, backend)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=2)
    paged = Stateful(tokens, 4)
    plan = [[(0, 6), (1, 1)], [(0, 7), (1, 10), (2, 1)], [(0, 1), (1, 1), (2, 6)],
            [(0, 3), (2, 1), (1, 11)], [(0, 13), (2, 6)]]
    for step in plan:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)


def test_logits_do_not_depend_on_batch_or_chunking(stored):
    runner = stored
    tokens = prompts(runner.config.vocab_size, (26, 9, 17), seed=3)
    whole = runner.all_logits([Stateful(tokens, 4).chunk(0, 26)])[0]
    alone = Stateful(tokens, 4)
    pieces = [runner.all_logits([alone.chunk(0, n)])[0] for n in (1, 6, 3, 16)]
    assert torch.equal(torch.cat(pieces), whole)
    batched = Stateful(tokens, 4)
    first = runner.all_logits([batched.chunk(1, 9), batched.chunk(0, 10), batched.chunk(2, 17)])
    second = runner.all_logits([batched.chunk(0, 16)])
    assert torch.equal(torch.cat([first[1], second[0]]), whole)


def test_resume_from_a_snapshot_equals_the_whole_run(stored):
    """A chunk that snapshots its state at a page boundary (slot 5); a new sequence that
    starts there from a copy of it and reads the first one's KV pages computes the same
    logits as one run through (what a prefix-cache hit does)."""
    runner = stored
    shared, tail = prompts(runner.config.vocab_size, (12, 9), seed=4)
    whole = runner.all_logits([Stateful([shared + tail], 4).chunk(0, 21)])[0]
    first = Stateful([shared + tail[:2]], 4)
    runner.all_logits([first.chunk(0, 14, snapshot=(12, 5))])
    hit = ScheduledSeq("hit", tail, 12, first.blocks[0][:3] + first.pool.allocate(3),
                       sample=False, state=SeqState(6, 5, None))
    (logits,) = runner.all_logits([hit])
    assert torch.equal(logits, whole[12:])


def test_gguf_file_matches_transformers(hf_dir, reference, tmp_path):
    gguf = qwen35_hf_to_gguf(hf_dir, tmp_path / "q.gguf", "F32")
    runner = runner_for(gguf)
    tokens = prompts(runner.config.vocab_size, (19, 7), seed=6)
    paged = Stateful(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)
