"""Nemotron-H (``NemotronHForCausalLM``; GGUF ``nemotron_h`` and, for Nemotron 3 Nano's MoE
layout, ``nemotron_h_moe``: Mamba2, attention without rope, squared-ReLU MLP or MoE blocks)
against transformers: the shape read from config.json and from the GGUF file alike, every GGUF
tensor mapped back to the folder's, logits through the paged KV cache and the state slots
(packed prefill, chunks and decodes at different paces; the folder and an F32 file; the MoE
model too), exact invariance of a sequence's logits to its batch and chunking and a resume from
a snapshot on a Q8_0 file as stored, and the engine's greedy tokens."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from test_qwen35 import Stateful, runner_for
from test_windowed_models import hf_logits, prompts
from tiny_nemotron_h import make_nemotron_h_hf_model, nemotron_h_hf_to_gguf
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.core.kv.recurrent_states import SeqState
from radixserve.core.sched_output import ScheduledSeq
from radixserve.gguf_reader import open_gguf
from radixserve.kernels import native
from radixserve.model_config import FULL, LINEAR, MLP_ONLY
from radixserve.models.loader import load_model_config
from radixserve.models.nemotron_h_config import nemotron_h_hf_config, nemotron_h_hf_name
from radixserve.models.nemotron_h_gguf import NemotronHGguf
from radixserve.models.source import ModelSource

ATOL = 1e-4
KINDS = ("dense", "moe")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemotron_h")
    return {kind: make_nemotron_h_hf_model(root / kind, seed=5, moe=kind == "moe")
            for kind in KINDS}


@pytest.fixture(scope="module")
def references(folders):
    """transformers' models, their EOS off: ``generate`` runs ``max_new_tokens`` as the
    engine's ``ignore_eos`` does (``min_new_tokens`` would forbid EOS instead)."""
    models = {kind: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
              for kind, d in folders.items()}
    for model in models.values():
        model.generation_config.eos_token_id = None
    return models


@pytest.fixture(scope="module")
def stored(folders, tmp_path_factory):
    """Each model's Q8_0 GGUF runner, its matrices as stored: native, batch-invariant
    linears."""
    if native.load() is None:
        pytest.skip("exact invariance needs the native kernels")
    root = tmp_path_factory.mktemp("q8")
    return {kind: runner_for(nemotron_h_hf_to_gguf(d, root / f"{kind}.gguf", "Q8_0"),
                             quantization="gguf") for kind, d in folders.items()}


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def folder_state(folder) -> dict[str, torch.Tensor]:
    raw = load_file(str(folder / "model.safetensors"))
    return {nemotron_h_hf_name(name): t for name, t in raw.items()}


# -- shapes and tensors -----------------------------------------------------------------------

def test_hf_config_reads_the_pattern(folders):
    dense, moe = config_of(folders["dense"]), config_of(folders["moe"])
    m = dense.linear_attn
    assert dense.architecture == moe.architecture == "NemotronHForCausalLM"
    assert m.layer_types == (LINEAR, MLP_ONLY, FULL, LINEAR, MLP_ONLY, LINEAR, MLP_ONLY)
    assert dense.attention_layers == (2,) and dense.moe is None
    assert (dense.hidden_size, dense.num_heads, dense.num_kv_heads, dense.head_dim,
            dense.intermediate_size, dense.rms_norm_eps) == (64, 4, 2, 16, 96, 1e-5)
    assert (m.num_heads, m.head_dim, m.state_size, m.n_groups, m.conv_kernel, m.conv_bias,
            m.proj_bias, m.time_step_limit) == (8, 8, 16, 2, 4, True, False, (0.0, float("inf")))
    assert not dense.tie_word_embeddings and not dense.qk_norm and not dense.attention_bias
    e = moe.moe
    assert moe.linear_attn.layer_types == (LINEAR, MLP_ONLY, FULL, MLP_ONLY, LINEAR, MLP_ONLY)
    assert e.dense_layers == (0, 2, 4) and e.is_sparse(3)
    assert (e.num_experts, e.top_k, e.intermediate_size, e.shared_expert_size, e.num_groups,
            e.topk_groups, e.routed_scaling) == (8, 2, 32, 64, 4, 2, 2.5)
    assert (e.scoring, e.expert_bias, e.expert_activation, e.shared_expert_gate,
            e.norm_topk_prob) == ("sigmoid", True, "relu2", False, True)


def test_layers_block_type_and_legacy_keys_read_as_transformers_reads_them(folders):
    """transformers' own spelling (``layers_block_type``, legacy names "mamba" / "attention"
    among them) and the older ``mamba_*`` keys give the same shape as the releases'."""
    cfg = json.loads((folders["dense"] / "config.json").read_text())
    names = {"M": "mamba", "*": "attention", "-": "mlp"}
    other = dict(cfg, layers_block_type=[names[c] for c in cfg["hybrid_override_pattern"]],
                 mamba_n_groups=cfg["n_groups"], n_groups=8)
    del other["hybrid_override_pattern"]
    arch = cfg["architectures"][0]
    assert nemotron_h_hf_config(other, arch) == nemotron_h_hf_config(cfg, arch)


@pytest.mark.parametrize("change, message", [
    ({"mlp_hidden_act": "gelu"}, "mlp_hidden_act"),
    ({"moe_latent_size": 16}, "latent"),
    ({"hybrid_override_pattern": "M-X"}, "unknown characters"),
    ({"hybrid_override_pattern": None}, "needs hybrid_override_pattern"),
])
def test_configs_it_cannot_run_are_refused(folders, change, message):
    cfg = dict(json.loads((folders["dense"] / "config.json").read_text()), **change)
    with pytest.raises(ValueError, match=message):
        nemotron_h_hf_config(cfg, "NemotronHForCausalLM")


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_config_equals_hf_config(folders, kind, tmp_path):
    """Field by field (eps as the float32 the file holds), but the context: without rope the
    converter writes 2**20."""
    gguf = nemotron_h_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    assert open_gguf(str(gguf)).fields["general.architecture"].contents() == (
        "nemotron_h_moe" if kind == "moe" else "nemotron_h")
    ours, hf = config_of(gguf), config_of(folders[kind])
    assert ours.max_position_embeddings == 2**20
    assert ours.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert dataclasses.replace(ours, max_position_embeddings=hf.max_position_embeddings,
                               rms_norm_eps=hf.rms_norm_eps) == hf


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_tensors_map_back_to_the_folders(folders, kind, tmp_path):
    """Every tensor of an F32 file, mapped and transformed back (q/k rows unpermuted, A_log,
    D, conv1d [C, 1, K], the gated norm flat, experts cut one by one): the folder's name,
    shape and values; nothing else. A = -exp(A_log) comes back to a float32 rounding."""
    gguf = nemotron_h_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    ours = dict(NemotronHGguf(config_of(gguf)).weights(open_gguf(str(gguf))))
    hf = folder_state(folders[kind])
    assert sorted(ours) == sorted(hf)
    for name, t in hf.items():
        if name.endswith("A_log"):
            torch.testing.assert_close(ours[name], t, atol=1e-6, rtol=1e-6, msg=name)
        else:
            assert torch.equal(ours[name], t), name


# -- logits -----------------------------------------------------------------------------------

def _check_steps(runner, reference, plan, lengths, seed):
    tokens = prompts(runner.config.vocab_size, lengths, seed=seed)
    paged = Stateful(tokens, 4)
    for step in plan:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_chunks_and_decodes_match_transformers(kind, folders, references):
    """A packed prefill, then chunks and decodes at different paces, from the folder."""
    plan = [[(0, 6), (1, 1), (2, 17)], [(0, 7), (1, 10), (2, 1)],
            [(0, 1), (1, 1), (2, 6)], [(0, 13), (1, 11)]]
    _check_steps(runner_for(folders[kind]), references[kind], plan, (27, 23, 24), seed=2)


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_f32_file_matches_transformers(kind, folders, references, tmp_path):
    gguf = nemotron_h_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    plan = [[(0, 19), (1, 7)], [(0, 1), (1, 3)]]
    _check_steps(runner_for(gguf), references[kind], plan, (20, 10), seed=6)


def test_q8_0_stored_logits_stay_near_transformers(stored, references):
    """The file's 8-bit weights (and the kernels' 8-bit activations): near the float model,
    not equal to it (the dense model: a MoE token's experts may change with them)."""
    tokens = prompts(stored["dense"].config.vocab_size, (26,), seed=3)
    ours = stored["dense"].all_logits([Stateful(tokens, 4).chunk(0, 26)])[0]
    hf = hf_logits(references["dense"], tokens[0])
    assert (ours - hf).abs().mean() < 0.1
    assert (ours.argmax(-1) == hf.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("kind", KINDS)
def test_q8_0_logits_do_not_depend_on_batch_or_chunking(kind, stored):
    runner = stored[kind]
    tokens = prompts(runner.config.vocab_size, (26, 9, 17), seed=3)
    whole = runner.all_logits([Stateful(tokens, 4).chunk(0, 26)])[0]
    alone = Stateful(tokens, 4)
    pieces = [runner.all_logits([alone.chunk(0, n)])[0] for n in (1, 6, 3, 16)]
    assert torch.equal(torch.cat(pieces), whole)
    batched = Stateful(tokens, 4)
    first = runner.all_logits([batched.chunk(1, 9), batched.chunk(0, 10), batched.chunk(2, 17)])
    second = runner.all_logits([batched.chunk(0, 16)])
    assert torch.equal(torch.cat([first[1], second[0]]), whole)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_a_snapshot_equals_the_whole_run(kind, stored):
    """A chunk that snapshots its Mamba2 states at a page boundary (slot 5); a new sequence
    that starts there from a copy of them and reads the first one's KV pages computes the same
    logits as one run through (what a prefix-cache hit does)."""
    runner = stored[kind]
    shared, tail = prompts(runner.config.vocab_size, (12, 9), seed=4)
    whole = runner.all_logits([Stateful([shared + tail], 4).chunk(0, 21)])[0]
    first = Stateful([shared + tail[:2]], 4)
    runner.all_logits([first.chunk(0, 14, snapshot=(12, 5))])
    hit = ScheduledSeq("hit", tail, 12, first.blocks[0][:3] + first.pool.allocate(3),
                       sample=False, state=SeqState(6, 5, None))
    (logits,) = runner.all_logits([hit])
    assert torch.equal(logits, whole[12:])


# -- the engine -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_llm_greedy_equals_transformers_generate(kind, folders, references):
    """The float folder through the engine (blocks of 4, a chunked batch): transformers' own
    greedy tokens, Mamba2 states and KV carried across steps."""
    llm = LLM(str(folders[kind]), block_size=4, show_progress=False, max_num_batched_tokens=16)
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    batch = prompts(llm.engine.vocab_size, (5, 22, 13), seed=11)
    for prompt, result in zip(batch, llm.generate(batch, greedy)):
        with torch.inference_mode():
            out = references[kind].generate(torch.tensor([prompt]), max_new_tokens=10,
                                            do_sample=False)
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()
