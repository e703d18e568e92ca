"""Granite against transformers: the Granite 4.0-H hybrid (Mamba2 + attention without RoPE,
MoE + shared MLP; and its dense variant) through the paged KV cache and the state slots
(packed prefill, chunks and decodes at different paces, a resume from a snapshot), Granite 3
dense and MoE; the GGUF files llama.cpp's converter writes (F32, and Q8_0 kept as stored:
close to transformers, and a sequence's logits exactly independent of its batch and
chunking), a bfloat16 folder kept in 16 bits, and the engine's greedy tokens."""

from __future__ import annotations

import pytest
import torch
from test_qwen35 import Stateful, runner_for
from test_windowed_models import hf_logits, prompts
from tiny_granite import granite_hf_to_gguf, make_granite_hf_model
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.core.kv.recurrent_states import SeqState
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native

ATOL = 1e-4
Q8_ATOL = 0.03  # 8-bit weights and activations: logits of ~1.3 move by ~0.013
BACKENDS = ["cpu_native", "torch"] if native.load() is not None else ["torch"]
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels not built")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("granite")


@pytest.fixture(scope="module")
def hf_dir(root):
    return make_granite_hf_model("hybrid-moe", root / "hybrid-moe", seed=5)


@pytest.fixture(scope="module")
def reference(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def stored(hf_dir, root):
    """The Q8_0 GGUF's runner, its matrices as stored: native, batch-invariant linears."""
    if native.load() is None:
        pytest.skip("exact invariance needs the native kernels")
    return runner_for(granite_hf_to_gguf(hf_dir, root / "q8.gguf", "Q8_0"), quantization="gguf")


def assert_logits_match(runner, reference, lengths, seed, atol=ATOL):
    tokens = prompts(runner.config.vocab_size, lengths, seed=seed)
    paged = Stateful(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=atol, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_prefill_matches_transformers(backend, hf_dir, reference):
    assert_logits_match(runner_for(hf_dir, backend), reference, (30, 5, 17, 1), seed=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_and_decodes_match_transformers(backend, hf_dir, reference):
    runner = runner_for(hf_dir, backend)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=2)
    full = [hf_logits(reference, t) for t in tokens]  # a prefix's logits are these' prefix
    paged = Stateful(tokens, 4)
    plan = [[(0, 6), (1, 1)], [(0, 7), (1, 10), (2, 1)], [(0, 1), (1, 1), (2, 6)],
            [(0, 3), (2, 1), (1, 11)], [(0, 13), (2, 6)]]
    for step in plan:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            expected = full[i][seq.start_pos:seq.context_len]
            torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_f32_gguf_matches_transformers(hf_dir, reference, root):
    runner = runner_for(granite_hf_to_gguf(hf_dir, root / "f32.gguf", "F32"))
    assert_logits_match(runner, reference, (19, 7), seed=6)


MICRO = {"layer_types": ["attention"] * 4, "position_embedding_type": "rope"}


@pytest.mark.parametrize("kind, overrides", [("hybrid", {}), ("granite", {}),
                                             ("granitemoeshared", {}), ("hybrid", MICRO)])
def test_other_kinds_match_transformers(kind, overrides, root):
    """The dense hybrid (the shared MLP alone), Granite 3 dense (RoPE, Llama's MLP),
    GraniteMoeShared (folder and F32 GGUF file), and a GraniteMoeHybrid folder of attention
    layers with RoPE (Granite 4.0-Micro; llama.cpp converts it to a ``granite`` file)."""
    folder = make_granite_hf_model(kind, root / f"{kind}{len(overrides)}", seed=3, **overrides)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert_logits_match(runner_for(folder), reference, (17, 6), seed=4)
    if not overrides:
        gguf = granite_hf_to_gguf(folder, root / f"{kind}.gguf", "F32")
        assert_logits_match(runner_for(gguf), reference, (11,), seed=5)


@needs_native
def test_q8_stored_logits_are_close_to_transformers(stored, reference):
    assert_logits_match(stored, reference, (21, 8), seed=7, atol=Q8_ATOL)


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


@needs_native
def test_bf16_folder_in_16_bits_matches_transformers(root):
    """The 16-bit path finds the renamed matrices (fused experts cut, shared_mlp's
    input_linear as gate_up_proj, the Mamba2 projections)."""
    folder = make_granite_hf_model("hybrid-moe", root / "bf16", seed=8,
                                   save_dtype=torch.bfloat16)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runner = runner_for(folder, quantization="16bit-stored")
    assert_logits_match(runner, reference, (13, 4), seed=7)


# min_tokens bans EOS as transformers' min_new_tokens does (this model's argmax is EOS at
# some steps)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=10)


def test_engine_greedy_equals_transformers_generate(hf_dir, reference):
    llm = LLM(str(hf_dir), block_size=4, show_progress=False)
    batch = prompts(llm.engine.vocab_size, (7, 18, 11), seed=12)
    results = llm.generate(batch, GREEDY)
    for prompt, result in zip(batch, results):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=10,
                                     do_sample=False, min_new_tokens=10)
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()
