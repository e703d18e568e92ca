"""Qwen3.5-MoE (``Qwen3_5MoeForCausalLM``, GGUF ``qwen35moe``: the Qwen3.5 hybrid whose every
MLP is a sparse MoE block with a gated shared expert) against transformers: the shape read from
config.json and from the GGUF file alike, logits through the paged KV cache and the state slots
(a float folder as the releases store its experts, fused 3-D, or one tensor per expert; an F32
GGUF; a bfloat16 folder kept in 16 bits), exact invariance of a sequence's logits to its batch
and chunking on a Q8_0 file as stored, what ``radixserve env`` says of that file, and the
engine's greedy tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_qwen35 import Stateful, runner_for
from test_windowed_models import hf_logits, prompts
from tiny_hybrid import make_qwen35_hf_model, make_qwen35_moe_hf_model, qwen35_hf_to_gguf
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.gguf_reader import open_gguf
from radixserve.kernels import native
from radixserve.model_config import MoeConfig
from radixserve.models.loader import load_model_config
from radixserve.models.qwen35_config import qwen35_gguf_config
from radixserve.models.source import ModelSource

ATOL = 1e-4
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels not built")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen35_moe")


@pytest.fixture(scope="module")
def hf_dir(root):
    return make_qwen35_moe_hf_model(root / "hf", seed=5)


@pytest.fixture(scope="module")
def reference(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def conditional_dir(root):
    """The same text model as a ``Qwen3_5MoeForConditionalGeneration`` folder (the releases')."""
    return make_qwen35_moe_hf_model(root / "conditional", seed=5, conditional=True)


@pytest.fixture(scope="module")
def q8_gguf(hf_dir, root):
    return qwen35_hf_to_gguf(hf_dir, root / "q8.gguf", "Q8_0")


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def assert_logits_match(runner, reference, lengths, seed):
    tokens = prompts(runner.config.vocab_size, lengths, seed=seed)
    paged = Stateful(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


def test_the_folders_and_the_gguf_file_give_one_shape(hf_dir, conditional_dir, q8_gguf):
    folder = config_of(hf_dir)
    assert folder.architecture == "Qwen3_5MoeForCausalLM"
    assert folder.moe == MoeConfig(8, 2, 32, norm_topk_prob=True, shared_expert_size=96)
    assert folder.linear_attn.layer_types[-1] == "full_attention"
    gguf = config_of(q8_gguf)
    assert dataclasses.replace(gguf, rms_norm_eps=1e-6) == folder  # (stored as a float32)
    assert config_of(conditional_dir) == folder


def test_a_qwen35moe_file_without_experts_is_refused(root):
    dense = qwen35_hf_to_gguf(make_qwen35_hf_model(root / "dense"), root / "dense.gguf")
    reader = open_gguf(str(dense))

    def field(reader, key, default=None):
        found = reader.fields.get(key.replace("qwen35moe.", "qwen35.", 1))
        return default if found is None else found.contents()

    assert qwen35_gguf_config(reader, field, "qwen35", "Qwen3_5ForCausalLM").moe is None
    with pytest.raises(ValueError, match="qwen35moe.expert_count is missing"):
        qwen35_gguf_config(reader, field, "qwen35moe", "Qwen3_5MoeForCausalLM")


def test_fused_folder_prefill_and_decodes_match_transformers(hf_dir, reference):
    """Packed prefill, then chunks and single-token decodes at different paces."""
    runner = runner_for(hf_dir)
    assert_logits_match(runner, reference, (30, 5, 17, 1), seed=1)
    tokens = prompts(runner.config.vocab_size, (23, 14), seed=2)
    paged = Stateful(tokens, 4)
    for step in ([(0, 6), (1, 1)], [(0, 7), (1, 10)], [(0, 1), (1, 1)], [(0, 9), (1, 2)]):
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)


def test_per_expert_and_conditional_folders_load_the_same_model(hf_dir, conditional_dir, root):
    """``save_pretrained``'s layout (``experts.E.{gate,up,down}_proj``) and the releases'
    ConditionalGeneration folder (``model.language_model.*``, a vision tower) of the same text
    weights."""
    per_expert = make_qwen35_moe_hf_model(root / "per_expert", seed=5, fused=False)
    tokens = prompts(config_of(hf_dir).vocab_size, (11,), seed=3)
    first, *others = [runner_for(d).all_logits([Stateful(tokens, 4).chunk(0, 11)])[0]
                      for d in (hf_dir, per_expert, conditional_dir)]
    assert all(torch.equal(first, logits) for logits in others)


def test_f32_gguf_matches_transformers(hf_dir, reference, root):
    runner = runner_for(qwen35_hf_to_gguf(hf_dir, root / "f32.gguf", "F32"))
    assert_logits_match(runner, reference, (19, 7), seed=6)


@needs_native
def test_bf16_folder_in_16_bits_matches_transformers(root):
    folder = make_qwen35_moe_hf_model(root / "bf16", seed=8, save_dtype=torch.bfloat16)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runner = runner_for(folder, quantization="16bit-stored")
    assert_logits_match(runner, reference, (13, 4), seed=7)


@needs_native
def test_q8_stored_logits_do_not_depend_on_batch_or_chunking(q8_gguf):
    runner = runner_for(q8_gguf, quantization="gguf")
    tokens = prompts(runner.config.vocab_size, (26, 9, 17), seed=3)
    whole = runner.all_logits([Stateful(tokens, 4).chunk(0, 26)])[0]
    alone = Stateful(tokens, 4)
    pieces = [runner.all_logits([alone.chunk(0, n)])[0] for n in (1, 6, 3, 16)]
    assert torch.equal(torch.cat(pieces), whole)
    batched = Stateful(tokens, 4)
    first = runner.all_logits([batched.chunk(1, 9), batched.chunk(0, 10), batched.chunk(2, 17)])
    second = runner.all_logits([batched.chunk(0, 16)])
    assert torch.equal(torch.cat([first[1], second[0]]), whole)


@needs_native
def test_fused_gate_up_experts_file_runs_the_same_blocks(hf_dir, q8_gguf, root):
    """A file converted with --fuse-gate-up-exps (``ffn_gate_up_exps``) holds the same Q8_0
    rows in one tensor: the same logits, to the bit."""
    fused = qwen35_hf_to_gguf(hf_dir, root / "q8-fused.gguf", "Q8_0", fuse_gate_up_exps=True)
    tokens = prompts(config_of(hf_dir).vocab_size, (15,), seed=9)
    logits = [runner_for(f, quantization="gguf").all_logits([Stateful(tokens, 4).chunk(0, 15)])[0]
              for f in (q8_gguf, fused)]
    assert torch.equal(*logits)


@needs_native
def test_env_report_and_the_built_model_agree_on_what_runs(q8_gguf):
    from radixserve.env_report import report

    text = report(str(q8_gguf))
    plan = runner_for(q8_gguf, quantization="gguf").model.kernel_plan
    assert "(Qwen3_5MoeForCausalLM, 4 layers, quantization auto -> gguf" in text
    assert "Gated DeltaNet" in plan.python_layers
    assert f"decoder layers: Python layers ({plan.python_layers})" in text


GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _tokens(results) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in results]


@needs_native
def test_engine_greedy_batched_equals_alone(q8_gguf):
    llm = LLM(str(q8_gguf), block_size=4, show_progress=False)
    batch = prompts(llm.engine.vocab_size, (5, 22, 13, 9), seed=11)
    alone = [_tokens(llm.generate(p, GREEDY))[0] for p in batch]
    assert _tokens(llm.generate(batch, GREEDY)) == alone


def test_engine_float_greedy_equals_transformers_generate(hf_dir, reference):
    llm = LLM(str(hf_dir), block_size=4, show_progress=False)
    batch = prompts(llm.engine.vocab_size, (7, 18, 11), seed=12)
    for prompt, tokens in zip(batch, _tokens(llm.generate(batch, GREEDY))):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=10,
                                     do_sample=False, min_new_tokens=10)
        assert tokens == out[0, len(prompt):].tolist()
