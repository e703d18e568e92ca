"""Qwen3-Next (``Qwen3NextForCausalLM``, GGUF ``qwen3next``: Qwen3.5's hybrid with fused,
per-key-head interleaved DeltaNet input projections and a sparse MoE block in every layer)
against transformers: one shape from config.json and from the GGUF files (today's converter's,
``attn_qkv`` + ``attn_gate``, and the older ``ssm_in`` layout), logits through the paged KV cache
and the state slots (packed prefill, chunks and decodes at different paces; the F32 files),
a bfloat16 folder in 16 bits, the stored (``--quantization gguf``) layers equal to the float
ones, exact invariance to batch and chunking and a snapshot resume on the Q8_0 file as stored,
and the engine's greedy tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_qwen35 import Stateful, runner_for
from test_windowed_models import hf_logits, prompts
from tiny_qwen3next import make_qwen3next_hf_model, qwen3next_hf_to_gguf
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.core.kv.recurrent_states import SeqState
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native
from radixserve.model_config import MoeConfig
from radixserve.models.loader import load_model_config
from radixserve.models.qwen3next_config import qwen3next_hf_config
from radixserve.models.source import ModelSource

ATOL = 1e-4
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels not built")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen3next")


@pytest.fixture(scope="module")
def hf_dir(root):
    return make_qwen3next_hf_model(root / "hf", seed=5)


@pytest.fixture(scope="module")
def reference(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def q8_gguf(hf_dir, root):
    return qwen3next_hf_to_gguf(hf_dir, root / "q8.gguf", "Q8_0")


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def logits_of(runner, lengths, seed):
    tokens = prompts(runner.config.vocab_size, lengths, seed=seed)
    paged = Stateful(tokens, 4)
    return tokens, runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])


def assert_logits_match(runner, reference, lengths, seed):
    tokens, ours = logits_of(runner, lengths, seed)
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


def test_the_folder_and_both_gguf_layouts_give_one_shape(hf_dir, q8_gguf, root):
    folder = config_of(hf_dir)
    assert folder.architecture == "Qwen3NextForCausalLM"
    assert folder.moe == MoeConfig(8, 2, 32, norm_topk_prob=True, shared_expert_size=96)
    assert folder.rotary_dim == 4 and folder.attn_output_gate
    assert folder.linear_attn.layer_types[-1] == "full_attention"
    legacy = qwen3next_hf_to_gguf(hf_dir, root / "legacy.gguf", "Q8_0", legacy=True)
    for gguf in (q8_gguf, legacy):
        assert dataclasses.replace(config_of(gguf), rms_norm_eps=1e-6) == folder


def test_a_release_config_json_reads_as_transformers_does():
    """The 80B's config.json has no ``layer_types`` (``full_attention_interval``), rope keys at
    the top level; ``mlp_only_layers`` and ``decoder_sparse_step`` make layers dense."""
    config = qwen3next_hf_config({
        "architectures": ["Qwen3NextForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 2,
        "intermediate_size": 5120, "rope_theta": 10000000, "partial_rotary_factor": 0.25,
        "rope_scaling": None, "full_attention_interval": 4, "decoder_sparse_step": 2,
        "mlp_only_layers": [3], "num_experts": 512, "num_experts_per_tok": 10,
        "norm_topk_prob": False, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512})
    assert config.linear_attn.layer_types == ("linear_attention",) * 3 + (
        "full_attention",) + ("linear_attention",) * 3 + ("full_attention",)
    assert (config.rope_theta, config.rotary_dim, config.head_dim) == (1e7, 64, 256)
    assert config.moe == MoeConfig(512, 10, 512, norm_topk_prob=False,
                                   dense_layers=(0, 2, 3, 4, 6), shared_expert_size=512)
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        qwen3next_hf_config({**dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads"), 4),
                             "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_folder_prefill_chunks_and_decodes_match_transformers(hf_dir, reference):
    runner = runner_for(hf_dir)
    assert_logits_match(runner, reference, (30, 5, 17, 1), seed=1)
    tokens = prompts(runner.config.vocab_size, (23, 14), seed=2)
    paged = Stateful(tokens, 4)
    for step in ([(0, 6), (1, 1)], [(0, 7), (1, 10)], [(0, 1), (1, 1)], [(0, 9), (1, 2)]):
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("legacy", [False, True], ids=["attn_qkv", "ssm_in"])
def test_f32_gguf_matches_transformers(legacy, hf_dir, reference, root):
    path = qwen3next_hf_to_gguf(hf_dir, root / f"f32-{legacy}.gguf", "F32", legacy=legacy)
    assert_logits_match(runner_for(path), reference, (19, 7), seed=6)


def test_mtp_block_and_dense_layers(root):
    """A folder with the release's MTP block (skipped) runs the model without it; dense
    layers (``mlp_only_layers``) match transformers too."""
    plain = runner_for(make_qwen3next_hf_model(root / "plain", seed=9, mlp_only_layers=[1]))
    mtp_dir = make_qwen3next_hf_model(root / "mtp", seed=9, mtp=True, mlp_only_layers=[1])
    assert config_of(mtp_dir).moe.dense_layers == (1,)
    reference = AutoModelForCausalLM.from_pretrained(mtp_dir, dtype=torch.float32).eval()
    assert_logits_match(plain, reference, (13, 4), seed=7)
    _, with_mtp = logits_of(runner_for(mtp_dir), (13, 4), seed=7)
    _, without = logits_of(plain, (13, 4), seed=7)
    assert all(torch.equal(a, b) for a, b in zip(with_mtp, without))


@needs_native
def test_bf16_folder_in_16_bits_matches_transformers(root):
    """The release's bfloat16 folder as ``auto`` loads it on CPU (16-bit parts as stored): the
    fused projections taken whole, their rows in the model's order (``hf_row_order``)."""
    folder = make_qwen3next_hf_model(root / "bf16", seed=8, save_dtype=torch.bfloat16)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert_logits_match(runner_for(folder, quantization="16bit-stored"), reference, (13, 4),
                        seed=7)


@needs_native
@pytest.mark.parametrize("legacy", [False, True], ids=["attn_qkv", "ssm_in"])
def test_stored_fused_projections_are_the_float_ones(legacy, hf_dir, root):
    """An F16 file as stored (16-bit parts, float32 activations) and as float32: each DeltaNet
    layer's fused projections give the same rows, so ``row_order`` put the file's rows (the
    converter's [qkv | z] parts or ``ssm_in``, and ``ssm_ba``) where the model reads them."""
    path = qwen3next_hf_to_gguf(hf_dir, root / f"f16-{legacy}.gguf", "F16", legacy=legacy)
    stored = runner_for(path, quantization="gguf").model
    floats = runner_for(path).model
    x = torch.randn(5, stored.config.hidden_size, generator=torch.Generator().manual_seed(0))
    for ours, theirs in zip(stored.layers, floats.layers):
        if not ours.is_linear:
            continue
        for name in ("in_proj_qkvz", "in_proj_ba", "out_proj"):
            width = getattr(theirs.linear_attn, name).in_features
            xs = x[:, :width]
            torch.testing.assert_close(getattr(ours.linear_attn, name)(xs),
                                       getattr(theirs.linear_attn, name)(xs),
                                       atol=1e-5, rtol=1e-5)


@needs_native
def test_q8_stored_logits_do_not_depend_on_batch_chunking_or_layout(q8_gguf, root, hf_dir):
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
    # the ssm_in file quantizes the same rows: the same blocks, the same logits
    legacy = qwen3next_hf_to_gguf(hf_dir, root / "legacy-q8.gguf", "Q8_0", legacy=True)
    old = runner_for(legacy, quantization="gguf")
    assert torch.equal(old.all_logits([Stateful(tokens, 4).chunk(0, 26)])[0], whole)


@needs_native
def test_resume_from_a_snapshot_equals_the_whole_run(q8_gguf):
    runner = runner_for(q8_gguf, quantization="gguf")
    shared, tail = prompts(runner.config.vocab_size, (12, 9), seed=4)
    whole = runner.all_logits([Stateful([shared + tail], 4).chunk(0, 21)])[0]
    first = Stateful([shared + tail[:2]], 4)
    runner.all_logits([first.chunk(0, 14, snapshot=(12, 5))])
    hit = ScheduledSeq("hit", tail, 12, first.blocks[0][:3] + first.pool.allocate(3),
                       sample=False, state=SeqState(6, 5, None))
    (logits,) = runner.all_logits([hit])
    assert torch.equal(logits, whole[12:])


def test_engine_greedy_equals_transformers_generate(hf_dir, reference):
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    llm = LLM(str(hf_dir), block_size=4, show_progress=False)
    batch = prompts(llm.engine.vocab_size, (7, 18, 11), seed=12)
    for prompt, result in zip(batch, llm.generate(batch, greedy)):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=10,
                                     do_sample=False, min_new_tokens=10)
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()
