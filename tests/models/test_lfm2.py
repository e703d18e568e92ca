"""LFM2 (hybrid: gated short conv + GQA attention) and LFM2-MoE against transformers, through the
paged KV cache and the conv-window slots: packed prefill, chunks and decodes at different paces,
a resume from a snapshot (a prefix-cache hit), exact invariance of a sequence's logits to its
batch and its chunking (the Q8_0 GGUF as stored), the GGUF files llama.cpp's converter writes,
and the LLM's greedy tokens against transformers' ``generate``."""

from __future__ import annotations

import pytest
import torch
from test_qwen35 import Stateful, runner_for
from test_windowed_models import hf_logits, prompts
from tiny_lfm2 import lfm2_hf_to_gguf, make_lfm2_hf_model, make_lfm2_moe_hf_model
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.core.kv.recurrent_states import SeqState
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native

ATOL = 1e-4
F16_ATOL = 0.05  # F16 weights as stored, float32 activations; the logits' std is about 2
# Q8_0 as stored rounds weights and activations to 8 bits: logits within 0.5 of float32's,
# 0.09 on average (a wrong conv or routing is off by about the logits' std)
Q8_MEAN_ATOL = 0.15
BACKENDS = ["cpu_native", "torch"] if native.load() is not None else ["torch"]
needs_native = pytest.mark.skipif(native.load() is None, reason="needs the native kernels")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_lfm2_hf_model(tmp_path_factory.mktemp("lfm2") / "hf", seed=5)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_lfm2_moe_hf_model(tmp_path_factory.mktemp("lfm2moe") / "hf", seed=6)


@pytest.fixture(scope="module")
def reference(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def stored(hf_dir, tmp_path_factory):
    """The Q8_0 GGUF's runner, its matrices as stored: native, batch-invariant linears."""
    if native.load() is None:
        pytest.skip("exact invariance needs the native kernels")
    gguf = lfm2_hf_to_gguf(hf_dir, tmp_path_factory.mktemp("q8") / "q.gguf", "Q8_0")
    return runner_for(gguf, quantization="gguf")


def assert_prefill_matches(runner, reference, lengths, seed, atol=ATOL, mean_atol=None):
    """Packed prefill logits = transformers', each within ``atol`` (or, given ``mean_atol``,
    their mean absolute difference under it)."""
    tokens = prompts(runner.config.vocab_size, lengths, seed=seed)
    paged = Stateful(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        expected = hf_logits(reference, t)
        if mean_atol is None:
            torch.testing.assert_close(logits, expected, atol=atol, rtol=0)
        else:
            assert (logits - expected).abs().mean() < mean_atol


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_prefill_matches_transformers(backend, hf_dir, reference):
    assert_prefill_matches(runner_for(hf_dir, backend), reference, (30, 5, 17, 1), seed=1)


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
    """A chunk that snapshots its conv windows at a page boundary (slot 5); a new sequence
    that starts there from a copy of them and reads the first one's KV pages computes the
    same logits as one run through (what a prefix-cache hit does)."""
    runner = stored
    shared, tail = prompts(runner.config.vocab_size, (12, 9), seed=4)
    whole = runner.all_logits([Stateful([shared + tail], 4).chunk(0, 21)])[0]
    first = Stateful([shared + tail[:2]], 4)
    runner.all_logits([first.chunk(0, 14, snapshot=(12, 5))])
    hit = ScheduledSeq("hit", tail, 12, first.blocks[0][:3] + first.pool.allocate(3),
                       sample=False, state=SeqState(6, 5, None))
    (logits,) = runner.all_logits([hit])
    assert torch.equal(logits, whole[12:])


def test_stored_q8_file_is_close_to_transformers(stored, reference):
    assert_prefill_matches(stored, reference, (19, 7), seed=6, mean_atol=Q8_MEAN_ATOL)


@needs_native
def test_stored_f16_file_matches_transformers(hf_dir, reference, tmp_path):
    gguf = lfm2_hf_to_gguf(hf_dir, tmp_path / "h.gguf", "F16")
    assert_prefill_matches(runner_for(gguf, quantization="gguf"), reference, (19, 7), seed=6,
                           atol=F16_ATOL)


@needs_native
def test_bf16_folder_as_stored_matches_transformers(tmp_path):
    """The releases' bfloat16 folder through the 16-bit path (transformers' names mapped)."""
    folder = make_lfm2_hf_model(tmp_path / "bf16", seed=5, save_dtype=torch.bfloat16)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runner = runner_for(folder, quantization="16bit-stored")
    assert_prefill_matches(runner, reference, (19, 7), seed=6, atol=F16_ATOL)


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_file_matches_transformers(tied, hf_dir, reference, tmp_path):
    """The F32 file through the float path (tied: the releases' head; untied: ``output``)."""
    if not tied:
        hf_dir = make_lfm2_hf_model(tmp_path / "untied", seed=5, tie_word_embeddings=False)
        reference = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    gguf = lfm2_hf_to_gguf(hf_dir, tmp_path / "f.gguf", "F32")
    assert_prefill_matches(runner_for(gguf), reference, (19, 7), seed=6)


def test_moe_folder_and_gguf_match_transformers(moe_dir, tmp_path):
    """Sigmoid routing with the expert bias in selection only, a dense first layer; the
    folder's per-expert tensors and the file's 3-D ones (``exp_probs_b`` the bias)."""
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    gguf = lfm2_hf_to_gguf(moe_dir, tmp_path / "moe.gguf", "F32")
    for path in (moe_dir, gguf):
        assert_prefill_matches(runner_for(path), reference, (23, 6, 1), seed=7)


@needs_native
def test_moe_stored_q8_file_is_close_to_transformers(moe_dir, tmp_path):
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    gguf = lfm2_hf_to_gguf(moe_dir, tmp_path / "moe.gguf", "Q8_0")
    assert_prefill_matches(runner_for(gguf, quantization="gguf"), reference, (17, 9), seed=8,
                           mean_atol=Q8_MEAN_ATOL)


def test_llm_greedy_equals_transformers_generate(hf_dir, reference):
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    llm = LLM(str(hf_dir), block_size=4, show_progress=False)
    batch = prompts(llm.engine.vocab_size, (5, 21, 12), seed=9)
    for prompt, result in zip(batch, llm.generate(batch, greedy)):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=10,
                                     min_new_tokens=10, do_sample=False)
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()
